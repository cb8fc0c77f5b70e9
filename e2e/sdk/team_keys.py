"""The official `openai` and `anthropic` Python SDKs against an IOP Edge with
expiring, rotated keys and usage accounting.

usage:
  python3 team_keys.py works BASE_URL KEY MODEL
      both SDKs get an answer with KEY.
  python3 team_keys.py refused BASE_URL KEY MODEL CODE
      both SDKs raise AuthenticationError (401); OpenAI's carries CODE
      (e.g. api_key_expired), Anthropic's message says why.
  python3 team_keys.py usage BASE_URL KEY MODEL TUNNEL_MODEL
      one answer of each kind (chat, chat streamed, responses, messages,
      messages streamed; chat and chat streamed on the tunnelled model),
      then prints the usage the SDKs saw as JSON:
      {"requests": N, "models": {MODEL: {"input": I, "output": O}}}.
(BASE_URL without /v1.) Exits non-zero with a message when anything differs.
"""
import json
import sys

import anthropic
import openai
from expect import expect

mode, base_url, key, model = sys.argv[1:5]
messages = [{"role": "user", "content": "count these tokens please"}]


def clients(api_key):
    return (
        openai.OpenAI(base_url=base_url + "/v1", api_key=api_key, max_retries=0),
        anthropic.Anthropic(base_url=base_url, api_key=api_key, max_retries=0),
    )


oai, claude = clients(key)

if mode == "works":
    assert oai.chat.completions.create(model=model, messages=messages).choices[0].message.content
    assert claude.messages.create(model=model, max_tokens=32, messages=messages).content[0].text
    print("works: ok")
elif mode == "refused":
    code = sys.argv[5]
    err = expect("AuthenticationError", lambda: oai.chat.completions.create(model=model, messages=messages))
    assert err.status_code == 401 and err.code == code, (err.status_code, err.code, err)
    err = expect("AuthenticationError", lambda: claude.messages.create(model=model, max_tokens=32, messages=messages))
    assert err.status_code == 401, err
    assert code.split("_")[-1] in str(err), err  # "expired", "disabled", ...
    print("refused: ok")
elif mode == "usage":
    tunnel_model = sys.argv[5]
    seen = {"requests": 0, "models": {}}

    def saw(name, input_tokens, output_tokens):
        assert input_tokens > 0 and output_tokens > 0, (name, input_tokens, output_tokens)
        entry = seen["models"].setdefault(name, {"input": 0, "output": 0})
        entry["input"] += input_tokens
        entry["output"] += output_tokens
        seen["requests"] += 1

    for name in (model, tunnel_model):
        reply = oai.chat.completions.create(model=name, messages=messages)
        saw(name, reply.usage.prompt_tokens, reply.usage.completion_tokens)
        stream = oai.chat.completions.create(
            model=name, messages=messages, stream=True, stream_options={"include_usage": True}
        )
        usage = [chunk.usage for chunk in stream if chunk.usage]
        assert len(usage) == 1, usage
        saw(name, usage[0].prompt_tokens, usage[0].completion_tokens)
    reply = oai.responses.create(model=model, input="count these tokens please")
    saw(model, reply.usage.input_tokens, reply.usage.output_tokens)
    message = claude.messages.create(model=model, max_tokens=64, messages=messages)
    saw(model, message.usage.input_tokens, message.usage.output_tokens)
    with claude.messages.stream(model=model, max_tokens=64, messages=messages) as stream:
        final = stream.get_final_message()
    saw(model, final.usage.input_tokens, final.usage.output_tokens)
    print(json.dumps(seen))
else:
    raise SystemExit(f"unknown mode {mode}")
