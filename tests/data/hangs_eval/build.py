"""Write the evaluation bundles from their specs (cases_*.py): only what each upstream report
shows, nothing filled in.

Each case becomes ``<name>/`` with the bundle files its report supports and ``source.md`` (the
report, what was taken from it, what the report leaves out), and ``index.json`` lists every
case's kind and expected signature. Regenerate with ``python -m tests.data.hangs_eval.build``.

What goes where, and what is never invented:

- ``manifest.json``: the engine the report is about, and the case's name. No verdict, no times:
  no report gives the watchdog's verdict.
- ``processes.json``: the command lines and environment variables the report quotes, one
  process each. A report rarely shows a PID: where it does not, the PID is the process's index
  (1, 2, ...), an identifier the matcher reads no meaning into. The role is the process the
  report names (``vllm serve`` is the API server, ``VLLM::EngineCore`` the engine core).
- ``pyspy/<pid>.json``: the stacks the report quotes, innermost frame first, with the file and
  line as quoted (no line: 0); native frames as py-spy names them.
- ``engine.log``: the log lines the report quotes, verbatim.
- ``gpu.json``: the GPUs the report names, with only the figures it gives (utilisation, memory
  utilisation, power, SM clock); the classification is what the capture would compute from
  those figures (core/gpu_class.py: without GPM figures a busy GPU is "unknown").
- ``versions.json``: the engine and NCCL versions the report states.
- ``timeline.jsonl``: a /metrics scrape only where the report gives the running and waiting
  gauges (``vllm:num_requests_running = 1``).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from engine_watchdog.core.gpu_class import classify_gpu
from engine_watchdog.core.model import GpuInfo

HERE = Path(__file__).parent
KINDS = ("positive", "negative", "healthy")


def frame(text: str) -> dict[str, Any]:
    """``name (file:line)``, ``name (file)`` or ``name (lib.so)`` as py-spy prints a frame; a
    bare ``name`` where the report gives no file."""
    if not text.endswith(")") or " (" not in text:
        return {"name": text, "filename": "", "short_filename": "", "line": 0, "module": None}
    name, _, rest = text.rpartition(" (")
    where = rest.rstrip(")")
    file, _, line = where.rpartition(":")
    if not file or not line.isdigit():
        file, line = where, "0"
    native = file.endswith((".so", ".1")) or ".so." in file or file.startswith("0x")
    return {
        "name": name or text,
        "filename": file,
        "short_filename": file.rsplit("/", 1)[-1] if native else file,
        "line": int(line),
        "module": file if native else None,
    }


def _threads(pid: int, stacks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "pid": pid,
            "thread_id": i + 1,
            "os_thread_id": t.get("tid", i + 1),
            "thread_name": t.get("name", ""),
            "active": t.get("active", False),
            "frames": [frame(f) for f in t["frames"]],
        }
        for i, t in enumerate(stacks)
    ]


def _gpus(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    out = []
    for i, g in enumerate(gpus):
        info = GpuInfo(i, g.get("util"), g.get("power"))
        out.append(
            {
                "index": i,
                "name": g["name"],
                "classification": classify_gpu(info),
                "utilization_pct": {"gpu": g.get("util"), "memory": g.get("mem")},
                "power_w": g.get("power"),
                "power_limit_w": g.get("power_limit"),
                "sm_clock_mhz": g.get("sm_clock"),
                "gpm_pct": None,
            }
        )
    return {"available": True, "gpus": out}


def _scrapes(points: list[dict[str, float]], engine: str) -> bytes:
    names = {
        "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
        "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
    }[engine]
    lines = []
    for i, p in enumerate(points):
        body = f"{names[0]} {p['running']}\n{names[1]} {p['waiting']}\n"
        lines.append(json.dumps({"t": float(i), "kind": "scrape", "body": body}) + "\n")
    return "".join(lines).encode()


def _dump(obj: Any) -> bytes:
    return (json.dumps(obj, indent=1) + "\n").encode()


def write_case(root: Path, name: str, case: dict[str, Any]) -> None:
    d = root / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    b = case["bundle"]
    files: dict[str, bytes] = {
        "manifest.json": _dump({"name": name, "engine": b["engine"], "eval_case": True})
    }
    procs = b.get("procs", [])
    if procs:
        files["processes.json"] = _dump(
            [
                {
                    "pid": p["pid"],
                    "role": p["role"],
                    "cmdline": p.get("cmdline", []),
                    "environ": p.get("environ", {}),
                }
                for p in procs
            ]
        )
    for p in procs:
        if p.get("stacks"):
            files[f"pyspy/{p['pid']}.json"] = _dump(_threads(p["pid"], p["stacks"]))
    if b.get("log"):
        files["engine.log"] = ("\n".join(b["log"]) + "\n").encode()
    if b.get("gpus"):
        files["gpu.json"] = _dump(_gpus(b["gpus"]))
    if b.get("versions"):
        files["versions.json"] = _dump(b["versions"])
    if b.get("scrapes"):
        files["timeline.jsonl"] = _scrapes(b["scrapes"], b["engine"])
    files["source.md"] = source_md(name, case).encode()
    for rel, data in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)


def source_md(name: str, case: dict[str, Any]) -> str:
    kind = case["kind"]
    expect = f", expected signature `{case['expect']}`" if case.get("expect") else ""
    lines = [
        f"# {name}",
        "",
        f"Kind: {kind}{expect}.",
        "",
        "Source: " + ", ".join(f"<{u}>" for u in case["source"]),
        "",
        case["why"],
        "",
        "Taken from the report:",
        "",
        *[f"- {t}" for t in case["taken"]],
        "",
        "Not in the report (so not in the bundle):",
        "",
        *[f"- {t}" for t in case["left_out"]],
        "",
    ]
    return "\n".join(lines)


def all_cases() -> dict[str, dict[str, Any]]:
    from tests.data.hangs_eval.cases_negative import NEGATIVE
    from tests.data.hangs_eval.cases_negative_more import NEGATIVE_MORE
    from tests.data.hangs_eval.cases_positive import POSITIVE
    from tests.data.hangs_eval.cases_positive_llamacpp import POSITIVE_LLAMACPP
    from tests.data.hangs_eval.cases_positive_more import POSITIVE_MORE
    from tests.data.hangs_eval.cases_positive_multinode import POSITIVE_MULTINODE
    from tests.data.hangs_eval.cases_positive_rocm import POSITIVE_ROCM
    from tests.data.hangs_eval.cases_positive_sglang import POSITIVE_SGLANG
    from tests.data.hangs_eval.cases_positive_sglang_dp import POSITIVE_SGLANG_DP
    from tests.data.hangs_eval.cases_positive_trtllm import POSITIVE_TRTLLM
    from tests.data.hangs_eval.cases_positive_vllm import POSITIVE_VLLM

    every = {
        **POSITIVE,
        **POSITIVE_MORE,
        **POSITIVE_LLAMACPP,
        **POSITIVE_SGLANG,
        **POSITIVE_VLLM,
        **POSITIVE_SGLANG_DP,
        **POSITIVE_TRTLLM,
        **POSITIVE_ROCM,
        **POSITIVE_MULTINODE,
        **NEGATIVE,
        **NEGATIVE_MORE,
    }
    for name, case in every.items():
        assert case["kind"] in KINDS, name
        assert (case["kind"] == "positive") == bool(case.get("expect")), name
    return every


def index(cases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        name: {"kind": c["kind"], "expect": c.get("expect"), "source": c["source"]}
        for name, c in sorted(cases.items())
    }


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else HERE
    cases = all_cases()
    for name, case in cases.items():
        write_case(out, name, case)
    (out / "index.json").write_bytes(_dump(index(cases)))
    print(f"wrote {len(cases)} evaluation cases under {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
