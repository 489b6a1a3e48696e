"""Process discovery and sampling over plain data (a fake process table and a fake /proc), and
the host's real socket table where a listener's address decides."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path

import pytest

from engine_watchdog.engines import PROFILES, TGI, VLLM
from engine_watchdog.probes.pidns import read_ns_pid
from engine_watchdog.probes.procs import (
    classify_role,
    discover,
    normalise_state,
    sample_procs,
    sample_procs_async,
    select_pids,
    title_of,
    url_port,
)
from engine_watchdog.probes.proctable import PsutilTable, RawProc, serves


def raw(pid: int, ppid: int, *cmdline: str, status: str = "sleeping", cpu: float = 1.0) -> RawProc:
    return RawProc(pid=pid, ppid=ppid, cmdline=tuple(cmdline), status=status, cpu_s=cpu)


class FakeTable:
    def __init__(
        self, procs: list[RawProc], listeners: Mapping[int, frozenset[int]] | None
    ) -> None:
        self._procs = {p.pid: p for p in procs}
        self._listeners = listeners

    def processes(self) -> Mapping[int, RawProc]:
        return self._procs

    def listeners(self, host: str | None = None) -> Mapping[int, frozenset[int]] | None:
        return self._listeners


API = "python -m vllm.entrypoints.openai.api_server --model m --port 8000"
# One engine on 8000 (API 100 -> EngineCore 101 -> Worker 102), another server on 9000 with its
# own EngineCore (301), an orphaned EngineCore (400, its API server died), unrelated processes.
HOST = [
    raw(1, 0, "/sbin/init"),
    raw(100, 1, *API.split()),
    raw(101, 100, "VLLM::EngineCore", status="stopped", cpu=12.5),
    raw(102, 101, "VLLM::Worker_TP0"),
    raw(200, 1, "bash"),
    raw(300, 1, "python", "other_server.py"),
    raw(301, 300, "VLLM::EngineCore"),
    raw(400, 1, "VLLM::EngineCore_DP1"),
]
LISTENERS = {8000: frozenset({100}), 9000: frozenset({300}), 22: frozenset({1})}


def test_tree_from_port_with_orphans_but_not_other_servers() -> None:
    found = select_pids({p.pid: p for p in HOST}, LISTENERS, VLLM, port=8000)
    assert set(found.pids) == {100, 101, 102, 400}
    # Engine cores first, the API server last.
    assert found.pids[0] in (101, 400) and found.pids[-1] == 100
    assert found.listening == frozenset({100})
    assert found.orphans == frozenset({400})  # observed, never one of our ranks to stop


def test_several_api_servers_share_one_socket() -> None:
    procs = [
        raw(1, 0, "/sbin/init"),
        raw(500, 1, "vllm", "serve", "m", "--api-server-count", "2"),
        raw(501, 500, "VLLM::APIServer_0"),
        raw(502, 500, "VLLM::APIServer_1"),
        raw(503, 500, "VLLM::EngineCore_DP0"),
        raw(504, 500, "VLLM::DPCoordinator"),
        raw(505, 503, "VLLM::Worker_DP0_PP0_TP0"),
    ]
    found = select_pids({p.pid: p for p in procs}, {8000: frozenset({500, 501, 502})}, VLLM, 8000)
    assert set(found.pids) == {500, 501, 502, 503, 504, 505}
    assert found.pids[:3] == (503, 505, 504)


def test_an_unreadable_socket_table_falls_back_to_titles_and_says_so() -> None:
    found = select_pids({p.pid: p for p in HOST}, None, VLLM, port=8000)
    assert set(found.pids) == {101, 102, 301, 400}
    assert "used titles" in found.notes[0]


@pytest.mark.parametrize("listeners", [LISTENERS, {}, {9000: frozenset()}])
def test_nothing_on_the_port_finds_nothing(listeners: Mapping[int, frozenset[int]]) -> None:
    # Another engine's processes must not stand in for a wrong URL's, even on a host where no
    # socket's owner is visible (seen in CI: a bound, never-listening port, and another test's
    # real vLLM taken by its title).
    found = select_pids({p.pid: p for p in HOST}, listeners, VLLM, port=8001)
    assert found.pids == () and "nothing listens on port 8001" in found.notes[0]


def test_a_hidden_listener_is_not_guessed_among_several_engines() -> None:
    # Another user's engine: its socket is seen, not its owner. Three engines match the titles
    # (100's and 300's cores, the orphan); which one serves the URL cannot be told.
    found = select_pids({p.pid: p for p in HOST}, {8000: frozenset()}, VLLM, port=8000)
    assert found.pids == ()
    assert "not visible (another user or PID namespace), and 3 engines" in found.notes[0]


def test_a_hidden_listener_of_the_only_engine_is_found_by_title() -> None:
    """A sidecar of another UID in the engine's pod (shared PID namespace): the one engine's
    processes, data-parallel cores under one API server included, and nothing else."""
    procs = [
        raw(1, 0, "/pause"),
        raw(7, 1, *API.split()),
        raw(8, 7, "VLLM::EngineCore_DP0"),
        raw(9, 7, "VLLM::EngineCore_DP1"),
        raw(10, 8, "VLLM::Worker_DP0_TP0"),
        raw(30, 1, "engine-watchdog", "watch"),
    ]
    found = select_pids({p.pid: p for p in procs}, {8000: frozenset()}, VLLM, port=8000)
    assert set(found.pids) == {8, 9, 10}
    assert "its engine found by title" in found.notes[0]


def test_without_a_port_every_title_match_counts() -> None:
    assert set(select_pids({p.pid: p for p in HOST}, {}, VLLM).pids) == {101, 102, 301, 400}


def test_explicit_pids_take_descendants() -> None:
    found = select_pids({p.pid: p for p in HOST}, LISTENERS, VLLM, explicit=[101, 200])
    assert set(found.pids) == {101, 102, 200}


# TGI: the launcher starts the router (the HTTP server) and one Python shard per rank as
# siblings; another launcher on the same node runs a second model.
TGI_HOST = [
    raw(1, 0, "/sbin/init"),
    raw(10, 1, "text-generation-launcher", "--model-id", "m", "--num-shard", "2"),
    raw(11, 10, "/opt/conda/bin/python", "text-generation-server", "serve", "m", "--uds-path"),
    raw(12, 10, "/opt/conda/bin/python", "text-generation-server", "serve", "m", "--rank", "1"),
    raw(13, 10, "text-generation-router", "--port", "80"),
    raw(14, 11, "/opt/conda/bin/python", "-c", "from multiprocessing.spawn import spawn_main"),
    raw(20, 1, "text-generation-launcher", "--model-id", "other", "--port", "81"),
    raw(21, 20, "/opt/conda/bin/python", "text-generation-server", "serve", "other"),
    raw(23, 20, "text-generation-router", "--port", "81"),
]


def test_tgi_shards_are_found_through_their_launcher_but_not_the_launcher() -> None:
    procs = {p.pid: p for p in TGI_HOST}
    found = select_pids(procs, {80: frozenset({13}), 81: frozenset({23})}, TGI, port=80)
    assert set(found.pids) == {11, 12, 13, 14}  # shards (and their helpers) and the router
    assert found.pids[:2] == (11, 12) and found.listening == {13}  # engine cores first


def test_siblings_are_not_taken_without_a_launcher_marker() -> None:
    procs = {p.pid: p for p in TGI_HOST}
    found = select_pids(procs, {80: frozenset({13})}, VLLM, port=80)
    assert set(found.pids) == {13}


@pytest.mark.parametrize(
    ("title", "listening", "role"),
    [
        ("VLLM::EngineCore", False, "engine-core"),
        ("VLLM::EngineCore_DP3", False, "engine-core"),
        ("VLLM::Worker_TP0", False, "worker"),
        ("VLLM::Worker_DP0_PP1_TP0", False, "worker"),
        ("VLLM::DPCoordinator", False, "dp-coordinator"),
        ("VLLM::APIServer_0", False, "api-server"),
        (API, False, "api-server"),
        ("python -m engine_watchdog.sim", True, "api-server"),
        ("python train.py", False, "other"),
        ("", False, "other"),
    ],
)
def test_classify_role(title: str, listening: bool, role: str) -> None:
    assert classify_role(title, VLLM, listening) == role


@pytest.mark.parametrize(
    ("engine", "title", "listening", "role"),
    [
        # One process is the server and the engine: the restart rung must find an engine core.
        ("llamacpp", "/usr/bin/llama-server -m model.gguf --metrics --port 8080", True,
         "engine-core"),
        ("trtllm", "/usr/bin/python3 -m mpi4py.futures.server", False, "engine-core"),
        ("trtllm", "/usr/bin/python3 /usr/local/bin/trtllm-serve model --port 8000", True,
         "api-server"),
        ("sglang", "sglang::scheduler_DP0_PP1_TP2_EP0", False, "engine-core"),
        ("sglang", "sglang::scheduler", False, "engine-core"),
        ("tgi", "text-generation-launcher --model-id m", False, "other"),
    ],
)  # fmt: skip
def test_classify_role_of_other_engines(
    engine: str, title: str, listening: bool, role: str
) -> None:
    assert classify_role(title, PROFILES[engine], listening) == role


@pytest.mark.parametrize(
    ("status", "state"),
    [
        ("running", "running"),
        ("sleeping", "sleeping"),
        ("idle", "sleeping"),
        ("disk-sleep", "disk-wait"),
        ("stopped", "stopped"),
        ("tracing-stop", "stopped"),
        ("zombie", "zombie"),
        ("dead", "zombie"),
        ("gone", "gone"),
        ("parked", "sleeping"),
    ],
)
def test_normalise_state(status: str, state: str) -> None:
    assert normalise_state(status) == state


def test_title_joins_argv_and_drops_padding() -> None:
    assert title_of(["VLLM::EngineCore", "", ""]) == "VLLM::EngineCore"
    assert len(title_of(["x" * 1000])) == 256


@pytest.mark.parametrize(
    ("url", "port"),
    [("http://127.0.0.1:8000", 8000), ("http://localhost", 80), ("https://h/v1", 443)],
)
def test_url_port(url: str, port: int) -> None:
    assert url_port(url) == port


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "ftp://h:1", "http://:80", "nonsense"])
def test_url_port_rejects(url: str) -> None:
    with pytest.raises(ValueError):
        url_port(url)


def fake_proc(root: Path, pid: int, status: str) -> None:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "status").write_text(status)


def test_ns_pid_from_nspid(tmp_path: Path) -> None:
    fake_proc(tmp_path, 4242, "Name:\tpython\nNSpid:\t4242\t7\n")
    fake_proc(tmp_path, 51, "Name:\tpython\nNSpid:\t51\n")
    fake_proc(tmp_path, 52, "Name:\tpython\n")  # old kernels: no NSpid line
    assert read_ns_pid(4242, tmp_path) == 7
    assert read_ns_pid(51, tmp_path) is None
    assert read_ns_pid(52, tmp_path) is None
    assert read_ns_pid(99, tmp_path) is None


def test_sample_procs_reads_state_cpu_and_ns_pid(tmp_path: Path) -> None:
    fake_proc(tmp_path, 101, "NSpid:\t101\t12\n")
    obs = sample_procs(
        "http://127.0.0.1:8000",
        table=FakeTable(HOST, LISTENERS),
        proc_root=tmp_path,
        clock=lambda: 5.0,
    )
    assert obs.t == 5.0
    by_pid = {p.pid: p for p in obs.procs}
    core = by_pid[101]
    assert (core.role, core.state, core.cpu_s, core.ns_pid, core.ppid) == (
        "engine-core",
        "stopped",
        12.5,
        12,
        100,
    )
    assert by_pid[100].role == "api-server" and by_pid[100].title == API


async def test_sample_procs_async_reports_gone_pids(tmp_path: Path) -> None:
    obs = await sample_procs_async(pids=[102, 999], table=FakeTable(HOST, {}), proc_root=tmp_path)
    states = {p.pid: p.state for p in obs.procs}
    assert states == {102: "sleeping", 999: "gone"}


@pytest.mark.parametrize(
    ("address", "host", "served"),
    [
        ("0.0.0.0", "127.0.0.1", True),
        ("::", "127.0.0.1", True),
        ("127.0.0.1", "127.0.0.1", True),
        ("127.0.0.2", "127.0.0.1", False),
        ("10.0.0.5", "127.0.0.1", False),
        ("::ffff:127.0.0.1", "127.0.0.1", True),
        ("::1", "[::1]", True),
        ("::1", "localhost", True),
        ("10.0.0.5", "localhost", False),
        ("10.0.0.5", "engine.svc", True),  # a name is not resolved: any address may serve it
    ],
)
def test_serves(address: str, host: str, served: bool) -> None:
    assert serves(address, host) is served


def test_a_real_socket_on_the_port_at_another_address_is_not_the_servers() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.2", 0))
        other.listen()
        port = other.getsockname()[1]
        table = PsutilTable()
        assert os.getpid() in (table.listeners("127.0.0.2") or {})[port]
        assert port not in (table.listeners("127.0.0.1") or {})
        found, _ = discover(f"http://127.0.0.1:{port}")
        assert found.pids == () and "nothing listens" in found.notes[0]
        found, _ = discover(f"http://127.0.0.2:{port}")
        assert os.getpid() in found.pids
