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

# Client fidelity: a model's reasoning comes back (as llama.cpp / DeepSeek
# name it), structured output, tool choice and sampling options are taken,
# and what IOP cannot serve is a typed 400 naming the field.
reasoned = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "why"}], reasoning_effort="low",
    response_format={"type": "json_schema", "json_schema": {"name": "a", "strict": True, "schema": {"type": "object"}}},
    presence_penalty=0.5, frequency_penalty=0.5, seed=1, extra_body={"top_k": 20},
)
assert reasoned.choices[0].message.model_extra["reasoning_content"] == "Thinking about: why", reasoned
lookup = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
chosen = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "hi"}], tools=lookup, tool_choice="none",
)
assert chosen.choices[0].message.content.startswith("Hello from"), chosen
try:
    client.chat.completions.create(model=model, messages=messages, logprobs=True)
    raise AssertionError("logprobs must be refused")
except Exception as err:
    assert type(err).__name__ == "BadRequestError" and err.body["param"] == "logprobs", repr(err)

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
seen = client.chat.completions.create(model=model, messages=[{"role": "user", "content": [
    {"type": "text", "text": "what is this"},
    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
]}])
assert seen.choices[0].message.content.endswith("[images: 1]"), seen

vectors = client.embeddings.create(model=model, input=["hello world", "bye"])
assert [d.index for d in vectors.data] == [0, 1] and len(vectors.data[0].embedding) == 8, vectors
# The SDK asks for base64 by default when numpy is absent; both decode alike.
assert vectors.data[0].embedding != vectors.data[1].embedding

print("openai sdk: ok")
