"""node_clean's rules on plain data: which processes are the engine's (PID reuse, sessions, the
UID), and what the report says of zombies, a process that survives SIGKILL and a broken NVML.
Real processes and files: tests/integration/test_node_clean.py and test_multinode_gloo.py."""

from __future__ import annotations

import signal
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from engine_watchdog.host.proclist import FileId, HostProc
from engine_watchdog.recovery import node_clean
from engine_watchdog.recovery.node_clean import EngineRef, clean_node, engine_processes
from tests.tools.fake_nvml import FakeNvml

UID = 1000


def proc(pid: int, ppid: int = 1, uid: int = UID, sid: int = 0, started: float = 100.0,
         status: str = "sleeping") -> HostProc:  # fmt: skip
    return HostProc(pid, ppid, uid, sid or pid, status, started, f"p{pid}")


def table(*procs: HostProc) -> dict[int, HostProc]:
    return {p.pid: p for p in procs}


def test_the_tree_the_sessions_and_the_uid() -> None:
    root = proc(10, sid=10)
    rows = table(
        root,
        proc(11, ppid=10, sid=10),
        proc(12, ppid=11, sid=10, uid=1001),  # in the tree, another UID
        proc(13, ppid=12, sid=10),  # below it: still the engine's
        proc(20, sid=10, started=150.0),  # reparented, its session kept
        proc(21, sid=10, started=50.0),  # the session id, but older than the engine: a reuse
        proc(30, sid=30),  # the engine's UID, elsewhere
    )
    assert sorted(engine_processes(EngineRef(UID, (root,), frozenset({10})), rows)) == [
        10, 11, 13, 20,
    ]  # fmt: skip


def test_a_reused_pid_is_not_the_engine() -> None:
    recorded = proc(10, started=100.0)
    rows = table(proc(10, started=200.0), proc(11, ppid=10))
    assert engine_processes(EngineRef(UID, (recorded,)), rows) == {}


class FakeProcs:
    """A process list where some processes ignore every signal (in D state, say)."""

    def __init__(self, rows: dict[int, HostProc], deaf: Iterable[int] = ()) -> None:
        self.rows, self.deaf = rows, set(deaf)
        self.sent: list[tuple[int, signal.Signals]] = []

    def processes(self) -> Mapping[int, HostProc]:
        return dict(self.rows)

    def holders(self, files: Iterable[FileId]) -> Mapping[FileId, frozenset[int]]:
        return {}

    def signal(self, proc: HostProc, sig: signal.Signals) -> bool:
        self.sent.append((proc.pid, sig))
        if proc.pid not in self.deaf and sig in (signal.SIGTERM, signal.SIGKILL):
            self.rows.pop(proc.pid, None)
        return True


class BrokenNvml:
    def nvmlInit(self) -> None:
        raise RuntimeError("Driver Not Loaded")


def test_zombies_stubborn_processes_and_nvml_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node_clean, "KILL_WAIT_S", 0.1)  # how long a SIGKILL is waited for
    root = proc(10)
    rows = table(root, proc(11, ppid=10, status="zombie"), proc(12, ppid=10), proc(13, ppid=10))
    procs = FakeProcs(rows, deaf={13})
    report = clean_node(EngineRef(UID, (root,)), procs, BrokenNvml(), tmp_path, grace_s=0.1)
    by_pid = {i.pid: i for i in report.items}
    assert by_pid[10].removed and by_pid[12].removed
    assert by_pid[11].kind == "zombie" and "parent (PID 10) must reap it" in by_pid[11].reason
    assert not by_pid[13].removed and by_pid[13].reason == "survived SIGKILL"
    assert (13, signal.SIGKILL) in procs.sent and (11, signal.SIGTERM) not in procs.sent
    assert not report.clean  # a live process of the engine's is left; the zombie alone is not
    assert report.errors == ("GPUs not checked: nvmlInit failed: Driver Not Loaded",)


def test_no_nvml_and_no_shm_root(tmp_path: Path) -> None:
    report = clean_node(EngineRef(UID, ()), FakeProcs({}), None, tmp_path / "absent")
    assert report.clean and report.items == ()
    assert report.errors[0].startswith("GPUs not checked: NVML not available")
    assert report.errors[1] == f"{tmp_path / 'absent'} not checked: No such file or directory"


class LaggingNvml(FakeNvml):
    """NVML as the H200 showed it: a context listed on for a while after its process exited."""

    def __init__(self, pids: Iterable[int], lag_calls: int) -> None:
        super().__init__(pids)
        self.lag_calls = lag_calls

    def listed(self) -> list[int]:
        return self.pids if self.calls <= 1 + self.lag_calls else []


@pytest.mark.parametrize(("lag_calls", "clean"), [(3, True), (10_000, False)])
def test_a_gpu_context_the_driver_still_lists_after_the_kill(
    tmp_path: Path, lag_calls: int, clean: bool
) -> None:
    """The node is clean once NVML stops listing the ended holder; memory it goes on listing
    past the bound is GPU memory left, and the report says so."""
    root = proc(10)
    nvml = LaggingNvml({10}, lag_calls)
    report = clean_node(
        EngineRef(UID, (root,)), FakeProcs(table(root)), nvml, tmp_path, gpu_release_s=0.5
    )
    assert report.clean is clean, report.as_dict()
    held = [i for i in report.left if i.kind == "gpu-memory"]
    assert [i.pid for i in held] == ([] if clean else [10])
    assert nvml.calls > 2  # it waited on the driver, not on the process alone
