"""The official `openai` Python SDK through an IOP Edge whose traces are on:
the client's W3C `traceparent` rides along as a default header, once on a
normalized model and once on a tunnelled one.

usage: python3 traces.py BASE_URL KEY MODEL TUNNEL_MODEL PROMPT TRACEPARENT TUNNEL_TRACEPARENT
(BASE_URL without /v1.) Exits non-zero with a message when anything differs.
"""
import sys

import openai

base_url, key, model, tunnel_model, prompt, traceparent, tunnel_traceparent = sys.argv[1:8]
messages = [{"role": "user", "content": prompt}]

client = openai.OpenAI(base_url=base_url + "/v1", api_key=key, default_headers={"traceparent": traceparent})
reply = client.chat.completions.create(model=model, messages=messages)
assert reply.choices[0].message.content, reply
assert reply.usage.prompt_tokens > 0, reply

tunnelled = openai.OpenAI(base_url=base_url + "/v1", api_key=key, default_headers={"traceparent": tunnel_traceparent})
reply = tunnelled.chat.completions.create(model=tunnel_model, messages=messages)
assert reply.choices[0].message.content, reply

print("traced requests with the openai sdk: ok")
