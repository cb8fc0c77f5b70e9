"""The official `openai` and `anthropic` Python SDKs against an IOP Edge whose
keys have per-key limits: the headers of an answered request say the limit,
and past it each SDK raises its own RateLimitError (status 429) whose
response carries the rate-limit headers and `retry-after`.

usage: python3 rate_limits.py BASE_URL OPENAI_KEY ANTHROPIC_KEY MODEL
(BASE_URL without /v1; each key: requests_per_minute 1, tokens_per_minute
1000.) Exits non-zero with a message when anything differs.
"""
import sys

import anthropic
import openai
from expect import expect

base_url, openai_key, anthropic_key, model = sys.argv[1:5]
messages = [{"role": "user", "content": "hi from the sdk"}]


# OpenAI: the first request is answered and says the limit.
client = openai.OpenAI(base_url=base_url + "/v1", api_key=openai_key, max_retries=0)
raw = client.chat.completions.with_raw_response.create(model=model, messages=messages)
assert raw.parse().choices[0].message.content
assert raw.headers["x-ratelimit-limit-requests"] == "1", raw.headers
assert raw.headers["x-ratelimit-remaining-requests"] == "0", raw.headers
assert raw.headers["x-ratelimit-limit-tokens"] == "1000", raw.headers
err = expect("RateLimitError", lambda: client.chat.completions.create(model=model, messages=messages))
assert err.status_code == 429, err
assert err.code == "rate_limit_exceeded" and err.type == "requests", (err.code, err.type)
headers = err.response.headers
assert int(headers["retry-after"]) >= 1, headers
assert int(headers["retry-after-ms"]) >= 1, headers
assert headers["x-ratelimit-remaining-requests"] == "0", headers
assert headers["x-ratelimit-reset-requests"].endswith("s"), headers
# The same key on the Responses API is the same principal.
expect("RateLimitError", lambda: client.responses.create(model=model, input="hi"))

# Anthropic: its own headers and error.
claude = anthropic.Anthropic(base_url=base_url, api_key=anthropic_key, max_retries=0)
raw = claude.messages.with_raw_response.create(model=model, max_tokens=64, messages=messages)
assert raw.parse().content[0].text
assert raw.headers["anthropic-ratelimit-requests-limit"] == "1", raw.headers
assert raw.headers["anthropic-ratelimit-requests-remaining"] == "0", raw.headers
assert raw.headers["anthropic-ratelimit-tokens-limit"] == "1000", raw.headers
err = expect("RateLimitError", lambda: claude.messages.create(model=model, max_tokens=64, messages=messages))
assert err.status_code == 429, err
assert err.body["error"]["type"] == "rate_limit_error", err.body
headers = err.response.headers
assert int(headers["retry-after"]) >= 1, headers
assert headers["anthropic-ratelimit-requests-remaining"] == "0", headers
assert "T" in headers["anthropic-ratelimit-requests-reset"], headers

print("rate limits with both sdks: ok")
