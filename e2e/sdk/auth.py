"""The official `openai` and `anthropic` Python SDKs against an IOP Edge that
requires API keys: each SDK's own way of sending the key works, and IOP's
401 and 403 become each SDK's typed errors.

usage: python3 auth.py BASE_URL KEY MODEL FORBIDDEN_MODEL
(BASE_URL without /v1.) Exits non-zero with a message when anything differs.
"""
import sys

import anthropic
import openai
from expect import expect

base_url, key, model, forbidden = sys.argv[1:5]
messages = [{"role": "user", "content": "hi from the sdk"}]


# OpenAI: the key goes as `Authorization: Bearer`.
good = openai.OpenAI(base_url=base_url + "/v1", api_key=key)
reply = good.chat.completions.create(model=model, messages=messages)
assert reply.choices[0].message.content, reply
assert [m.id for m in good.models.list()] == [model]
bad = openai.OpenAI(base_url=base_url + "/v1", api_key="sk-wrong")
err = expect("AuthenticationError", lambda: bad.chat.completions.create(model=model, messages=messages))
assert err.status_code == 401 and err.code == "invalid_api_key", err
expect("AuthenticationError", lambda: bad.models.list())
err = expect("PermissionDeniedError", lambda: good.chat.completions.create(model=forbidden, messages=messages))
assert err.status_code == 403 and err.code == "model_not_allowed", err
expect("AuthenticationError", lambda: bad.responses.create(model=model, input="hi"))

# Anthropic: the key goes as `x-api-key`.
claude = anthropic.Anthropic(base_url=base_url, api_key=key)
message = claude.messages.create(model=model, max_tokens=64, messages=messages)
assert message.content[0].text, message
wrong = anthropic.Anthropic(base_url=base_url, api_key="sk-wrong")
err = expect("AuthenticationError", lambda: wrong.messages.create(model=model, max_tokens=64, messages=messages))
assert err.status_code == 401, err
err = expect("PermissionDeniedError", lambda: claude.messages.create(model=forbidden, max_tokens=64, messages=messages))
assert err.status_code == 403, err

print("auth with both sdks: ok")
