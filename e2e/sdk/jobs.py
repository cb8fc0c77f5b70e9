"""Workspace jobs through the official `anthropic` and `openai` Python SDKs,
unmodified (the job is asked for with `extra_headers`), against
`iop-dev --workspace DIR --mock-script-file examples/mock-script.yaml`.

usage: python3 jobs.py BASE_URL MODEL WORKSPACE_DIR   (BASE_URL without /v1)
"""
import os
import sys
import time

import anthropic
import openai

base_url, model, workspace = sys.argv[1], sys.argv[2], sys.argv[3]
job = {"iop-workspace": "dev"}
claude = anthropic.Anthropic(base_url=base_url, api_key="not-needed-for-iop-dev", max_retries=0)
gpt = openai.OpenAI(base_url=base_url + "/v1", api_key="not-needed-for-iop-dev", max_retries=0)


def ask(script):
    return [{"role": "user", "content": f"Summarize README.md into NOTES.md. iop-mock-script:{script}"}]


def job_state():
    path = os.path.join(workspace, ".iop", "job")
    return os.listdir(path) if os.path.isdir(path) else []


def wait(what, condition):
    deadline = time.monotonic() + 20
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# A whole job: plan, work (read, list, write, command), a review that asks
# for one repair, the repair, approval, the answer.
raw = claude.messages.with_raw_response.create(model=model, max_tokens=512, messages=ask("notes"), extra_headers=job)
message = raw.parse()
assert len(raw.headers["iop-job-id"]) == 32, raw.headers
assert message.content[0].text == "NOTES.md now summarizes README.md, and the tests pass.", message
assert message.stop_reason == "end_turn", message
assert message.usage.output_tokens >= 12, message.usage
with open(os.path.join(workspace, "NOTES.md")) as notes:
    assert notes.read() == "summary of README.md\n"
assert job_state() == [], job_state()

# A job streamed. (The script is past its end, so every turn repeats its
# last text: the job goes through its stages without tools.)
with claude.messages.stream(model=model, max_tokens=512, messages=ask("notes"), extra_headers=job) as stream:
    text = "".join(stream.text_stream)
assert text, "a streamed job answers"

# Budgets: a stage that keeps calling tools runs out of model turns.
try:
    gpt.chat.completions.create(model=model, messages=ask("loop"), extra_headers=job)
    raise AssertionError("an endless tool loop must fail")
except openai.APIStatusError as e:
    assert e.status_code == 502 and e.body["code"] == "iteration_budget_exhausted", e.body

# The job owns the tool surface; unknown workspaces are not found.
tools = [{"name": "lookup", "input_schema": {"type": "object"}}]
try:
    claude.messages.create(model=model, max_tokens=10, tools=tools, messages=ask("notes"), extra_headers=job)
    raise AssertionError("tools with a job must fail")
except anthropic.BadRequestError:
    pass
try:
    claude.messages.create(model=model, max_tokens=10, messages=ask("notes"), extra_headers={"iop-workspace": "nope"})
    raise AssertionError("an unknown workspace must fail")
except anthropic.NotFoundError:
    pass

# A client that gives up mid-command: the command's process group dies and
# the job's state is removed.
try:
    claude.with_options(timeout=5.0).messages.create(model=model, max_tokens=10, messages=ask("hang"), extra_headers=job)
    raise AssertionError("the hang job never answers")
except anthropic.APITimeoutError:
    pass
pid = int(open(os.path.join(workspace, "grandchild.pid")).read())
wait("the grandchild to die", lambda: not alive(pid))
wait("the job's state to go", lambda: job_state() == [])
print("sdk jobs: ok")
