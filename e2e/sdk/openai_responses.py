"""The official `openai` Python SDK's Responses API, unmodified, against IOP.

usage: python3 openai_responses.py BASE_URL MODEL
"""
import sys

from openai import OpenAI

base_url, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url, api_key="not-needed-for-iop-dev")
expected = "Hello from the IOP mock provider. You said: hi from responses"

response = client.responses.create(model=model, input="hi from responses", instructions="Be brief.")
assert response.status == "completed", response
assert response.output_text == expected, response.output_text
assert response.usage.output_tokens > 0, response.usage

text, done = "", None
with client.responses.stream(model=model, input="hi from responses") as stream:
    for event in stream:
        if event.type == "response.output_text.delta":
            text += event.delta
    done = stream.get_final_response()
assert text == expected, text
assert done.status == "completed" and done.output_text == expected, done

tools = [{
    "type": "function",
    "name": "lookup",
    "description": "find things",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
}]
called = client.responses.create(model=model, input="please call tool", tools=tools)
calls = [item for item in called.output if item.type == "function_call"]
assert len(calls) == 1 and calls[0].name == "lookup", called.output
follow_up = client.responses.create(
    model=model,
    tools=tools,
    input=[
        {"role": "user", "content": "please call tool"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "lookup", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "42"},
        {"role": "user", "content": "thanks"},
    ],
)
assert follow_up.output_text == "Hello from the IOP mock provider. You said: thanks", follow_up.output_text
# Reasoning comes back as a reasoning item; a client hands it back (as Codex
# CLI does with store=false).
reasoned = client.responses.create(model=model, input="why", reasoning={"effort": "low"}, store=False)
kinds = [item.type for item in reasoned.output]
assert kinds == ["reasoning", "message"], kinds
assert reasoned.output[0].content[0].text == "Thinking about: why", reasoned.output[0]
again = client.responses.create(
    model=model, store=False, tools=tools, tool_choice="auto",
    text={"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}}},
    input=[{"role": "user", "content": "why"}, reasoned.output[0].model_dump(exclude_none=True), {"role": "user", "content": "then"}],
)
# The mock answers a schema-constrained request with a value of the schema.
assert again.output_text.strip() == "{}", again.output_text
# Codex CLI's defaults: a reasoning summary and encrypted reasoning asked
# for. The provider's reasoning text is the summary; no encrypted_content.
summary_request = dict(model=model, input="why", reasoning={"effort": "low", "summary": "auto"})
summarized = client.responses.create(**summary_request, include=["reasoning.encrypted_content"], store=False)
assert summarized.output[0].type == "reasoning", summarized.output
assert summarized.output[0].summary[0].text == "Thinking about: why", summarized.output[0]
summary = ""
with client.responses.stream(**summary_request) as stream:
    for event in stream:
        if event.type == "response.reasoning_summary_text.delta":
            summary += event.delta
    final = stream.get_final_response()
assert summary == "Thinking about: why", summary
assert final.output[0].summary[0].text == summary, final.output[0]
# A truncated answer: the response and its message item are incomplete.
cut = client.responses.create(model=model, input="hi", max_output_tokens=2)
assert cut.status == "incomplete" and cut.output[0].status == "incomplete", cut
print("openai responses sdk: ok")
