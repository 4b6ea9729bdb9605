"""THINK end to end: the SDK, the example agents, and agents' THINK
permissions and quotas, against one agentosd serving the local model.

The model is tiny and its answers often wrong; the tests check the shape
of what comes back (content, token counts, timings), never its wording.
"""

from __future__ import annotations

import importlib.util
import json
import struct
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator, Optional

import pytest

from agentos import AgentOSClient, AgentOSError, Opcode
from conftest import REPO, Kernel, kernel_with, log_of, start_kernel, wait_state

AGENTS = REPO / "agents"
# A THINK waits for the model; the SDK's default per-call timeout is for
# the kernel's own replies.
THINK_TIMEOUT = 120
ENDED = {"exited", "failed", "killed", "oom_killed"}

# THINKs until refused, then prints the refusal's code.
THINK_UNTIL_REFUSED = """\
import sys
from agentos import AgentOSClient, AgentOSError

with AgentOSClient(timeout=120) as kernel:
    for i in range(20):
        try:
            reply = kernel.think("Say hello.", max_tokens=16)
        except AgentOSError as err:
            print(f"THINK {i}: {err.code}", flush=True)
            sys.exit(0)
        print(f"THINK {i}: ok, {reply['tokens']} tokens", flush=True)
print("never refused", flush=True)
sys.exit(1)
"""


@pytest.fixture(scope="module")
def llm_kernel() -> Iterator[Kernel]:
    # One kernel for the module, so the model loads once. A short directory
    # of our own: a Unix socket address holds 107 bytes.
    workdir = Path(tempfile.mkdtemp(prefix="agentos-think-"))
    kernel = start_kernel(workdir, llm=True)
    yield kernel
    try:
        kernel.stop()
    except subprocess.TimeoutExpired:
        kernel.process.kill()
        kernel.process.wait()
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def script_dir() -> Iterator[Path]:
    """A directory agents (running as another user) can read scripts from."""
    path = Path(tempfile.mkdtemp(prefix="agentos-think-scripts-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def client_of(kernel: Kernel) -> AgentOSClient:
    return AgentOSClient(kernel.socket_path, timeout=THINK_TIMEOUT)


def run_agent(kernel: Kernel, script: str, *args: str) -> subprocess.CompletedProcess:
    """Runs an example agent directly, as an operator would."""
    env = dict(os.environ, AGENTOS_SOCKET=kernel.socket_path)
    return subprocess.run(
        [sys.executable, AGENTS / script, *args],
        capture_output=True, text=True, timeout=THINK_TIMEOUT, env=env,
    )


def assert_answered(reply: dict, wire: bool = False) -> None:
    """Checks an answer: the SDK's (no ``success``, no ``error``), or the
    kernel's own reply on the wire."""
    if wire:
        assert reply["success"] is True and reply["error"] is None, reply
    else:
        assert "success" not in reply and "error" not in reply, reply
    assert reply["content"].strip()
    usage = reply["usage"]
    assert usage["prompt_tokens"] > 0
    assert usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert reply["tokens"] == usage["total_tokens"]
    assert isinstance(reply["model"], str) and reply["model"]
    for field in ("queue_ms", "latency_ms"):
        assert type(reply[field]) is int and reply[field] >= 0, (field, reply[field])


# The local model server's key: 128 random bits, in hex.
KEY_SHAPE = re.compile(rb"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])")


def local_server(kernel: Kernel) -> Optional[Path]:
    """The /proc directory of the kernel's local model server."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name may hold spaces; the fields after it do not.
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == kernel.process.pid and b"agentos-llm-launcher" in cmdline:
            return stat.parent
    return None


# -- the SDK -----------------------------------------------------------------


def test_think_answers_with_content_token_usage_and_timings(llm_kernel):
    with client_of(llm_kernel) as client:
        reply = client.think("What is the capital of France?", max_tokens=32)
    assert_answered(reply)


def test_a_think_slower_than_the_client_timeout_is_not_cut_short(llm_kernel):
    # No model answers in 50 ms; the client waits for THINK's own deadline.
    with AgentOSClient(llm_kernel.socket_path, timeout=0.05) as client:
        reply = client.think("Name one colour.", max_tokens=8)
        assert client.connected
    assert_answered(reply)
    assert reply["queue_ms"] + reply["latency_ms"] > 50


def test_a_plain_text_payload_is_a_prompt(llm_kernel):
    with client_of(llm_kernel) as client:
        _, opcode, payload = client.call(Opcode.THINK, b"Name one colour.")
    assert opcode == Opcode.THINK
    assert_answered(json.loads(payload), wire=True)


def test_messages_and_a_system_instruction_are_answered(llm_kernel):
    history = [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Hello Ada!"},
        {"role": "user", "content": "What is my name?"},
    ]
    with client_of(llm_kernel) as client:
        reply = client.think(system="Answer in one short sentence.", messages=history,
                             max_tokens=24, temperature=0)
    assert_answered(reply)
    assert reply["usage"]["completion_tokens"] <= 24


def test_hello_names_the_local_model_and_never_its_key(llm_kernel):
    with client_of(llm_kernel) as client:
        _, _, raw = client.call(Opcode.HELLO)
    hello = json.loads(raw)
    assert hello["features"]["think"] is True
    llm = hello["llm"]
    assert llm["provider"] == "local"
    assert isinstance(llm["model"], str) and llm["model"]
    assert isinstance(llm["ready"], bool)
    assert set(llm) <= {"provider", "model", "ready", "reason", "state", "unreachable_since",
                        "last_error", "calls", "tokens"}, llm
    assert llm["state"] in ("ready", "starting"), llm
    assert not [k for k in llm if "key" in k.lower() or "secret" in k.lower()]
    # The key reaches the server on its stdin: it is in none of the places
    # a process's secrets leak from, nor in HELLO or the kernel's log.
    server = local_server(llm_kernel)
    assert server is not None, "no local model server among the kernel's children"
    for leak in ((server / "environ").read_bytes(), (server / "cmdline").read_bytes(), raw,
                 llm_kernel.log().encode()):
        assert not KEY_SHAPE.search(leak), leak[:2000]
    assert b"KEY" not in (server / "environ").read_bytes()


def test_bad_requests_are_refused_in_thinks_reply_shape(llm_kernel):
    with client_of(llm_kernel) as client:
        _, _, raw = client.call(Opcode.THINK, {"prompt": "hi", "temperature": 9})
        refusal = json.loads(raw)
        assert refusal["success"] is False
        assert (refusal["content"], refusal["tokens"], refusal["code"]) == ("", 0, "bad_request")
        assert "temperature" in refusal["error"]
        with pytest.raises(AgentOSError) as hot:
            client.think("hi", temperature=9)
        assert hot.value.code == "bad_request"
        for empty in ({"prompt": ""}, b"", "   "):
            with pytest.raises(AgentOSError) as blank:
                client.call_json(Opcode.THINK, empty)
            assert blank.value.code == "bad_request", empty
        with pytest.raises(AgentOSError) as huge:
            client.think("hi", max_tokens=1_000_000)
        assert huge.value.code == "limit_exceeded"
        assert "max_tokens" in huge.value.message
        assert client.echo("still usable") == "still usable"


# -- a provider that is not answering ----------------------------------------


def test_a_provider_that_takes_connections_and_never_answers_fails_think_in_seconds():
    # It accepts every connection and holds it without a byte in reply.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    held = []

    def hold() -> None:
        try:
            while True:
                held.append(silent.accept())
        except OSError:
            pass  # closed at the end of the test

    threading.Thread(target=hold, daemon=True).start()
    host = "127.0.0.1:%d" % silent.getsockname()[1]
    config = (f'[llm]\nprovider = "openai"\nbase_url = "http://{host}/v1"\n'
              f'api_key = "sk-test"\nmodel = "stub-model"\n')
    try:
        with kernel_with(config) as kernel, AgentOSClient(kernel.socket_path, timeout=60) as client:
            started = time.monotonic()
            with pytest.raises(AgentOSError) as silence:
                client.think("Say hello.", max_tokens=8)
            took = time.monotonic() - started
            assert silence.value.code == "unavailable"
            assert "not answering" in silence.value.message and host in silence.value.message
            # Rather than two minute-long attempts.
            assert took < 20, took
            _, _, raw = client.call(Opcode.HELLO)
            llm = json.loads(raw)["llm"]
            assert (llm["state"], llm["ready"]) == ("not_answering", False), llm
            assert llm["reason"].startswith("not answering since "), llm
    finally:
        silent.close()


def test_a_slow_provider_that_answers_the_probe_is_not_cut_short():
    from stub_model import StubModel

    class Slow(StubModel):
        def answer(self, path, headers, body):
            # Longer than the wait before the kernel probes, and than the
            # probe's timeout: only the probe's answer keeps it waiting.
            time.sleep(6)
            return super().answer(path, headers, body)

    model = Slow(["slow but sure"])
    try:
        with kernel_with(model.config()) as kernel, \
                AgentOSClient(kernel.socket_path, timeout=60) as client:
            reply = client.think("Say hello.", max_tokens=8)
            assert reply["content"] == "slow but sure", reply
            assert reply["latency_ms"] >= 6000, reply
            _, _, raw = client.call(Opcode.HELLO)
            assert json.loads(raw)["llm"]["state"] == "ready"
    finally:
        model.close()


# -- the example agents --------------------------------------------------------


def test_agents_read_lists_from_whatever_shape_the_model_gives():
    spec = importlib.util.spec_from_file_location("llm_text", AGENTS / "llm_text.py")
    llm_text = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(llm_text)
    list_items = llm_text.list_items
    assert list_items("Sure! Here is a plan:\n\n1. Boil water.\n2) Add tea\n- Wait\n") == [
        "Boil water.", "Add tea", "Wait"]
    assert list_items("Step 1: boil\nStep 2: pour it") == ["boil", "pour it"]
    assert list_items("Boil water\nAdd tea\nBoil water") == ["Boil water", "Add tea"]
    assert list_items("Boil water. Add tea. Wait a bit.") == [
        "Boil water.", "Add tea.", "Wait a bit."]
    six = "\n".join(f"{i}. step {i}" for i in range(1, 7))
    assert list_items(six, limit=3) == ["step 1", "step 2", "step 3"]
    assert list_items("") == [] and list_items("ok") == []


@pytest.mark.parametrize("script, expected", [
    ("thinking_agent.py", ["answer: ", "tokens: ", "latency: "]),
    ("research_agent.py", ["[1/", "[2/", "summary: "]),
    ("code_review_agent.py", ["compile check: compiles", "issues:", "verdict: "]),
    ("task_planner_agent.py", ["checklist:", "[ ] 1. "]),
    ("multi_agent_workflow.py", ["exited, exit code 0, THINK calls 1", "summary: "]),
])
def test_example_agent_runs_as_an_operator_script(llm_kernel, script, expected):
    out = run_agent(llm_kernel, script)
    assert out.returncode == 0, out.stdout + out.stderr
    for text in expected:
        assert text in out.stdout, out.stdout


def test_code_review_of_a_file_that_does_not_compile_asks_for_changes(llm_kernel, tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n    return 1\n")
    out = run_agent(llm_kernel, "code_review_agent.py", str(broken))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "compile check: syntax error at line 1" in out.stdout
    assert "verdict: REQUEST CHANGES" in out.stdout


def test_thinking_agent_spawned_as_an_agent_is_charged_in_list(llm_kernel):
    with client_of(llm_kernel) as client:
        reply = client.spawn("thinker", AGENTS / "thinking_agent.py", python=sys.executable,
                             args=["What is 2+2?"])
        info = wait_state(client, reply["id"], ENDED, THINK_TIMEOUT)
    log = log_of(llm_kernel, "thinker", reply["id"])
    assert (info["state"], info["exit_code"]) == ("exited", 0), log
    assert f"agent {reply['id']} asks: What is 2+2?" in log
    assert "answer: " in log
    assert info["llm"]["calls"] >= 1
    assert info["llm"]["tokens"] > 0


# -- permissions and quotas ------------------------------------------------------


def run_think_loop(kernel: Kernel, script_dir: Path, name: str, permissions: dict):
    """Spawns the THINK-until-refused agent; returns its LIST entry and log."""
    script = script_dir / "think_until_refused.py"
    script.write_text(THINK_UNTIL_REFUSED)
    script.chmod(0o644)
    with client_of(kernel) as client:
        reply = client.spawn(name, script, python=sys.executable, permissions=permissions)
        info = wait_state(client, reply["id"], ENDED, THINK_TIMEOUT)
    log = log_of(kernel, name, reply["id"])
    assert (info["state"], info["exit_code"]) == ("exited", 0), log
    return info, log


def test_an_agent_without_think_permission_is_denied(llm_kernel, script_dir):
    info, log = run_think_loop(llm_kernel, script_dir, "no-think", {"think": False})
    assert "THINK 0: permission_denied" in log, log
    assert info["llm"]["calls"] == 0


def test_an_agent_over_its_token_quota_is_refused(llm_kernel, script_dir):
    info, log = run_think_loop(llm_kernel, script_dir, "quota", {"llm_tokens": 50})
    assert "THINK 0: ok" in log, log
    assert "limit_exceeded" in log, log
    assert info["llm"]["calls"] >= 1
    assert info["llm"]["tokens"] > 0


# -- the model file is checked before it is served --------------------------

# The pins of qwen2.5-coder-0.5b (kernel/src/llm/local/models.rs).
QWEN_05B_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QWEN_05B_SIZE = 491_400_064
QWEN_05B_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def gguf_header(architecture: str, name: str, file_type: int) -> bytes:
    """A GGUF v3 header with a model's identifying entries and no tensors."""
    def string(s: str) -> bytes:
        return struct.pack("<Q", len(s.encode())) + s.encode()
    entries = (string("general.architecture") + struct.pack("<I", 8) + string(architecture)
               + string("general.name") + struct.pack("<I", 8) + string(name)
               + string("general.file_type") + struct.pack("<II", 4, file_type))
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 3) + entries


def environment_with_model(root: Path, header: bytes) -> Path:
    """A Python environment that looks as if it had xllamacpp and
    qwen2.5-coder-0.5b installed, whose model file is `header` followed by
    zeros up to the pinned size (sparse: no disk is used). Its Python is
    never run: the file is refused first."""
    (root / "bin").mkdir(parents=True)
    (root / "bin/python").symlink_to(sys.executable)
    (root / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\n")
    package = root / "lib/python3.11/site-packages/xllamacpp"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    models = root / "share/agentos/models"
    models.mkdir(parents=True)
    with open(models / QWEN_05B_FILE, "wb") as model:
        model.write(header)
        model.truncate(QWEN_05B_SIZE)
    return root / "bin/python"


@pytest.mark.parametrize("header, says", [
    (gguf_header("gemma3", "Gemma 3 270m", 15),
     'its GGUF header says general.architecture is "gemma3", not "qwen2"'),
    (gguf_header("qwen2", "Qwen2.5 Coder 0.5B Instruct AWQ", 3),
     "its GGUF header says general.file_type is Q4_1, not Q4_K_M"),
    (gguf_header("qwen2", "Qwen2.5 Coder 0.5B Instruct AWQ", 15),
     f"its sha256 is {'[0-9a-f]' * 64}, not {QWEN_05B_SHA256}"),
], ids=["another-architecture", "another-quantization", "another-content"])
def test_a_model_file_that_is_not_the_pinned_one_is_a_clear_start_up_error(tmp_path, header, says):
    python = environment_with_model(tmp_path / "venv", header)
    config = (f'[llm]\nprovider = "local"\n[llm.local]\nmodel = "qwen2.5-coder-0.5b"\n'
              f'python = "{python}"\n')
    with kernel_with(config, llm=True) as kernel, client_of(kernel) as client:
        # Hashing the half-gigabyte file takes a few seconds; until the
        # check ends, THINK says the model is starting.
        for _ in range(600):
            try:
                client.think("hi", max_tokens=4)
                pytest.fail("a refused model answered")
            except AgentOSError as err:
                if "starting" not in str(err):
                    refusal = err
                    break
            time.sleep(0.1)
        else:
            pytest.fail("the model file was never refused")
        assert refusal.code == "unavailable", refusal
        message = str(refusal)
        assert "the local model will not be served" in message, message
        assert re.search(f"is not the pinned qwen2.5-coder-0.5b: {says}", message), message
        assert re.search(says, kernel.log()), "the refusal is in the kernel's log"
        _, _, raw = client.call(Opcode.HELLO)
        llm = json.loads(raw)["llm"]
        assert (llm["state"], llm["ready"]) == ("unavailable", False), llm
        assert re.search(says, llm["reason"]), llm
    # No stamp: a refused file is checked again at the next start.
    assert not (python.parent.parent / "share/agentos/models"
                / f"{QWEN_05B_FILE}.verified").exists()


def test_the_setup_pins_of_each_model_are_the_kernels():
    # scripts/install-model checks the joined file against its
    # requirements file's `# assembled:` line; the kernel against
    # models.rs. Both must pin the same file.
    pins = (REPO / "kernel/src/llm/local/models.rs").read_text()
    models = sorted((REPO / "scripts/models").glob("*.txt"))
    assert models
    for requirements in models:
        line = re.search(r"^# assembled: (\S+) (\d+) ([0-9a-f]{64})$",
                         requirements.read_text(), re.M)
        assert line, requirements
        name, size, sha256 = line.groups()
        assert f'Location::Assembled("{name}")' in pins, requirements
        assert f"size: {int(size):_}," in pins, requirements
        assert f'sha256: "{sha256}"' in pins, requirements
        assert f'"{requirements.stem}"' in (REPO / "kernel/src/config/llm.rs").read_text()
        parts = [line for line in requirements.read_text().splitlines()
                 if line and not line.startswith("#")]
        assert all("--hash=sha256:" in part for part in parts), requirements
