"""Client fidelity through both adapters, with the official SDKs, unmodified.

usage: python3 fidelity.py BASE_URL   (BASE_URL without /v1)

Expects the e2e stack of `e2e/tests/fidelity.rs`: `mock-ollama` and
`mock-openai` (the mock behind each adapter), and `mock-small` (a context
window of 5 words) whose route falls back to `mock-large`.
"""
import sys

import anthropic
import openai

base_url = sys.argv[1]
oai = openai.OpenAI(base_url=f"{base_url}/v1", api_key="not-needed")
claude = anthropic.Anthropic(base_url=base_url, api_key="not-needed")
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
lookup = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


def refused(call, param):
    """The call fails with the SDK's BadRequestError naming `param`."""
    try:
        call()
    except openai.BadRequestError as err:
        assert param in str(err), err
        return
    raise AssertionError(f"expected a 400 naming {param}")


for model in ["mock-ollama", "mock-openai"]:
    assert oai.models.retrieve(model).id == model

    # Structured output, options, reasoning and an image, in one request.
    answer = oai.chat.completions.create(
        model=model, reasoning_effort="low", seed=7, stop=["never"], temperature=0.2, top_p=0.9,
        presence_penalty=0.1, frequency_penalty=0.1, response_format={"type": "json_object"}, user="u-1",
        messages=[{"role": "user", "content": [
            {"type": "text", "text": "why"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        ]}],
    )
    assert answer.choices[0].message.content.endswith("[images: 1]"), answer
    assert answer.choices[0].message.model_extra["reasoning_content"].startswith("Thinking about"), answer

    # Tool choice: `auto`, `none` and `required` everywhere (Ollama enforces
    # `required` through its `format`).
    called = oai.chat.completions.create(
        model=model, tools=lookup, tool_choice="auto", parallel_tool_calls=True,
        messages=[{"role": "user", "content": "call tool please"}],
    )
    assert called.choices[0].message.tool_calls[0].function.name == "lookup", called
    required = lambda: oai.chat.completions.create(  # noqa: E731
        model=model, tools=lookup, tool_choice="required", messages=[{"role": "user", "content": "call tool"}],
    )
    assert required().choices[0].message.tool_calls[0].function.name == "lookup", "required is enforced"
    refused(lambda: oai.chat.completions.create(model=model, n=2, messages=[{"role": "user", "content": "x"}]), "n")

    # Responses: text.format and a reasoning item.
    response = oai.responses.create(
        model=model, input="why", store=False, reasoning={"effort": "low"}, text={"format": {"type": "json_object"}},
    )
    assert [item.type for item in response.output] == ["reasoning", "message"], response

    vectors = oai.embeddings.create(model=model, input="hello", encoding_format="float")
    assert len(vectors.data) == 1 and vectors.data[0].embedding, vectors

    # Anthropic: thinking and the token count, exact where the provider
    # can tokenize (the OpenAI-compatible mock has llama.cpp's endpoints).
    thought = claude.messages.create(
        model=model, max_tokens=100, thinking={"type": "enabled", "budget_tokens": 1024}, extra_body={"top_k": 5},
        system=[{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": "why"}],
    )
    assert thought.content[0].type == "thinking", thought
    raw = claude.messages.with_raw_response.count_tokens(model=model, messages=[{"role": "user", "content": "a b c"}])
    expected = "estimate" if model == "mock-ollama" else "exact"
    assert raw.headers["iop-token-count"] == expected, (model, raw.headers)
    if expected == "exact":
        assert raw.parse().input_tokens == 3, raw.parse()

try:
    oai.models.retrieve("no-such-model")
    raise AssertionError("an unknown model must be 404")
except openai.NotFoundError:
    pass

# Too long for mock-small's context window: answered by its fallback.
long = oai.chat.completions.create(model="mock-small", messages=[{"role": "user", "content": "one two three four five six"}])
assert long.choices[0].message.content.startswith("Hello from"), long

print("fidelity: ok")
