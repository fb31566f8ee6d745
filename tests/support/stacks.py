"""Where a test failed waiting for a replica to be ready ("... not ready after ..."), the Python stacks of this
machine's node agents and replicas, with py-spy, added to the test's report: that wait has failed under the full
suite's load with nothing in the agent's log, and the stacks at that moment say where each process was."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

# The node agents (shown first, with the processes under them), replicas and zygotes.
MODULES = {b"ember_runtime", b"ember_runtime.replica", b"ember_runtime.zygote", b"ember_runtime.hostpid"}
MAX_PROCESSES = 60


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:240]
    except OSError:
        return "(gone)"


def _processes() -> list[tuple[int, str]]:
    """(pid, command line) of each Python process running one of ``MODULES`` (``python -m MODULE``)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        agent = len(argv) > 2 and argv[1] == b"-c" and b"support.faults" in argv[2]  # an agent with faults
        if agent or (len(argv) > 2 and argv[1] == b"-m" and argv[2] in MODULES):
            found.append((int(pid), b" ".join(argv).decode(errors="replace")[:240]))
    found.sort(key=lambda p: (" -m ember_runtime " not in p[1] and "support.faults" not in p[1], p[0]))
    return found[:MAX_PROCESSES]


def _tree(pid: int, depth: int = 0) -> list[str]:
    """``pid`` and every process under it: pid, state, what it waits in (wchan), command line."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip() or "-"
    except (OSError, IndexError):
        return []
    lines = [f"{'  ' * depth}{pid} {state} {wchan} {_command(pid)[:160]}"]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            lines += _tree(int(child), depth + 1)
    return lines


def dump(pids: list[int] | None = None) -> str:
    """The stacks of the agents, replicas and zygotes running now (or of ``pids``); a line saying why not, where
    py-spy cannot."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        return "py-spy is not installed: no stacks"
    parts = []
    for pid, command in _processes() if pids is None else [(pid, _command(pid)) for pid in pids]:
        try:
            done = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=20,
                                  check=False)
            tree = "\n".join(_tree(pid)[1:]) if " -m ember_runtime " in f"{command} " else ""
            parts.append(f"===== {pid} {command}\n{done.stdout}{done.stderr[-500:]}"
                         + (f"its processes (pid, state, wchan, command):\n{tree}\n" if tree else ""))
        except (OSError, subprocess.TimeoutExpired) as exc:
            parts.append(f"===== {pid} {command}\npy-spy: {exc}")
    return "\n".join(parts) or "no agent, replica or zygote process runs"
