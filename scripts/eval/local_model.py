"""Evaluates local models on the prompt-to-program loop: every task of
tasks.py through `agentos run`, against a kernel serving each model in
turn, the answers checked by code, with the time each took. Prints a
table per model and the summary; --json writes every transcript.

Run it through scripts/eval-local-model (root: EXEC needs namespaces)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mcp_host  # noqa: E402
import tasks as eval_tasks  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
KINDS = ["code", "tool", "file", "two-step", "fix"]


def kernel_config(model: str | None, fixtures: Path) -> str:
    servers = REPO / "scripts" / "mcp-servers" / "node_modules" / ".bin"
    local = f'\n[llm.local]\nmodel = "{model}"\n' if model else ""
    return (
        '[llm]\nprovider = "local"\n'
        f"{local}"
        f'\n[mcp.servers.everything]\ncommand = "{servers}/mcp-server-everything"\n'
        f'\n[mcp.servers.filesystem]\ncommand = "{servers}/mcp-server-filesystem"\n'
        f'args = ["{fixtures}"]\n'
        f'\n[mcp.servers.time]\ncommand = "{REPO}/.venv/bin/mcp-server-time"\n'
    )


class Kernel:
    """agentosd serving one model, in a directory of its own."""

    def __init__(self, bin_dir: Path, workdir: Path, config: str) -> None:
        self.bin_dir = bin_dir
        self.socket = workdir / "agentos.sock"
        (workdir / "agentosd.toml").write_text(config)
        env = dict(os.environ, AGENTOS_STATE_DIR=str(workdir / "state"),
                   AGENTOS_AGENT_LOG_DIR=str(workdir / "logs"))
        env.pop("AGENTOS_SOCKET", None)
        self.log = workdir / "agentosd.log"
        self.process = subprocess.Popen(
            [bin_dir / "agentosd", "--socket", self.socket, "--config", workdir / "agentosd.toml",
             "--python", REPO / ".venv" / "bin" / "python"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(self.log, "wb"),
            env=env)

    def agentos(self, *args: str, timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run([self.bin_dir / "agentos", "--socket", str(self.socket), *args],
                              capture_output=True, text=True, timeout=timeout)

    def wait_ready(self, servers: list[str], timeout: float = 300) -> dict:
        """Until THINK is ready (the model loaded) and every tool server is."""
        deadline = time.monotonic() + timeout
        hello: dict = {}
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"agentosd exited:\n{self.log.read_text()[-4000:]}")
            reply = self.agentos("hello", "--json", timeout=30)
            if reply.returncode == 0:
                hello = json.loads(reply.stdout)
                ready = {s["name"] for s in hello.get("tool_servers", []) if s["state"] == "ready"}
                if hello.get("llm", {}).get("ready") and set(servers) <= ready:
                    return hello
            time.sleep(1)
        raise SystemExit(f"the kernel was not ready in {timeout:.0f} s: {hello}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def put_in_workspace(kernel: Kernel, session: str, files: dict[str, str]) -> None:
    """The task's files, put in `session`'s /workspace with the SDK as a
    user would."""
    from agentos import AgentOSClient

    with AgentOSClient(str(kernel.socket)) as client:
        client.close_session(session)
        client.exec("pass", session=session, files=files)


def run_task(kernel: Kernel, task: eval_tasks.Task, max_iterations: int,
             timeout: float) -> dict:
    session: list[str] = []
    if task.workspace:
        name = "eval-" + "-".join(task.name.split())
        put_in_workspace(kernel, name, task.workspace)
        session = ["--session", name]
    started = time.monotonic()
    reply = kernel.agentos("run", "--json", "--max-iterations", str(max_iterations),
                           "--timeout", str(int(timeout)), *session, task.prompt,
                           timeout=timeout + 60)
    took = time.monotonic() - started
    try:
        record = json.loads(reply.stdout)
    except json.JSONDecodeError:
        record = {"state": "no reply", "stderr": reply.stderr[-2000:]}
    result = record.get("result") or {}
    answer = result.get("answer") or ""
    completed = record.get("state") == "completed"
    passed = completed and task.check(answer, result)
    # A right answer reached another way (no failed run first, no tool)
    # fails the task, yet is no wrong answer passed off as checked.
    wrong_answer = completed and not eval_tasks.answer_is_right(task, answer, result)
    # A result without `checked` is from a loop that claimed every answer.
    checked = completed and result.get("checked", True)
    return {"task": task.name, "kind": task.kind, "passed": passed, "checked": checked,
            "wrong_answer": wrong_answer,
            "seconds": round(took, 1), "state": record.get("state"), "answer": answer,
            "iterations": len(result.get("iterations") or []), "record": record}


def summary(model: str, outcomes: list[dict]) -> str:
    if not outcomes:
        return f"| {model} | - | - | - | - | - |"
    passed = sum(o["passed"] for o in outcomes)
    wrong_but_checked = sum(o["checked"] and o["wrong_answer"] for o in outcomes)
    times = sorted(o["seconds"] for o in outcomes)
    p90 = times[min(len(times) - 1, round(0.9 * (len(times) - 1)))]
    return (f"| {model} | {passed}/{len(outcomes)} | {wrong_but_checked} | "
            f"{statistics.median(times):.1f} s | {p90:.1f} s | {sum(times):.0f} s |")


def mcp_summary(model: str, outcomes: list[dict]) -> str:
    if not outcomes:
        return f"| {model} | - | - | - |"
    times = [o["seconds"] for o in outcomes]
    return (f"| {model} | {sum(o['passed'] for o in outcomes)}/{len(outcomes)} | "
            f"{statistics.median(times):.1f} s | {sum(times):.0f} s |")


def by_kind(model: str, outcomes: list[dict]) -> str:
    cells = []
    for kind in KINDS:
        of_kind = [o for o in outcomes if o["kind"] == kind]
        cells.append(f"{sum(o['passed'] for o in of_kind)}/{len(of_kind)}" if of_kind else "-")
    return f"| {model} | " + " | ".join(cells) + " |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", default=[],
                        help="an llm.local.model name (repeat for several; default: the "
                             "kernel's default model)")
    parser.add_argument("--only", action="append", default=[],
                        help="run only the tasks with this name (repeatable)")
    parser.add_argument("--max-iterations", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=300, help="seconds per task")
    parser.add_argument("--json", type=Path, help="write every outcome and transcript here")
    parser.add_argument("--no-mcp", action="store_true",
                        help="leave out the tasks an MCP host drives through `agentos mcp`")
    parser.add_argument("--bin-dir", type=Path,
                        default=Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")) / "release")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("eval-local-model needs root: the loop's code runs with EXEC", file=sys.stderr)
        return 2

    workdir = REPO / "build" / "eval"
    shutil.rmtree(workdir, ignore_errors=True)
    fixtures = workdir / "fixtures"
    fixtures.mkdir(parents=True)
    for name, content in eval_tasks.FIXTURES.items():
        (fixtures / name).write_text(content)
    chosen = [t for t in eval_tasks.tasks(fixtures) if not args.only or t.name in args.only]
    mcp_chosen = [] if args.no_mcp else [
        t for t in eval_tasks.mcp_tasks(fixtures) if not args.only or t.name in args.only]
    servers = sorted({server for task in chosen + mcp_chosen for server in task.needs} |
                     {"everything", "filesystem", "time"})

    rows, everything = [], {}
    for model in args.model or [None]:
        home = workdir / (model or "default")
        home.mkdir()
        kernel = Kernel(args.bin_dir, home, kernel_config(model, fixtures))
        try:
            hello = kernel.wait_ready(servers)
            name = model or hello["llm"]["model"]
            print(f"\n== {name}: {len(chosen)} tasks, at most {args.max_iterations} iterations each")
            outcomes = []
            for task in chosen:
                outcome = run_task(kernel, task, args.max_iterations, args.timeout)
                outcomes.append(outcome)
                mark = "PASS" if outcome["passed"] else "fail"
                mark += "" if outcome["checked"] else "?"
                print(f"  {mark:<5} {task.name:<20} {task.kind:<9} {outcome['seconds']:6.1f} s  "
                      f"{outcome['iterations']} it.  {outcome['state']}: "
                      f"{' '.join(outcome['answer'].split())[:70]!r}", flush=True)
            mcp_outcomes = mcp_host.run_tasks(args.bin_dir / "agentos", kernel.socket, mcp_chosen)
            for outcome in mcp_outcomes:
                mark = "PASS" if outcome["passed"] else "fail"
                print(f"  {mark:<5} {outcome['task']:<20} mcp       {outcome['seconds']:6.1f} s  "
                      f"{len(outcome['calls'])} call(s): "
                      f"{' '.join(outcome['answer'].split())[:70]!r}", flush=True)
            rows.append((summary(name, outcomes), by_kind(name, outcomes),
                         mcp_summary(name, mcp_outcomes)))
            everything[name] = outcomes + mcp_outcomes
        finally:
            kernel.stop()
    print("\n(a ? after PASS or fail: the loop said its answer was unchecked)")
    print("\n| model | tasks solved | wrong, yet checked | p50 time | p90 time | all tasks |")
    print("|---|---:|---:|---:|---:|---:|")
    for row, _, _ in rows:
        print(row)
    print("\n| model | " + " | ".join(KINDS) + " |")
    print("|---|" + "---:|" * len(KINDS))
    for _, row, _ in rows:
        print(row)
    if mcp_chosen:
        print("\n| model | MCP host tasks solved | p50 time | all tasks |")
        print("|---|---:|---:|---:|")
        for _, _, row in rows:
            print(row)
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1))
    return 0


if __name__ == "__main__":
    # Stopped from outside, it still stops its kernel (the `finally` above).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
