"""Write fixture bundles in the exact shapes the capture step writes (docs/bundle.md):
manifest.json, processes.json, pyspy/<pid>.json (py-spy 0.4 ``dump --json``) and pyspy/<pid>.txt
(the layout of engine_watchdog/capture/pyspy.py ``render_text``), gpu.json (capture/gpu_state.py),
engine.log, flight_recorder/, timeline.jsonl, versions.json, summary.md.

Regenerate the committed fixtures with ``python -m tests.data.hangs.build`` (tests/data/hangs/
specs.py holds what each fixture contains, and which upstream report each piece is shaped on).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import sys
from pathlib import Path
from typing import Any

SITE = "/usr/local/lib/python3.12/dist-packages/"
STDLIB = "/usr/lib/python3.12/"
LIBDIR = "/usr/lib/x86_64-linux-gnu/"
CREATED = 1_780_000_000.0

Frame = dict[str, Any]


def py(name: str, short: str, line: int) -> Frame:
    """A Python frame as py-spy reports it (``short`` as py-spy shortens it)."""
    if short.startswith("<"):
        full = short
    elif short.split("/", 1)[0] in ("vllm", "torch", "sglang", "zmq", "flashinfer", "lmcache"):
        full = SITE + short
    else:
        full = STDLIB + short
    return {
        "name": name,
        "filename": full,
        "module": None,
        "short_filename": short,
        "line": line,
        "locals": None,
        "is_entry": True,
        "is_shim_entry": False,
    }


def nat(name: str, lib: str) -> Frame:
    """A native frame (``--native``): py-spy names the shared object, line 0."""
    path = lib if lib.startswith("/") else LIBDIR + lib
    return {
        "name": name,
        "filename": path,
        "module": path,
        "short_filename": lib.rsplit("/", 1)[-1],
        "line": 0,
        "locals": None,
        "is_entry": True,
        "is_shim_entry": True,
    }


SPAWN_TAIL = [
    py("run", "multiprocessing/process.py", 108),
    py("_bootstrap", "multiprocessing/process.py", 314),
    py("_main", "multiprocessing/spawn.py", 135),
    py("spawn_main", "multiprocessing/spawn.py", 122),
    py("<module>", "<string>", 1),
]
THREAD_TAIL = [
    py("run", "threading.py", 1012),
    py("_bootstrap_inner", "threading.py", 1075),
    py("_bootstrap", "threading.py", 1032),
]


def thread(
    tid: int, name: str, frames: list[Frame], active: bool = False, pid: int = 0
) -> dict[str, Any]:
    return {
        "pid": pid,
        "thread_id": 140_000_000_000_000 + tid,
        "thread_name": name,
        "os_thread_id": tid,
        "active": active,
        "owns_gil": False,
        "frames": frames,
        "process_info": None,
    }


def render_text(pid: int, title: str, role: str, mode: str, threads: list[dict[str, Any]]) -> str:
    """engine_watchdog/capture/pyspy.py render_text, line for line."""
    lines = [f"Process {pid}: {title}", f"role {role}, py-spy dump ({mode})", ""]
    for th in threads:
        tag = "active+gil" if th.get("owns_gil") else ("active" if th.get("active") else "idle")
        lines.append(f'Thread {th["os_thread_id"]} ({tag}): "{th["thread_name"]}"')
        for fr in th["frames"]:
            where = fr["short_filename"]
            lines.append(
                f"    {fr['name']} ({where}:{fr['line']})"
                if fr["line"]
                else f"    {fr['name']} ({where})"
            )
    return "\n".join(lines) + "\n"


def gpu_snapshot(gpus: list[dict[str, Any]] | None, driver: str = "580.126.09") -> dict[str, Any]:
    if gpus is None:
        return {"available": False, "reason": "NVML not available (libnvidia-ml.so.1 not found)"}
    entries = []
    for i, g in enumerate(gpus):
        cls = g["class"]
        util = g.get("util", {"spinning": 100.0, "computing": 99.0, "idle": 0.0}[cls])
        entries.append(
            {
                "index": i,
                "name": g["name"],
                "uuid": f"GPU-{i:08d}",
                "pci_bus_id": f"00000000:{i + 1:02X}:00.0",
                "classification": cls,
                "utilization_pct": {"gpu": util, "memory": 0.0},
                "power_w": g.get("power", 120.0),
                "sm_clock_mhz": 1980,
                "gpm_pct": g.get("gpm"),
                "processes": [],
                "xid_events": [],
                "errors": {},
            }
        )
    return {
        "available": True,
        "t": CREATED - 1,
        "driver_version": driver,
        "nvml_version": "13." + driver,
        "notes": [],
        "xid_events_since_start": [],
        "gpus": entries,
    }


def _write(root: Path, rel: str, data: bytes, files: list[dict[str, Any]], step: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    files.append(
        {"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "step": step}
    )


def _dump(obj: Any) -> bytes:
    return (json.dumps(obj, indent=1) + "\n").encode()


def write_bundle(root: Path, spec: dict[str, Any]) -> None:
    """One fixture bundle from its spec (see specs.py)."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    files: list[dict[str, Any]] = []
    procs = spec["procs"]
    records = [
        {k: p[k] for k in ("pid", "role", "title", "state")}
        | {"ppid": p.get("ppid", 1), "cpu_s": 12.5, "ns_pid": None}
        for p in procs
    ]
    _write(
        root,
        "processes.json",
        _dump(
            [
                r | {"cmdline": p["cmdline"], "environ": p.get("environ", {})}
                for r, p in zip(records, procs, strict=True)
            ]
        ),
        files,
        "bundle",
    )
    pyspy_status = "ok"
    for p in procs:
        threads = p.get("threads")
        if threads is None:
            pyspy_status = "partial"
            continue
        for th in threads:
            th["pid"] = p["pid"]
        _write(root, f"pyspy/{p['pid']}.json", _dump(threads), files, "py-spy")
        mode = "nonblocking" if p["state"] == "stopped" else p.get("mode", "native")
        _write(
            root,
            f"pyspy/{p['pid']}.txt",
            render_text(p["pid"], p["title"], p["role"], mode, threads).encode(),
            files,
            "py-spy",
        )
    if not any(p.get("threads") is not None for p in procs):
        pyspy_status = spec.get("pyspy_status", "permission-denied")
    if "gpus" in spec:
        _write(
            root,
            "gpu.json",
            _dump(gpu_snapshot(spec["gpus"], spec.get("driver", "580.126.09"))),
            files,
            "gpu",
        )
    if spec.get("log"):
        _write(root, "engine.log", ("\n".join(spec["log"]) + "\n").encode(), files, "bundle")
    for rank, entries in sorted(spec.get("flight_recorder", {}).items()):
        dump = {"version": "2.5", "pg_config": {}, "pg_status": {}, "entries": entries}
        data = pickle.dumps(dump, protocol=4) if spec.get("fr_pickle") else _dump(dump)
        _write(
            root,
            f"flight_recorder/rank{rank}_nccl_trace_rank_{rank}",
            data,
            files,
            "flight-recorder",
        )
    timeline = spec.get("timeline", [{"t": CREATED - 5, "kind": "procs", "procs": []}])
    _write(
        root,
        "timeline.jsonl",
        b"".join(json.dumps(r, sort_keys=True).encode() + b"\n" for r in timeline),
        files,
        "bundle",
    )
    versions = {
        "engine_watchdog": "0.1.0",
        "python": "3.11.7",
        "psutil": "7.0.0",
        "host": {
            "system": "Linux",
            "release": "6.8.0-88-generic",
            "machine": spec.get("machine", "x86_64"),
            "node": "gpu-node-1",
        },
        "py_spy": "py-spy 0.4.3",
    }
    _write(root, "versions.json", _dump(versions), files, "bundle")
    where = (
        "\n".join(f"- {w}" for w in spec.get("where", []))
        or "- No stacks were captured (see the steps below)."
    )
    summary = f"# {spec['engine']} stalled ({spec['cause']}) at 2026-05-28 20:26:40.000Z\n\n## Where it is stuck\n\n{where}\n\n## What happened\n\n- Verdict: **stalled**\n"
    _write(root, "summary.md", summary.encode(), files, "bundle")
    manifest = {
        "schema": "engine-watchdog/bundle",
        "schema_version": 1,
        "name": root.name,
        "engine_watchdog": "0.1.0",
        "created": "2026-05-28T20:26:40Z",
        "created_unix": CREATED,
        "engine": spec["engine"],
        "cause": spec["cause"],
        "trigger": "verdict",
        "destructive": False,
        "verdict": spec.get(
            "verdict",
            {
                "t": CREATED - 2,
                "engine": "0",
                "state": "stalled",
                "cause": spec["cause"],
                "since": CREATED - 120,
                "seconds_without_progress": 180.0,
                "last_progress_t": CREATED - 180,
                "evidence": spec.get("evidence", []),
            },
        ),
        "processes": records,
        "steps": [
            {
                "name": "py-spy",
                "status": pyspy_status,
                "detail": spec.get("pyspy_detail", ""),
                "elapsed_s": 0.4,
                "files": [],
            },
            {
                "name": "gpu",
                "status": "ok" if spec.get("gpus") else "not-available",
                "detail": "",
                "elapsed_s": 0.01,
                "files": [],
            },
        ],
        "files": files,
        "elapsed_s": 0.6,
    }
    (root / "manifest.json").write_bytes(_dump(manifest))


def main(argv: list[str]) -> int:
    from tests.data.hangs.specs import SPECS
    from tests.data.hangs.specs_more import MORE
    from tests.data.hangs.specs_multinode import MULTINODE

    out = Path(argv[1]) if len(argv) > 1 else Path(__file__).parent
    every = {**SPECS, **MORE, **MULTINODE}
    for name, spec in every.items():
        write_bundle(out / name, spec)
    print(f"wrote {len(every)} fixture bundles under {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
