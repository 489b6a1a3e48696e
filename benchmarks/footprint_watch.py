"""The last part of benchmarks/footprint_stages.py: a real ``watch`` against the simulator.

The staged process imports and starts what watch does piece by piece; this runs the command line
itself in a child process (its default actions, its own server listening, NVML where there is a
GPU), reads the child's RSS after ``seconds``, stops it with SIGTERM and lists what it imported.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

from engine_watchdog.sim.launcher import SimProcess

CHILD = """
import json, sys
from engine_watchdog.cli.main import main
try:
    main(sys.argv[2:])
except SystemExit as exc:
    code = exc.code
with open(sys.argv[1], "w") as f:
    json.dump({"code": code, "modules": sorted(sys.modules)}, f)
"""
"""``engine-watchdog ARGS`` that writes its exit code and its modules once it stops."""


def proc_rollup(pid: int) -> dict[str, float]:
    """/proc/PID/smaps_rollup's Rss and Anonymous and /proc/PID/status's VmHWM, in MB."""
    fields: dict[str, float] = {}
    lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]
    lines += Path(f"/proc/{pid}/status").read_text().splitlines()
    for line in lines:
        key, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


Watched = tuple[dict[str, float], int, dict[str, object]]
"""The child's memory (MB), its thread count, and what it wrote at its stop."""


async def watch_once(seconds: float, folder: Path) -> Watched:
    """A real watch of the simulator for ``seconds``, then stopped."""
    out = folder / "modules.json"
    async with SimProcess("--tokens-per-second", "30", startup_timeout=30) as sim:
        args = ["watch", sim.url, "--listen", "127.0.0.1:0", "--incident-dir", str(folder)]
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CHILD, str(out), *args,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        try:
            await asyncio.sleep(seconds)
            memory = proc_rollup(child.pid)
            threads = len(os.listdir(f"/proc/{child.pid}/task"))
        finally:
            child.send_signal(signal.SIGTERM)
            await child.wait()
    doc: dict[str, object] = json.loads(out.read_text()) if out.exists() else {}
    return memory, threads, doc


def report_real_watch(seconds: float, staged: set[str]) -> None:
    """Print the real watch's RSS and the packages it holds (``staged``: this process's)."""
    with tempfile.TemporaryDirectory(prefix="footprint-watch-") as folder:
        memory, threads, doc = asyncio.run(watch_once(seconds, Path(folder)))
    print(f"\na real `watch` against the simulator, after {seconds:.0f} s (a child process):")
    print("| RSS MB | anonymous MB | peak RSS (VmHWM) MB | threads | modules | exit |")
    print("|---|---|---|---|---|---|")
    modules = doc.get("modules", [])
    assert isinstance(modules, list)
    print(f"| {memory['Rss']:.1f} | {memory['Anonymous']:.1f} | {memory['VmHWM']:.1f} | "
          f"{threads} | {len(modules)} | {doc.get('code')} |")  # fmt: skip
    tops = {m.partition(".")[0] for m in modules if not m.startswith(("_", "cython"))}
    tops -= set(sys.stdlib_module_names)
    print("its packages beyond the standard library:", ", ".join(sorted(tops)))
    print("its modules the staged process lacks:", ", ".join(sorted(set(modules) - staged)))
