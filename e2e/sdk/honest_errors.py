"""The official `openai` and `anthropic` Python SDKs see a provider's own
error code and a cut stream as IOP passes them on (issue 28 item 5).

usage: python3 honest_errors.py BASE_URL POLICY_MODEL CUT_MODEL
(BASE_URL without /v1.) POLICY_MODEL's provider refuses with HTTP 400 and
OpenAI code `content_policy_violation`; CUT_MODEL's stream is cut after
three words. Exits non-zero with a message when anything differs.
"""
import sys

import anthropic
import openai
from expect import expect

base_url, policy, cut = sys.argv[1:4]
messages = [{"role": "user", "content": "hi from the sdk"}]


client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
err = expect("BadRequestError", lambda: client.chat.completions.create(model=policy, messages=messages))
assert err.status_code == 400 and err.code == "content_policy_violation", err
err = expect("BadRequestError", lambda: client.responses.create(model=policy, input="hi"))
assert err.status_code == 400 and err.code == "content_policy_violation", err


def drain_chat():
    for _ in client.chat.completions.create(model=cut, messages=messages, stream=True):
        pass


err = expect("APIError", drain_chat)
assert err.code == "provider_stream_cut", (err, err.body)

claude = anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0)
err = expect(
    "BadRequestError", lambda: claude.messages.create(model=policy, max_tokens=16, messages=messages)
)
assert err.status_code == 400 and err.body["error"]["type"] == "invalid_request_error", err.body
assert err.body["error"]["message"].startswith("content_policy_violation: "), err.body
print("ok")
