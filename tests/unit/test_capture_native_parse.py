"""eu-stack's text (recorded from the real llama-server built here, its inference thread held
inside a decode by the stall shim: tests/data/llamacpp) read into py-spy's thread shape, and
where the summary says each thread is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine_watchdog.capture.frames import group_threads, parse_threads, thread_label
from engine_watchdog.capture.native import parse_eu_stack

DATA = Path(__file__).resolve().parents[1] / "data" / "llamacpp"
RECORDED = DATA / "eu-stack-inference-stall.txt"


def threads() -> list[dict[str, Any]]:
    text = RECORDED.read_text()
    pid = int(text.split()[1])  # "PID 7835 - process"
    return parse_eu_stack(text, pid, proc_root=Path("/nonexistent"))


def test_every_thread_and_frame_is_read() -> None:
    got = threads()
    assert len(got) == 10
    main = got[0]
    frames = main["frames"]
    assert isinstance(frames, list)
    names = [f["name"] for f in frames]
    assert names[:4] == [
        "__futex_abstimed_wait_common",
        "pthread_cond_timedwait",  # the symbol version (@@GLIBC_2.3.2) is dropped
        "engine_watchdog_test_stall",
        "GOMP_parallel",
    ]
    assert frames[2]["module"].endswith("libshim.so")
    # A frame without a symbol keeps its address, and its module is still its module.
    nameless = [f for t in got for f in t["frames"] if str(f["name"]).startswith("0x")]
    modules = {str(f["module"]).rsplit("/", 1)[-1] for f in nameless}
    assert modules == {"libstdc++.so.6.0.30", "libgomp.so.1.0.0"}, modules


def test_the_summary_names_the_stalled_decode() -> None:
    pid = int(RECORDED.read_text().split()[1])
    groups = group_threads(parse_threads(threads(), pid))
    main = groups[0]
    assert thread_label(main) == "main thread"
    assert main.diagnosis.kind == "condition"
    assert main.diagnosis.activity == (
        "waiting on a condition in engine_watchdog_test_stall under graph compute"
    )
    activities = {g.diagnosis.activity for g in groups}
    # The HTTP threads wait for connections in cpp-httplib's pool: they answer /health.
    assert "waiting on a condition in worker" in activities, activities
