"""A workspace job whose node is lost mid-command, through the official
`openai` Python SDK: the job fails closed with a typed, retryable 503 (no
other node is tried). The test pauses the node once the command runs.

usage: python3 job_node_loss.py BASE_URL MODEL   (BASE_URL without /v1)
"""
import sys

import openai

base_url, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url + "/v1", api_key="not-needed", max_retries=0)
try:
    client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Run it. iop-mock-script:hang"}],
        extra_headers={"iop-workspace": "quick"},
    )
    raise AssertionError("the job must fail when its node is lost")
except openai.APIStatusError as e:
    assert e.status_code == 503, e
    assert e.body["code"] == "workspace_lost", e.body
    assert e.response.headers["retry-after"] == "1", e.response.headers
print("sdk job node loss: ok")
