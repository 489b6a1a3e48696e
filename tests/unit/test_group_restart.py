"""The group restart's rules on plain data: which of a node's ranks its hook stops (the
engine's UID only, never the sidecar itself), what the leader's record says per node, and that
a node without an answer keeps the group unverified."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from engine_watchdog.core.model import ProcInfo, Result
from engine_watchdog.peers.discovery import Peer
from engine_watchdog.peers.group_restart import NodeStop, outcome, write_reports
from engine_watchdog.peers.node_stop import NodeRestart, shm_root_from
from tests.tools.fake_nvml import FakeNvml
from tests.unit.test_node_clean import UID, FakeProcs, proc, table


def rank(pid: int) -> ProcInfo:
    return ProcInfo(
        pid=pid, ppid=1, role="worker", title="VLLM::Worker_TP0", state="sleeping", cpu_s=0.0
    )


async def _none() -> tuple[ProcInfo, ...]:
    return ()


def test_the_hook_stops_the_engines_ranks_and_their_children_and_nothing_else(
    tmp_path: Path,
) -> None:
    me = os.getpid()
    rows = table(proc(10), proc(11, ppid=10), proc(20, uid=1001), proc(me), proc(30))
    fake = FakeProcs(rows)
    hook = NodeRestart(_none, UID, FakeNvml([30]), tmp_path, fake, grace_s=0.1)
    result = hook.stop_and_clean([rank(10), rank(20), rank(me)])
    assert result["stopped"] == [10] and result["stopped_others"] == [11]
    assert sorted({pid for pid, _ in fake.sent}) == [10, 11]  # not 20, not us, not 30
    assert result["spared"] == [
        "PID 20: UID 1001, not the engine's (1000)",
        f"PID {me}: this sidecar",
    ]
    # PID 30 is the engine's UID on a GPU, outside the ranks' trees: left, and not clean.
    assert result["verified"] is False
    (held,) = result["clean"]["left"]
    assert held["pid"] == 30 and "outside its process tree" in held["reason"]
    assert (signal.SIGCONT in {s for _, s in fake.sent}) is True  # a stopped rank can act


def test_the_record_says_every_node_and_names_the_unverified(tmp_path: Path) -> None:
    a, b = Peer("node-a", "10.0.0.1", 9401), Peer("node-b", "10.0.0.2", 9401)
    clean = {"clean": True, "removed": [{"kind": "shm", "what": "/dev/shm/nccl-1"}], "left": []}
    stops = [
        NodeStop(a, {"stopped": [1, 2], "verified": True, "clean": clean}),
        NodeStop(b, None, "no answer within 15 s", 15.0),
    ]
    done = outcome(stops)
    assert done.result is Result.FAILED
    assert done.detail == (
        "group NOT verified clean (node-b): node-a: stopped 2 rank processes, removed 1 "
        "files, left 0; node-b UNVERIFIED (no answer within 15 s)"
    )
    assert outcome(stops[:1]).result is Result.OK
    files = write_reports(tmp_path, stops)
    assert files == ["nodes/node-a/node-clean.json", "nodes/node-b/node-clean.json"]
    assert '"answered": false' in (tmp_path / files[1]).read_text()


def test_the_shm_root_is_dev_shm_unless_the_variable_says() -> None:
    assert shm_root_from({}) == Path("/dev/shm")
    assert shm_root_from({"ENGINE_WATCHDOG_SHM_ROOT": "/mnt/shm"}) == Path("/mnt/shm")


class Engine:
    """What the restart needs of the engine: no process left (the group stop ended them)."""

    profile = type("Profile", (), {"launcher_cmdline_markers": ()})()
    noted: list[str] = []

    async def find_procs(self) -> tuple[ProcInfo, ...]:
        return ()

    def note_restart(self, detail: str, replaced: bool = False) -> None:
        self.noted.append(detail)


async def test_the_group_stop_comes_first_and_the_record_says_both(tmp_path: Path) -> None:
    from engine_watchdog.core.model import Outcome
    from engine_watchdog.core.settings import CaptureSettings, RecoverySettings
    from engine_watchdog.recovery.actions import EngineActions

    order: list[str] = []

    async def stop_group(bundle: Path | None) -> Outcome:
        order.append(f"group {bundle}")
        return Outcome(Result.FAILED, "group NOT verified clean (node-b): ...")

    async def restarter(since: float) -> Outcome:
        order.append("child")
        return Outcome(Result.OK, "engine restarted (pid 7)")

    engine: Any = Engine()
    capture = CaptureSettings(incident_dir=tmp_path)
    run_mode = EngineActions(engine, capture, RecoverySettings(), lambda d: [], restarter,
                             stop_group=stop_group)  # fmt: skip
    run_mode.last_bundle = str(tmp_path / "bundle")
    done = await run_mode.restart(0.0)
    assert order == [f"group {tmp_path / 'bundle'}", "child"]
    assert done == Outcome(
        Result.OK, "group NOT verified clean (node-b): ...; then engine restarted (pid 7)"
    )
    # watch: the engine core is gone already (the group stop ended it); its supervisor restarts
    # it, and the watchdog treats what follows as the restart it caused.
    watch = EngineActions(engine, capture, RecoverySettings(), lambda d: [], None,
                          stop_group=stop_group)  # fmt: skip
    done = await watch.restart(0.0)
    assert done == Outcome(
        Result.OK,
        "group NOT verified clean (node-b): ...; then engine ended by the group stop; its "
        "supervisor restarts it",
    )  # not kill_engine_core's "no live engine-core process ... pass --pid" advice
    assert len(engine.noted) == 2
