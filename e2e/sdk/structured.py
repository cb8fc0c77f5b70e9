"""Structured output and forced tool calls with the official SDKs, unmodified.

usage: python3 structured.py BASE_URL   (BASE_URL without /v1)

Expects the e2e stack of `e2e/tests/structured.rs`: `mock-ollama` and
`mock-openai` (the mock behind each adapter; it answers a schema-constrained
request with a value of the schema, as a provider's grammar would). The last
request to the OpenAI-compatible mock is Anthropic's `messages.parse`.
"""
import sys

import anthropic
import openai
import pydantic

base_url = sys.argv[1]
oai = openai.OpenAI(base_url=f"{base_url}/v1", api_key="not-needed")
claude = anthropic.Anthropic(base_url=base_url, api_key="not-needed")
QUESTION = [{"role": "user", "content": "what is the weather in Oslo?"}]


class Weather(pydantic.BaseModel):
    city: str
    days: int


# Instructor's default path: a pydantic model as the one tool, forced by name
# (OpenAI Chat), on Ollama, which has no tool_choice of its own.
tool = openai.pydantic_function_tool(Weather)
named = {"type": "function", "function": {"name": "Weather"}}
parsed = oai.chat.completions.parse(model="mock-ollama", messages=QUESTION, tools=[tool], tool_choice=named)
call = parsed.choices[0].message.tool_calls[0]
assert isinstance(call.function.parsed_arguments, Weather), parsed
assert parsed.choices[0].finish_reason == "tool_calls", parsed
with oai.chat.completions.stream(model="mock-ollama", messages=QUESTION, tools=[tool], tool_choice=named) as s:
    final = s.get_final_completion()
assert isinstance(final.choices[0].message.tool_calls[0].function.parsed_arguments, Weather), final
assert not final.choices[0].message.content, final

# Responses: `required` among the tools.
schema = Weather.model_json_schema()
fn = [{"type": "function", "name": "get_weather", "parameters": schema, "strict": False}]
response = oai.responses.create(model="mock-ollama", input="weather in Oslo?", tools=fn, tool_choice="required")
assert [item.type for item in response.output] == ["function_call"], response
Weather.model_validate_json(response.output[0].arguments)
completed = [e for e in oai.responses.create(
    model="mock-ollama", input="weather in Oslo?", tools=fn, tool_choice="required", stream=True,
) if e.type == "response.completed"]
Weather.model_validate_json(completed[0].response.output[0].arguments)

# Anthropic: LangChain's ChatAnthropic.with_structured_output forces the tool by name.
anthropic_tool = [{"name": "Weather", "description": "the answer", "input_schema": schema}]
for choice in [{"type": "tool", "name": "Weather"}, {"type": "any"}]:
    message = claude.messages.create(
        model="mock-ollama", max_tokens=200, messages=QUESTION, tools=anthropic_tool, tool_choice=choice,
    )
    assert [block.type for block in message.content] == ["tool_use"], message
    assert message.stop_reason == "tool_use", message
    Weather.model_validate(message.content[0].input)
    with claude.messages.stream(
        model="mock-ollama", max_tokens=200, messages=QUESTION, tools=anthropic_tool, tool_choice=choice,
    ) as s:
        streamed = s.get_final_message()
    assert [block.type for block in streamed.content] == ["tool_use"], streamed
    Weather.model_validate(streamed.content[0].input)

# Anthropic structured outputs (`output_config.format`), through both adapters.
for model in ["mock-ollama", "mock-openai"]:
    answer = claude.messages.parse(model=model, max_tokens=200, messages=QUESTION, output_format=Weather)
    assert isinstance(answer.parsed_output, Weather), answer

print("structured: ok")
