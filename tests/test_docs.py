"""Every runnable code block of README.md and docs/*.md, run against a real
agentosd: each block is a test named after its file and line.

bash, sh and console blocks run in bash with ``agentos`` and ``agentosd``
on PATH and ``AGENTOS_SOCKET`` set to the test's kernel; python blocks run
with the project's .venv Python; ``python exec`` and ``bash exec`` blocks
run inside EXEC, through ``agentos exec``; toml blocks are checked by
``agentosd --check-config``. A block marked ``no-run`` is skipped and
listed with its reason; a fence without a language fails. The conventions
are in docs/README.md and ``docs_blocks.py``.

The blocks of one file run in order against one kernel of their own, so a
block may use what an earlier block of its file started. That kernel
serves the local model and the tool servers ``scripts/setup`` installs,
as ``scripts/run``'s does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional

import pytest
from agentos import AgentOSClient, Opcode

import docs_blocks
from conftest import BIN_DIR, LLM_VARIABLES, REPO, Kernel, binary, start_kernel

VENV_PYTHON = REPO / ".venv" / "bin" / "python"
# A block may think with the local model, or run the prompt-to-program loop.
BLOCK_TIMEOUT = 300
# How long the tool servers may take to be ready (node starts in about a second).
TOOLS_READY_WITHIN = 60
# Tool servers every docs kernel runs, as scripts/run configures them.
TOOL_SERVERS = {
    "everything": (REPO / "scripts/mcp-servers/node_modules/.bin/mcp-server-everything", []),
    "filesystem": (REPO / "scripts/mcp-servers/node_modules/.bin/mcp-server-filesystem",
                   [str(REPO / "docs")]),
    "time": (REPO / ".venv/bin/mcp-server-time", []),
}

BLOCKS = docs_blocks.all_blocks(REPO)
RUNNABLE = [block for block in BLOCKS if block.runner is not None]


def docs_kernel_config() -> str:
    """The docs kernel's config: agents run with the project's Python (so
    they import the SDK), and the tool servers of ``scripts/run``."""
    missing = [str(path) for path, _ in TOOL_SERVERS.values() if not path.exists()]
    if missing or not VENV_PYTHON.exists():
        pytest.fail(f"not installed: {missing or VENV_PYTHON}; run scripts/setup --test", pytrace=False)
    config = f'[agents]\npython = "{VENV_PYTHON}"\n'
    for name, (command, args) in TOOL_SERVERS.items():
        config += f'\n[mcp.servers.{name}]\ncommand = "{command}"\nargs = {json.dumps(args)}\n'
    return config


class KernelPerFile:
    """One kernel for each Markdown file's blocks, started when its first
    block runs and stopped when another file's block comes."""

    def __init__(self) -> None:
        self.name: Optional[str] = None
        self.kernel: Optional[Kernel] = None
        self.workdir: Optional[Path] = None

    def for_file(self, name: str) -> Kernel:
        if self.name != name or self.kernel is None or self.kernel.process.poll() is not None:
            self.stop()
            # A short directory: a Unix socket address holds 107 bytes.
            self.workdir = Path(tempfile.mkdtemp(prefix="agentos-docs-"))
            self.name = name
            self.kernel = start_kernel(self.workdir, docs_kernel_config(), llm=True)
            tool_servers_ready(self.kernel)
        return self.kernel

    def stop(self) -> None:
        if self.kernel is not None:
            try:
                self.kernel.stop()
            except subprocess.TimeoutExpired:
                self.kernel.process.kill()
                self.kernel.process.wait()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        self.kernel, self.workdir, self.name = None, None, None


def tool_servers_ready(kernel: Kernel) -> None:
    """Waits until every tool server is ready, as they are for a reader
    after scripts/run; fails with their states if one is not."""
    deadline = time.monotonic() + TOOLS_READY_WITHIN
    with AgentOSClient(kernel.socket_path) as client:
        while True:
            listing = client.call_json(Opcode.TOOL, {"op": "list"})
            states = {s["name"]: s["state"] for s in listing["servers"]}
            if all(states.get(name) == "ready" for name in TOOL_SERVERS):
                return
            if time.monotonic() > deadline or "failed" in states.values():
                pytest.fail(f"the docs kernel's tool servers are not ready: {states}\n{kernel.log()[-4000:]}",
                            pytrace=False)
            time.sleep(0.1)


@pytest.fixture(scope="module")
def kernels(request) -> Iterator[KernelPerFile]:
    holder = KernelPerFile()
    yield holder
    holder.stop()
    report_not_run(request.config)


def report_not_run(config) -> None:
    """Lists the blocks that were not run and why, past pytest's capture."""
    skipped = [block for block in RUNNABLE if block.no_run_reason is not None]
    shown = {}
    for block in BLOCKS:
        if block.runner is None and block.language:
            shown[block.language] = shown.get(block.language, 0) + 1
    lines = [f"docs blocks: {len(RUNNABLE) - len(skipped)} runnable, "
             f"{len(skipped)} marked no-run, shown only: "
             + (", ".join(f"{n} {lang}" for lang, n in sorted(shown.items())) or "none")]
    lines += [f"  not run: {block.id} ({block.language}): {block.no_run_reason}" for block in skipped]
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is None:
        print("\n".join(lines))
        return
    with capture.global_and_fixture_disabled():
        print("\n" + "\n".join(lines))


def block_env(kernel: Kernel) -> dict:
    """What a block runs with: the built binaries first on PATH, then the
    project's .venv, the test kernel's socket, and no outside LLM."""
    env = {k: v for k, v in os.environ.items() if k not in LLM_VARIABLES and k != "AGENTOS_CONFIG"}
    env["PATH"] = os.pathsep.join([str(BIN_DIR), str(VENV_PYTHON.parent), env.get("PATH", "")])
    env["AGENTOS_SOCKET"] = kernel.socket_path
    return env


def command_for(block: docs_blocks.Block, scratch: Path) -> tuple:
    """The command that runs (or checks) one block, and its stdin."""
    if block.in_exec:
        language = ["--bash"] if block.language == "bash" else []
        return [str(binary("agentos")), "exec", *language, "-"], block.code
    if block.runner == "python":
        return [str(VENV_PYTHON), "-c", block.code], None
    if block.runner == "toml":
        config = scratch / "block.toml"
        config.write_text(block.code)
        return [str(binary("agentosd")), "--config", str(config), "--check-config"], None
    code = block.code if block.runner == "bash" else docs_blocks.console_commands(block.code)
    return ["bash", "-e", "-o", "pipefail", "-c", code], None


@pytest.mark.parametrize("block", RUNNABLE, ids=[block.id for block in RUNNABLE])
def test_block_runs(block: docs_blocks.Block, kernels: KernelPerFile) -> None:
    if block.no_run_reason is not None:
        if not block.no_run_reason:
            pytest.fail(f"{block.id}: `no-run` must say why the block cannot run", pytrace=False)
        pytest.skip(block.no_run_reason)
    kernel = kernels.for_file(block.name)
    with tempfile.TemporaryDirectory(prefix="agentos-block-") as scratch:
        command, stdin = command_for(block, Path(scratch))
        try:
            done = subprocess.run(
                command, cwd=REPO, env=block_env(kernel), input=stdin or "",
                capture_output=True, text=True, timeout=BLOCK_TIMEOUT,
            )
        except subprocess.TimeoutExpired as err:
            pytest.fail(f"{block.id}: still running after {BLOCK_TIMEOUT} s\n{err.stdout}\n{err.stderr}", pytrace=False)
    if done.returncode != 0:
        # What the kernel saw, too: a block's failure may be the kernel's.
        state = kernel.process.poll()
        log_end = "\n".join(kernel.log().splitlines()[-60:])
        pytest.fail(
            f"{block.id} ({block.language}) exited with {done.returncode}\n"
            f"--- block ---\n{block.code}--- stdout ---\n{done.stdout}--- stderr ---\n{done.stderr}"
            f"--- agentosd ({'running' if state is None else f'exited {state}'}), its log's end ---\n"
            f"{log_end}",
            pytrace=False,
        )


@pytest.mark.parametrize("path", docs_blocks.markdown_files(REPO),
                         ids=[str(p.relative_to(REPO)) for p in docs_blocks.markdown_files(REPO)])
def test_every_block_says_what_it_is(path: Path) -> None:
    name = str(path.relative_to(REPO))
    bare = [block.id for block in docs_blocks.blocks(path, name) if not block.language]
    assert not bare, f"fences without a language (use `text` for output): {', '.join(bare)}"


def test_blocks_are_found_as_markdown_draws_them(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Intro with ```` ```bash ```` inline.\n\n"
        "```bash\necho one\n```\n\n"
        "1. A step:\n\n   ```python no-run needs a remote key\n   print(2)\n   ```\n\n"
        "````text\n```\nnested\n```\n````\n\n"
        "```\nbare\n```\n"
        "```python exec\nimport tools\n```\n"
    )
    found = list(docs_blocks.blocks(page, "page.md"))
    assert [(b.line, b.language, b.runner, b.no_run_reason, b.code) for b in found] == [
        (3, "bash", "bash", None, "echo one\n"),
        (9, "python", "python", "needs a remote key", "print(2)\n"),
        (13, "text", None, None, "```\nnested\n```\n"),
        (19, "", None, None, "bare\n"),
        (22, "python", "python", None, "import tools\n"),
    ]
    assert [b.in_exec for b in found] == [False, False, False, False, True]
    assert found[0].id == "page.md:3"


def test_console_blocks_run_their_commands_not_their_output() -> None:
    session = "$ agentos ps\nID NAME\n$ agentos exec \\\n    'print(1)'\n1\n"
    assert docs_blocks.console_commands(session) == "agentos ps\nagentos exec \\\n    'print(1)'\n"


CONFIG_SOURCES = sorted((REPO / "kernel/src/config").glob("*.rs"))


def config_fields() -> set:
    """Every key the config file may hold: the fields of each struct the
    config loader deserializes, and each boot entry's."""
    fields = set()
    for source in CONFIG_SOURCES:
        text = source.read_text().split("#[cfg(test)]")[0]
        for body in re.findall(r"Deserialize\)\]\n(?:#\[serde[^\n]*\]\n)*pub struct \w+ \{\n(.*?)\n\}", text, re.S):
            # A field the loader skips is not a key.
            body = re.sub(r"#\[serde\(skip\)\]\s*(?:///[^\n]*\n\s*)*pub \w+", "", body)
            fields.update(re.findall(r"^\s*pub (\w+):", body, re.M))
        for listing in re.findall(r"const \w*FIELDS: &\[&str\] = &\[(.*?)\];", text, re.S):
            fields.update(re.findall(r'"(\w+)"', listing))
    return fields


def test_the_configuration_reference_names_every_key_variable_and_flag() -> None:
    reference = (REPO / "docs/configuration.md").read_text()
    # What the reference names in code spans (a fence's backticks aside).
    quoted = " ".join(re.findall(r"(?<!`)`([^`\n]+)`(?!`)", reference))
    fields = config_fields()
    assert {"max_request_bytes", "warm_pool", "attempt_timeout_ms", "threads", "snapshot_bytes_total",
            "writable", "result_cache_bytes", "defer_delay_ms", "restart_window"} <= fields, fields
    missing = sorted(f for f in fields if not re.search(rf"\b{f}\b", quoted))
    assert not missing, f"config keys docs/configuration.md does not name: {missing}"
    variables = set()
    for source in CONFIG_SOURCES:
        variables.update(re.findall(r'"((?:AGENTOS|OPENAI|ANTHROPIC|GEMINI|GOOGLE)_[A-Z_]+)"', source.read_text()))
    assert "AGENTOS_STATE_DIR" in variables, variables
    missing = sorted(v for v in variables if v not in quoted)
    assert not missing, f"environment variables docs/configuration.md does not name: {missing}"
    daemon = (REPO / "kernel/src/bin/agentosd.rs").read_text()
    args = daemon.split("struct Args {")[1].split("\n}")[0]
    flags = {"--" + name.replace("_", "-") for name in re.findall(r"^\s*(\w+): ", args, re.M)}
    assert "--check-config" in flags, flags
    missing = sorted(flag for flag in flags if flag not in reference)
    assert not missing, f"agentosd flags docs/configuration.md does not name: {missing}"


def test_the_readme_gives_the_test_command_ci_runs() -> None:
    ci = (REPO / ".ci/run").read_text().strip().splitlines()[-1]
    commands = [line for block in docs_blocks.blocks(REPO / "README.md", "README.md")
                for line in block.code.splitlines()]
    assert any(line.split("#")[0].strip() == ci for line in commands), (ci, commands)
