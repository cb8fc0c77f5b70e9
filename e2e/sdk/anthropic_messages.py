"""The official `anthropic` Python SDK, unmodified, against IOP.

usage: python3 anthropic_messages.py BASE_URL MODEL   (BASE_URL without /v1)
"""
import sys

import anthropic

base_url, model = sys.argv[1], sys.argv[2]
client = anthropic.Anthropic(base_url=base_url, api_key="not-needed-for-iop-dev")
expected = "Hello from the IOP mock provider. You said: hi from claude"
messages = [{"role": "user", "content": "hi from claude"}]

message = client.messages.create(model=model, max_tokens=100, system="Be brief.", messages=messages)
assert message.content[0].text == expected, message
assert message.stop_reason == "end_turn", message
assert message.usage.output_tokens > 0, message.usage

with client.messages.stream(model=model, max_tokens=100, messages=messages) as stream:
    text = "".join(stream.text_stream)
    final = stream.get_final_message()
assert text == expected, text
assert final.stop_reason == "end_turn", final

tools = [{
    "name": "lookup",
    "description": "find things",
    "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}},
}]
asked = client.messages.create(
    model=model, max_tokens=100, tools=tools, messages=[{"role": "user", "content": "please call tool"}]
)
assert asked.stop_reason == "tool_use", asked
use = [block for block in asked.content if block.type == "tool_use"][0]
assert use.name == "lookup" and use.input == {"query": "mock"}, use
answered = client.messages.create(
    model=model,
    max_tokens=100,
    tools=tools,
    messages=[
        {"role": "user", "content": "please call tool"},
        {"role": "assistant", "content": asked.content},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use.id, "content": "42"},
            {"type": "text", "text": "thanks"},
        ]},
    ],
)
assert answered.content[0].text == "Hello from the IOP mock provider. You said: thanks", answered

try:
    client.messages.create(model="no-such-model", max_tokens=10, messages=messages)
    raise AssertionError("unknown model must fail")
except anthropic.NotFoundError:
    pass
# Extended thinking comes back as a thinking block; earlier thinking can be
# handed back; tool_choice and top_k are taken.
thought = client.messages.create(
    model=model, max_tokens=100, thinking={"type": "enabled", "budget_tokens": 2048},
    messages=[{"role": "user", "content": "why"}],
)
assert thought.content[0].type == "thinking" and thought.content[0].thinking == "Thinking about: why", thought
assert thought.content[1].type == "text", thought
again = client.messages.create(
    model=model, max_tokens=100, tools=tools, tool_choice={"type": "auto"}, extra_body={"top_k": 10},
    messages=[
        {"role": "user", "content": "why"},
        {"role": "assistant", "content": thought.content},
        {"role": "user", "content": "and then"},
    ],
)
assert again.content[0].text.endswith("and then"), again

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
seen = client.messages.create(model=model, max_tokens=50, messages=[{"role": "user", "content": [
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
    {"type": "text", "text": "what is this"},
]}])
assert seen.content[0].text.endswith("[images: 1]"), seen

raw = client.messages.with_raw_response.count_tokens(model=model, messages=[{"role": "user", "content": "count me"}])
assert raw.headers.get("iop-token-count") in ("exact", "estimate"), raw.headers
counted = raw.parse()
assert counted.input_tokens > 0, counted

print("anthropic sdk: ok")
