"""The simulator's multi-node mode, whole path: rank processes on two "nodes" running a real
collective, each fault injected, real py-spy dumps of every rank, and name_culprit over the
reports. One group per fault, 2 nodes x 2 ranks, seconds each."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from engine_watchdog.capture.pyspy_text import rank_stack
from engine_watchdog.core.collective_frames import collective_wait
from engine_watchdog.core.culprit import name_culprit
from engine_watchdog.core.ranks import Confidence, Culprit, NodeReport, RankSample, RankState
from engine_watchdog.host.tools import resolve_tools
from engine_watchdog.probes.procs import sample_procs_async
from engine_watchdog.sim.multinode import GroupSpec, MultiNodeError
from engine_watchdog.sim.multinode_group import MultiNodeGroup, NodeHandle
from tests.waiting import eventually

PYSPY = resolve_tools().get("py-spy")
pytestmark = pytest.mark.skipif(not PYSPY, reason="py-spy not installed")
AFTER_STEPS = 5


@contextlib.contextmanager
def group(rank_fault: str) -> Iterator[MultiNodeGroup]:
    with MultiNodeGroup(GroupSpec.parse(2, 2, rank_fault, AFTER_STEPS)) as g:
        yield g


def all_ranks(g: MultiNodeGroup) -> list[dict[str, Any]]:
    return [r | {"node": n.name} for n in g.nodes for r in g.ranks(n)["ranks"]]


def dump(pid: int) -> tuple[str, ...]:
    assert PYSPY
    res = subprocess.run(  # --nonblocking: a stopped rank cannot be suspended again
        [PYSPY, "dump", "--nonblocking", "--pid", str(pid)],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    return rank_stack(res.stdout)


async def reports(g: MultiNodeGroup) -> list[NodeReport]:
    """What each node would answer: its ranks' states and GPUs, two py-spy samples each."""
    out = []
    for node in g.nodes:
        ranks = g.ranks(node)["ranks"]
        samples = []
        for r in ranks:
            state = RankState(r["state"])
            stacks: tuple[tuple[str, ...], ...] = ()
            if state is not RankState.DEAD:
                first = await asyncio.to_thread(dump, r["pid"])
                second = await asyncio.to_thread(dump, r["pid"])
                stacks = (first, second)
            samples.append(
                RankSample(node.name, r["rank"], r["pid"], state, stacks, r["gpu"], r["gpu_util"])
            )
        out.append(NodeReport(node.name, True, tuple(samples)))
    return out


async def stuck(g: MultiNodeGroup) -> None:
    """Every rank's steps still for a second (the collective no longer completes)."""
    before = {r["rank"]: r["steps"] for r in all_ranks(g)}
    await asyncio.sleep(0)

    def still() -> bool:
        nonlocal before
        now = {r["rank"]: r["steps"] for r in all_ranks(g)}
        same, before = now == before and min(now.values()) >= 0, now
        return same

    await eventually(still, timeout=15, interval=1.2, what="the group stuck")


async def culprit_of(g: MultiNodeGroup) -> Culprit:
    await stuck(g)
    return name_culprit(await reports(g))


async def test_a_stopped_rank_leaves_the_others_in_all_reduce_and_is_named() -> None:
    with group("rank-stop:1") as g:
        await eventually(
            lambda: all_ranks(g)[1]["state"] == "stopped", timeout=15, what="rank 1 stopped"
        )
        found = await culprit_of(g)
        waits = [collective_wait(r.stacks[-1]) for n in await reports(g) for r in n.ranks]
    assert (found.confidence, found.node, found.rank, found.rule) == (
        Confidence.HIGH,
        "sim-node-0",
        1,
        "rank-stopped",
    )
    assert waits.count("all_reduce") == 3  # ranks 0, 2, 3 wait in the collective


async def test_a_rank_that_skips_the_collective_is_named() -> None:
    with group("rank-skip:2") as g:
        found = await culprit_of(g)
    assert (found.node, found.rank, found.rule) == ("sim-node-1", 2, "outside-collective")
    assert found.confidence is Confidence.HIGH
    assert "work_outside_collective" in found.why


async def test_a_dead_rank_is_reaped_and_named() -> None:
    with group("rank-dead:3") as g:
        await eventually(lambda: all_ranks(g)[3]["state"] == "dead", timeout=15, what="dead")
        found = await culprit_of(g)
    assert (found.node, found.rank, found.gpu, found.rule) == ("sim-node-1", 3, 1, "rank-stopped")
    assert "is dead" in found.why


async def test_a_spinning_gpu_is_named_when_every_stack_is_alike() -> None:
    with group("gpu-spin:0") as g:
        found = await culprit_of(g)
        utils = {r["rank"]: r["gpu_util"] for r in all_ranks(g)}
    assert utils == {0: 100.0, 1: 0.0, 2: 0.0, 3: 0.0}
    assert (found.confidence, found.node, found.rank, found.rule) == (
        Confidence.MEDIUM,
        "sim-node-0",
        0,
        "gpu-spin",
    )


async def test_each_nodes_ranks_are_found_as_vllm_workers_by_the_watchdog() -> None:
    with group("none") as g:
        node: NodeHandle = g.nodes[1]

        async def workers() -> set[str]:
            obs = await sample_procs_async(node.url)
            return {p.title for p in obs.procs if p.role == "worker"}

        # The titles are set once each rank has started (setproctitle).
        await eventually(
            lambda: _equal(workers(), {"VLLM::Worker_TP2", "VLLM::Worker_TP3"}),
            what="node 1's ranks found as vLLM workers",
        )


async def _equal(got: Any, want: set[str]) -> bool:
    return bool(await got == want)


async def test_a_healthy_group_keeps_reducing_with_its_gpus_busy() -> None:
    with group("none") as g:
        first = {r["rank"]: r["steps"] for r in all_ranks(g)}
        await eventually(
            lambda: all(r["steps"] > first[r["rank"]] + 3 for r in all_ranks(g)),
            what="every rank stepping",
        )
        ranks = all_ranks(g)
    assert {r["state"] for r in ranks} <= {"running", "sleeping"}
    assert {r["gpu_util"] for r in ranks} == {50.0}


def test_the_sim_command_prints_each_node_and_refuses_a_bad_fault() -> None:
    with pytest.raises(MultiNodeError, match="name the rank"):
        GroupSpec.parse(2, 2, "rank-stop", 5)
    cmd = [sys.executable, "-m", "engine_watchdog.sim", "--nodes", "2", "--ranks-per-node", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        lines = [json.loads(proc.stdout.readline()) for _ in range(2)]
        assert [(n["node"], n["ranks"]) for n in lines] == [
            ("sim-node-0", [0]),
            ("sim-node-1", [1]),
        ]
    finally:
        proc.terminate()
        try:
            assert proc.wait(10) == 0
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
    bad = subprocess.run(
        [*cmd[:-1], "2", "--rank-fault", "rank-nap:1"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert bad.returncode == 2 and "the kind is one of" in bad.stderr
    assert "Traceback" not in bad.stderr
