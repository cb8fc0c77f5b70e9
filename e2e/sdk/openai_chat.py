"""The official `openai` Python SDK, unmodified, against an IOP Edge.

usage: python3 openai_chat.py BASE_URL MODEL
Exits non-zero with a message when anything differs from what IOP promises.
"""
import sys

from openai import OpenAI

base_url, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url, api_key="not-needed-for-iop-dev")
expected = "Hello from the IOP mock provider. You said: hi from the sdk"
messages = [{"role": "user", "content": "hi from the sdk"}]

reply = client.chat.completions.create(model=model, messages=messages)
assert reply.choices[0].message.content == expected, reply
assert reply.choices[0].finish_reason == "stop", reply
assert reply.usage.total_tokens > 0, reply

text, usage, finish = "", None, None
stream = client.chat.completions.create(
    model=model, messages=messages, stream=True, stream_options={"include_usage": True}
)
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        text += choice.delta.content or ""
        finish = choice.finish_reason or finish
assert text == expected, text
assert finish == "stop", finish
assert usage is not None and usage.completion_tokens > 0, usage

models = [m.id for m in client.models.list()]
assert model in models, models

try:
    client.chat.completions.create(model="no-such-model", messages=messages)
    raise AssertionError("unknown model must fail")
except Exception as err:  # the SDK raises NotFoundError
    assert type(err).__name__ == "NotFoundError", repr(err)

print("openai sdk: ok")
