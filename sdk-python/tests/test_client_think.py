"""AgentOSClient.think against a scripted socket that stands in for the kernel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_kernel import FakeKernel, socket_dir  # noqa: F401  (a fixture)

from agentos import AgentOSClient, AgentOSError, LimitExceeded, Opcode

ANSWER = {
    "success": True, "content": "4", "tokens": 31, "error": None,
    "usage": {"prompt_tokens": 30, "completion_tokens": 1, "total_tokens": 31},
    "model": "SmolLM2-135M-Instruct", "queue_ms": 0, "latency_ms": 120,
}


def ask(socket_dir: Path, reply: dict, **kwargs):
    """Runs one think() call against a fake kernel answering ``reply``;
    returns the call's result (or exception) and the request it sent."""
    fake = FakeKernel(str(socket_dir / "k.sock"), [reply])
    try:
        with AgentOSClient(fake.path, timeout=5) as client:
            try:
                result = client.think(**kwargs)
            except AgentOSError as err:
                result = err
    finally:
        fake.close()
    opcode, payload = fake.requests[0]
    assert opcode == Opcode.THINK
    return result, json.loads(payload)


def test_think_sends_only_the_fields_given_and_returns_the_reply(socket_dir):
    reply, request = ask(socket_dir, ANSWER, prompt="What is 2+2?")
    assert request == {"prompt": "What is 2+2?"}
    assert reply == {k: v for k, v in ANSWER.items() if k not in ("success", "error")}
    assert reply["content"] == "4"


def test_think_sends_every_option_in_the_structured_form(socket_dir):
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    _, request = ask(
        socket_dir, ANSWER, prompt="and now?", system="be brief", model="m",
        max_tokens=64, temperature=0.0, messages=history,
    )
    assert request == {
        "prompt": "and now?", "system": "be brief", "model": "m", "max_tokens": 64,
        "temperature": 0.0, "messages": history,
    }


def test_think_accepts_messages_alone(socket_dir):
    _, request = ask(socket_dir, ANSWER, messages=[{"role": "user", "content": "hi"}])
    assert request == {"messages": [{"role": "user", "content": "hi"}]}


def test_a_failed_think_raises_with_the_kernels_code_and_message(socket_dir):
    refusal = {
        "success": False, "content": "", "tokens": 0, "code": "limit_exceeded",
        "error": "agent 3 has used 50 of its 50 LLM tokens",
    }
    err, _ = ask(socket_dir, refusal, prompt="more?")
    assert isinstance(err, LimitExceeded)
    assert err.code == "limit_exceeded"
    assert err.message == refusal["error"]


def test_think_without_prompt_or_messages_is_refused_before_sending(socket_dir):
    client = AgentOSClient(socket_dir / "none.sock")
    for empty in ({}, {"prompt": ""}, {"messages": []}, {"prompt": None, "system": "s"}):
        with pytest.raises(ValueError, match="prompt or messages"):
            client.think(**empty)
    assert not client.connected
