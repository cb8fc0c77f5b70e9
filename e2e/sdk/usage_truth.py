"""The official `openai` and `anthropic` Python SDKs as clients whose
answers end early: what is charged for them is checked by
e2e/tests/usage.rs.

usage:
  python3 usage_truth.py drop BASE_URL KEY MODEL N
      a Chat Completions stream (OpenAI SDK) and a Messages stream
      (Anthropic SDK), each closed after its N-th text delta.
  python3 usage_truth.py give-up BASE_URL KEY MODEL
      a Chat Completions stream whose client gives up (a 1 s timeout)
      before the first token: APITimeoutError.
  python3 usage_truth.py quiet-stream BASE_URL KEY MODEL
      a Chat Completions stream that asks for no usage: no chunk carries
      one (the Edge asked the provider on its behalf and the node left it
      out); prints the number of text deltas.
  python3 usage_truth.py parallel BASE_URL KEY MODEL N
      N chat completions at once (max_tokens 100); prints
      {"ok": A, "rate_limited": R}.
(BASE_URL without /v1.) Exits non-zero with a message when anything differs.
"""
import json
import sys
from concurrent.futures import ThreadPoolExecutor

import anthropic
import openai
from expect import expect

mode, base_url, key, model = sys.argv[1:5]
messages = [{"role": "user", "content": "tell me a long story"}]
oai = openai.OpenAI(base_url=base_url + "/v1", api_key=key, max_retries=0)
claude = anthropic.Anthropic(base_url=base_url, api_key=key, max_retries=0)

if mode == "drop":
    n = int(sys.argv[5])
    stream = oai.chat.completions.create(model=model, messages=messages, stream=True)
    deltas = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            deltas += 1
            if deltas == n:
                break
    stream.close()
    assert deltas == n, ("openai", deltas)
    deltas = 0
    with claude.messages.stream(model=model, max_tokens=1000, messages=messages) as stream:
        for text in stream.text_stream:
            if text:
                deltas += 1
                if deltas == n:
                    break
    assert deltas == n, ("anthropic", deltas)
    print("drop: ok")
elif mode == "give-up":
    impatient = oai.with_options(timeout=1.0)
    expect("APITimeoutError", lambda: impatient.chat.completions.create(model=model, messages=messages, stream=True))
    print("give-up: ok")
elif mode == "quiet-stream":
    deltas = 0
    for chunk in oai.chat.completions.create(model=model, messages=messages, stream=True):
        assert chunk.usage is None and chunk.choices, chunk
        deltas += bool(chunk.choices[0].delta.content)
    print(deltas)
elif mode == "parallel":
    n = int(sys.argv[5])

    def one(_):
        try:
            oai.chat.completions.create(model=model, messages=messages, max_tokens=100)
            return "ok"
        except openai.RateLimitError as err:
            assert err.status_code == 429 and "tokens per minute" in str(err), err
            return "rate_limited"

    with ThreadPoolExecutor(max_workers=n) as pool:
        outcomes = list(pool.map(one, range(n)))
    print(json.dumps({"ok": outcomes.count("ok"), "rate_limited": outcomes.count("rate_limited")}))
else:
    sys.exit(f"unknown mode {mode}")
