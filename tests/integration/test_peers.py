"""The peer layer for real: sidecars' peer endpoints on loopback ports with a shared secret,
real sleeping processes as the ranks, the real py-spy. The leader's fan-out puts every node's
report into one bundle, with the flight-recorder dump of a rank that serves PyTorch's pipe; a
node that accepts and says nothing is named and the bundle is still written within the deadline;
a wrong or missing secret is refused and captures nothing; the secret is in no file written."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from engine_watchdog.capture.bundle import BundleSettings, write_bundle
from engine_watchdog.core.model import ProcInfo
from engine_watchdog.core.ranks import RankState
from engine_watchdog.core.serving import PeerSettings
from engine_watchdog.core.settings import CaptureSettings, Secret
from engine_watchdog.host.tools import resolve_tools
from engine_watchdog.peers.auth import SECRET_VAR
from engine_watchdog.peers.codec import AnswerError, read_capture
from engine_watchdog.peers.discovery import GroupView, from_peers
from engine_watchdog.peers.endpoint import PeerServer, make_peer_app
from engine_watchdog.peers.fanout import peers_step
from engine_watchdog.peers.node import LocalNode
from engine_watchdog.probes.procs import sample_procs
from engine_watchdog.runtime.peering import start_peering
from engine_watchdog.sim.launcher import free_port

DATA = Path(__file__).resolve().parents[1] / "data" / "capture"
SECRET = "peer-secret-" + "7f3a9c1e5b2d4680aa11"
DEADLINE_S = 5.0
PYSPY = resolve_tools().get("py-spy")

pytestmark = pytest.mark.skipif(not PYSPY, reason="py-spy not installed")


@pytest.fixture(scope="module")
def ranks() -> Iterator[list[subprocess.Popen[str]]]:
    """Three rank processes (RANK 0, 1, 2), each in its own process group, killed at the end."""
    procs: list[subprocess.Popen[str]] = []
    try:
        for rank in range(3):
            p = subprocess.Popen(
                [sys.executable, str(DATA / "blocked_target.py"), "120"],
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,
                env={**os.environ, "RANK": str(rank)},
            )
            procs.append(p)
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready"  # bounded by the script's 0.2 s start
        yield procs
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(30)


@pytest.fixture(scope="module")
def fr_rank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A rank (RANK 3) with the NCCL flight recorder on, serving its pipe; killed at the end."""
    d = tmp_path_factory.mktemp("fr")
    env = {
        **os.environ,
        "RANK": "3",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{d}/nccl_pipe_",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{d}/nccl_trace_rank_",
    }
    p = subprocess.Popen(
        [sys.executable, str(DATA / "fr_rank.py"), "120"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        yield p.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(30)


@dataclass
class Node:
    local: LocalNode
    server: PeerServer
    captures: list[float]
    """When find_procs ran: each capture (or describe) starts with it."""


def _node(name: str, pid: int) -> Node:
    captures: list[float] = []

    async def find_procs() -> tuple[ProcInfo, ...]:
        captures.append(time.monotonic())
        return sample_procs(pids=[pid]).procs

    local = LocalNode(name, find_procs, PYSPY, interval_s=0.3)
    server = PeerServer(make_peer_app(local, Secret(SECRET)), "127.0.0.1", 0)
    return Node(local, server, captures)


@contextlib.contextmanager
def silent_socket() -> Iterator[int]:
    """A listener whose connections the kernel accepts and nobody ever reads or answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


@pytest.fixture
async def group(ranks: list[subprocess.Popen[str]]) -> AsyncIterator[list[Node]]:
    nodes = [_node(f"node-{i}", p.pid) for i, p in enumerate(ranks)]
    try:
        for n in nodes:
            await n.server.start()
        yield nodes
    finally:
        for n in nodes:
            await n.server.stop()


def _view(nodes: list[Node], extra: Sequence[str] = ()) -> GroupView:
    entries = [f"127.0.0.1:{n.server.port}" for n in nodes] + list(extra)
    return from_peers(entries, {"127.0.0.1"}, nodes[0].server.port)


def _bundle_settings(tmp_path: Path) -> BundleSettings:
    return BundleSettings(CaptureSettings(incident_dir=tmp_path / "inc", step_timeout_s=20.0))


async def test_fan_out_collects_every_node_and_names_the_silent_one(
    tmp_path: Path, group: list[Node], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with silent_socket() as port:
        view = _view(group, [f"127.0.0.1:{port}"])
        async with aiohttp.ClientSession() as session:
            step = peers_step(view, group[0].local, session, Secret(SECRET), DEADLINE_S)
            t0 = time.monotonic()
            res = await write_bundle(_bundle_settings(tmp_path), None, [], [], [step])
            elapsed = time.monotonic() - t0
    assert elapsed < DEADLINE_S + 4.0, elapsed
    (peers,) = res.steps
    assert peers.status == "partial"
    nodes = res.path / "nodes"
    for rank, n in enumerate(group):
        doc = json.loads((nodes / f"127.0.0.1_{n.server.port}" / "manifest.json").read_text())
        assert doc["answered"] is True
        (sample,) = doc["ranks"]
        assert sample["rank"] == rank and sample["state"] == RankState.SLEEPING.value
        assert len(sample["stacks"]) == 2  # two py-spy samples, the main thread's frames
        assert any("main (blocked_target.py" in f for f in sample["stacks"][0])
        (stack_file,) = doc["stack_files"]
        text = (nodes / f"127.0.0.1_{n.server.port}" / stack_file).read_text()
        assert "engine_step_blocked_on_lock" in text and "=== sample 2" in text
    silent = json.loads((nodes / f"127.0.0.1_{port}" / "manifest.json").read_text())
    assert silent["answered"] is False and "no answer within" in silent["error"]
    summary = (res.path / "summary.md").read_text()
    assert f"127.0.0.1:{port} DID NOT ANSWER" in summary
    group_doc = json.loads((nodes / "group.json").read_text())
    assert [g["answered"] for g in group_doc["nodes"]] == [True, True, True, False]
    # The answering ranks all wait alike: the one node that said nothing is the low-confidence
    # culprit (core/culprit.py, rule 5).
    culprit = group_doc["culprit"]
    assert (culprit["confidence"], culprit["node"]) == ("low", f"127.0.0.1:{port}"), culprit
    assert "## Culprit" in summary and f"node 127.0.0.1:{port}" in summary
    _assert_secret_nowhere(tmp_path, caplog)


async def test_every_node_is_ordered_at_the_same_moment(tmp_path: Path, group: list[Node]) -> None:
    view = _view(group)
    async with aiohttp.ClientSession() as session:
        step = peers_step(view, group[0].local, session, Secret(SECRET), DEADLINE_S)
        res = await write_bundle(_bundle_settings(tmp_path), None, [], [], [step])
    assert res.steps[0].status == "ok"
    starts = [n.captures[-1] for n in group]
    assert max(starts) - min(starts) < 1.0, starts  # not one after the other (each takes > 0.3 s)


@pytest.mark.parametrize("header", [None, "Bearer wrong-secret-0123456789", f"Basic {SECRET}"])
async def test_without_the_secret_nothing_is_captured(
    group: list[Node], header: str | None, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.DEBUG)
    node = group[1]
    before = len(node.captures)
    headers = {"Authorization": header} if header else {}
    base = f"http://127.0.0.1:{node.server.port}"
    async with aiohttp.ClientSession() as session:
        for method, path in (("POST", "/v1/capture"), ("GET", "/v1/node"), ("POST", "/v1/restart")):
            async with session.request(method, base + path, headers=headers, json={}) as resp:
                assert resp.status == 401
                assert SECRET not in await resp.text()
        # With it: the read-only view answers (and the node had no restart hook: 501).
        good = {"Authorization": f"Bearer {SECRET}"}
        async with session.get(base + "/v1/node", headers=good) as resp:
            assert resp.status == 200
            assert (await resp.json())["ranks"][0]["rank"] == 1
        async with session.post(base + "/v1/restart", headers=good) as resp:
            assert resp.status == 501
        async with session.put(base + "/v1/node", headers=good) as resp:
            assert resp.status == 405  # nothing else is writable
    assert len(node.captures) == before + 1  # the one authorised GET, no capture
    _assert_secret_nowhere(tmp_path, caplog)


async def test_a_wrong_secret_on_the_leader_names_the_refusal(
    tmp_path: Path, group: list[Node]
) -> None:
    view = _view(group[:2])
    async with aiohttp.ClientSession() as session:
        step = peers_step(view, group[0].local, session, Secret("another-secret-abcdefgh"), 5.0)
        res = await write_bundle(_bundle_settings(tmp_path), None, [], [], [step])
    assert "DID NOT ANSWER (401: it refused the secret" in res.steps[0].detail
    assert json.loads((res.path / "nodes" / "group.json").read_text())["nodes"][0]["answered"]


async def test_each_node_ships_its_flight_recorder_dump_into_the_leaders_bundle(
    tmp_path: Path, group: list[Node], fr_rank: int
) -> None:
    fr_node = _node("node-fr", fr_rank)
    await fr_node.server.start()
    try:
        view = _view([group[0], group[1], fr_node])
        async with aiohttp.ClientSession() as session:
            step = peers_step(view, group[0].local, session, Secret(SECRET), 8.0)
            res = await write_bundle(_bundle_settings(tmp_path), None, [], [], [step])
    finally:
        await fr_node.server.stop()
    assert res.steps[0].status == "ok", res.steps[0]
    nodes = res.path / "nodes"
    fr_dir = nodes / f"127.0.0.1_{fr_node.server.port}"
    doc = json.loads((fr_dir / "manifest.json").read_text())
    assert doc["flight_recorder"]["status"] == "ok", doc["flight_recorder"]
    dump = fr_dir / "flight_recorder" / "rank3_nccl_trace_rank_3"
    assert dump.read_bytes().startswith(b"\x80\x02")  # the rank's pickle, byte for byte
    assert "flight_recorder/rank3_nccl_trace_rank_3" in doc["flight_recorder"]["files"]
    index = json.loads((fr_dir / "flight_recorder" / "index.json").read_text())
    assert [(r["rank"], r["trigger"]) for r in index["ranks"]] == [(3, "ok")]
    # A node whose ranks do not enable it says so, and its capture is whole all the same.
    plain_dir = nodes / f"127.0.0.1_{group[1].server.port}"
    plain = json.loads((plain_dir / "manifest.json").read_text())
    assert plain["answered"] is True and len(plain["ranks"][0]["stacks"]) == 2
    assert plain["flight_recorder"]["status"] == "not-available"
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" in plain["flight_recorder"]["detail"]
    assert not (plain_dir / "flight_recorder").exists()
    # The leader's own ranks: its bundle's own flight-recorder step, not a second trigger.
    leader = json.loads((nodes / f"127.0.0.1_{group[0].server.port}" / "manifest.json").read_text())
    assert leader["flight_recorder"]["status"] == "in-bundle"


def _assert_secret_nowhere(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in caplog.text


async def test_restart_runs_the_hook_it_was_built_with(ranks: list[subprocess.Popen[str]]) -> None:
    calls: list[str] = []

    async def stop_ranks() -> dict[str, Any]:
        calls.append("stop")
        if len(calls) > 1:
            raise RuntimeError("SIGTERM refused")
        return {"stopped": [1]}

    local = _node("node-r", ranks[2].pid).local
    server = PeerServer(make_peer_app(local, Secret(SECRET), stop_ranks), "127.0.0.1", 0)
    await server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/v1/restart"
        good = {"Authorization": f"Bearer {SECRET}"}
        async with aiohttp.ClientSession() as session:
            async with session.post(url) as resp:
                assert resp.status == 401 and calls == []
            async with session.post(url, headers=good) as resp:
                assert resp.status == 200
                assert await resp.json() == {"ok": True, "result": {"stopped": [1]}}
            async with session.post(url, headers=good) as resp:
                assert resp.status == 500
                assert (await resp.json())["detail"] == "RuntimeError: SIGTERM refused"
    finally:
        await server.stop()
    assert calls == ["stop", "stop"]


async def test_a_node_answering_garbage_is_named(tmp_path: Path, group: list[Node]) -> None:
    async def garbage(_: web.Request) -> web.Response:
        return web.Response(text="<html>not a capture</html>")

    app = web.Application()
    app.router.add_post("/v1/capture", garbage)
    liar = PeerServer(app, "127.0.0.1", 0)
    await liar.start()
    try:
        view = _view(group[:1], [f"127.0.0.1:{liar.port}"])
        async with aiohttp.ClientSession() as session:
            step = peers_step(view, group[0].local, session, Secret(SECRET), DEADLINE_S)
            res = await write_bundle(_bundle_settings(tmp_path), None, [], [], [step])
    finally:
        await liar.stop()
    assert f"127.0.0.1:{liar.port} DID NOT ANSWER (the answer is not JSON)" in res.steps[0].detail
    doc = json.loads((res.path / "nodes" / f"127.0.0.1_{liar.port}" / "manifest.json").read_text())
    assert doc["answered"] is False and doc["error"] == "the answer is not JSON"


async def test_lws_environment_makes_a_worker_endpoint_and_without_a_secret_none(
    ranks: list[subprocess.Popen[str]], caplog: pytest.LogCaptureFixture
) -> None:
    lws = {"LWS_LEADER_ADDRESS": "vllm-0.vllm.llm", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1"}
    port = free_port()
    settings = PeerSettings(port=port, bind="127.0.0.1")

    async def find() -> tuple[ProcInfo, ...]:
        return sample_procs(pids=[ranks[0].pid]).procs

    async with aiohttp.ClientSession() as session:
        assert await start_peering(settings, session, find, PYSPY, None, env=lws) is None
        assert "no peer secret: watching this node alone" in caplog.text
        env = {**lws, SECRET_VAR: SECRET}
        peering = await start_peering(settings, session, find, PYSPY, None, env=env)
        assert peering is not None
        try:
            assert peering.view.me.name == "vllm-0-1" and peering.view.role == "worker"
            assert peering.capture_steps() == []  # a worker answers, it does not order
            headers = {"Authorization": f"Bearer {SECRET}"}
            async with session.get(f"http://127.0.0.1:{port}/v1/node", headers=headers) as r:
                assert (await r.json())["node"] == "vllm-0-1"
        finally:
            await peering.server.stop()


@pytest.fixture
def stopped_rank() -> Iterator[int]:
    """A rank process stopped with SIGSTOP (state T); continued and killed at the end."""
    proc = subprocess.Popen(
        [sys.executable, str(DATA / "blocked_target.py"), "60"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGSTOP)
        yield proc.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


async def test_a_stopped_rank_is_reported_stopped_with_its_stacks(stopped_rank: int) -> None:
    cap = await _node("node-t", stopped_rank).local.capture(DEADLINE_S)
    (sample,) = cap.report.ranks
    assert sample.state is RankState.STOPPED
    assert sample.stacks and any("main (blocked_target.py" in f for f in sample.stacks[0])
    assert "nonblocking" in next(iter(cap.stacks.values()))  # --native cannot read it


def test_a_flight_recorder_answer_that_is_not_base64_is_refused() -> None:
    doc: dict[str, Any] = {"node": "n", "ranks": [], "stacks": {}, "flight_recorder": None}
    assert read_capture(json.dumps(doc).encode()).flight_recorder is not None  # older sidecar
    doc["flight_recorder"] = {"status": "ok", "detail": "", "files": {"../x": "not base64!"}}
    with pytest.raises(AnswerError, match="not base64"):
        read_capture(json.dumps(doc).encode())
