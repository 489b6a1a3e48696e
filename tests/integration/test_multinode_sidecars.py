"""The multi-node sidecars against a real cross-process collective hang: two torch gloo ranks,
each in a pod of its own (own network and PID namespace, the engine's UID;
tests/tools/gloo_group.py), and the watchdog in each pod as the deployment runs it.

- Rank 0 is the "engine" as vLLM's API server is for a group: it serves a vLLM-shaped
  /metrics on 0.0.0.0:8000 in its pod (tests/tools/gloo_rank.py), its token counter moving
  one per completed all_reduce. Every rank is titled ``VLLM::Worker_TP<rank>``.
- Pod 0 runs the leader, ``engine-watchdog watch http://127.0.0.1:8000 --peers ...``, which
  finds rank 0 by its port; pod 1 runs ``engine-watchdog peer --pid <rank 1 in its pod>``.
  Both as the engine's UID with CAP_SYS_PTRACE only, as the manifests grant.
- First four pods, a sidecar in each: rank 2 held out of the collective. Then one 2-rank group
  for every fault, in order (each test leaves it stepping again): SIGSTOP of rank 1, rank 1
  held out of the collective, SIGSTOP of rank 0 (on the leader's own node). For each: the
  leader says stalled, its one bundle holds every node's real py-spy stacks, and the culprit
  it names is the right node and rank. Last: the group restart, the leader's ladder now
  ``capture,restart``: rank 1 stopped, then every node stops its ranks and checks itself
  clean (each pod its own shm folder, ``ENGINE_WATCHDOG_SHM_ROOT`` of its sidecar), and
  nothing of the group is left.

Timings (fault -> verdict, -> bundle, -> clean group restart) are printed; docs/multi-node.md
records them.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from engine_watchdog.peers.node_stop import SHM_ROOT_VAR
from tests.integration.test_multinode_gloo import PYTHON, _missing, running
from tests.tools.cli import CONSOLE_SCRIPT
from tests.tools.gloo_group import ENGINE_UID, GlooGroup, namespaces_left
from tests.tools.pod import Container
from tests.waiting import eventually

pytestmark = pytest.mark.skipif(bool(_missing()), reason=str(_missing()))

SECRET = "gloo-peer-secret-" + "5eed0123456789ab"
PEER_PORT = 9401
API_PORT = 8000
VERDICT_S = 40.0
BUNDLE_S = 40.0
RESTART_S = 30.0
CAPS = ("sys_ptrace",)
"""What the manifests grant the sidecars, nothing more."""
TIMINGS: list[str] = []


@dataclass
class Cluster:
    group: GlooGroup
    leader: Container
    workers: list[Container]
    incidents: Path
    peers: list[str]
    secret: Path
    seen: set[Path] = field(default_factory=set)
    """Bundles already looked at: each fault's is the one new after it."""


def private_dir(parent: Path, name: str) -> Path:
    path = parent / name
    path.mkdir(mode=0o700)
    os.chown(path, ENGINE_UID, ENGINE_UID)
    return path


def peer_args(group: GlooGroup, i: int, secret: Path) -> list[str]:
    peers = ",".join(f"{r.address}:{PEER_PORT}" for r in group.ranks)
    return [
        "--peers", peers, "--peer-port", str(PEER_PORT),
        "--peer-bind", group.ranks[i].address, "--peer-secret-file", str(secret),
    ]  # fmt: skip


def leader_argv(
    group: GlooGroup, incidents: Path, secret: Path, actions: str = "capture"
) -> list[str]:
    """The leader as a deployment runs it, with bounds a test can wait on: stalled after 3 s
    without a token while a request runs; no canary (rank 0 serves /metrics alone)."""
    return [
        str(CONSOLE_SCRIPT), "watch", f"http://127.0.0.1:{API_PORT}", "--engine", "vllm",
        "--json", "--listen", "", "--no-gpu", "--no-canary", "--action", actions,
        "--interval", "0.5", "--stall-seconds", "3", "--suspect-seconds", "1",
        "--startup-grace", "1", "--scrape-timeout", "2", "--peer-deadline", "12",
        "--incident-dir", str(incidents), *peer_args(group, 0, secret),
    ]  # fmt: skip


def sidecar_env(group: GlooGroup, i: int, incidents: Path) -> dict[str, str]:
    """A sidecar's environment: its node's clean looks where its pod's ranks make their
    segments (each pod its own folder, as each node its own /dev/shm)."""
    shm = str(group.ranks[i].shm_root)
    return {"PATH": os.environ["PATH"], "HOME": str(incidents), SHM_ROOT_VAR: shm}


@contextlib.contextmanager
def sidecar_cluster(world: int) -> Iterator[Cluster]:
    """``world`` gloo ranks in pods; the leader's watch in pod 0, a peer in every other pod.
    Leaving it stops everything; nothing of the group may be left."""
    watchdog_python = Path(CONSOLE_SCRIPT).with_name("python")
    with GlooGroup(
        world, Path(tempfile.gettempdir()), PYTHON, reachable=(watchdog_python,),
        title="VLLM::Worker_TP{rank}", metrics_port=API_PORT, shm_per_pod=True,
    ) as group:  # fmt: skip
        group.wait_stepping()
        secret = private_dir(group.workdir, "secret") / "secret"  # as a Secret's volume
        secret.write_text(SECRET + "\n")
        os.chown(secret, ENGINE_UID, ENGINE_UID)
        incidents = private_dir(group.workdir, "incidents")
        workers = [
            group.run(i, "peer", [str(CONSOLE_SCRIPT), "peer", "--pid", str(rank.pod_pid),
                                  *peer_args(group, i, secret)], ENGINE_UID,
                      env=sidecar_env(group, i, incidents), caps=CAPS)
            for i, rank in enumerate(group.ranks) if i > 0
        ]  # fmt: skip
        leader = group.run(0, "watchdog", leader_argv(group, incidents, secret), ENGINE_UID,
                           env=sidecar_env(group, 0, incidents), caps=CAPS)  # fmt: skip
        peers = [f"{r.address}:{PEER_PORT}" for r in group.ranks]
        ranks = [psutil.Process(r.host_pid) for r in group.ranks]
        ranks += [p for c in (leader, *workers) for p in c.processes()]  # the sidecars too
        yield Cluster(group, leader, workers, incidents, peers, secret)
    assert namespaces_left(group.tag) == [], "a namespace outlived its group"
    assert not [p for p in ranks if running(p)], "a rank or a sidecar outlived its group"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with sidecar_cluster(2) as started:
        yield started
    print("\n[gloo sidecars] " + " | ".join(TIMINGS))


def states(container: Container) -> list[dict[str, Any]]:
    """The leader's state transitions (--json: one object a line)."""
    out = []
    for line in container.log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            doc = json.loads(line)
            if "state" in doc and doc.get("event", "transition") == "transition":
                out.append(doc)
    return out


async def next_state(c: Cluster, state: str, after: int, timeout: float) -> int:
    """Index of the leader's first ``state`` transition past ``after``."""

    def found() -> int | None:
        assert c.leader.proc.poll() is None, c.leader.log_tail()
        docs = states(c.leader)
        return next((i + 1 for i in range(after, len(docs)) if docs[i]["state"] == state), None)

    index: int = await eventually(found, timeout, interval=0.1, what=f"leader {state}")
    return index - 1


async def stepping(c: Cluster) -> int:
    """The group steps again and the leader says so: the index of its last transition."""

    def peers_up() -> bool:
        return all(b"(worker) on" in w.log.read_bytes() for w in c.workers)

    await eventually(peers_up, 30, what="every peer up")
    steps = c.group.steps()
    await eventually(lambda: min(c.group.steps()) > min(steps), 30, what="the group stepping")
    docs = states(c.leader)
    if not docs or docs[-1]["state"] != "progressing":
        return await next_state(c, "progressing", len(docs) - 1 if docs else 0, VERDICT_S)
    return len(docs) - 1


async def new_bundle(c: Cluster) -> Path:
    def done() -> Path | None:
        fresh = [p.parent.parent for p in c.incidents.glob("2*/nodes/group.json")]
        fresh = [p for p in fresh if p not in c.seen]
        return fresh[0] if fresh else None

    bundle: Path = await eventually(done, BUNDLE_S, interval=0.1, what="the bundle")
    c.seen.add(bundle)
    return bundle


async def fault_to_bundle(c: Cluster, name: str, fault: Any) -> tuple[dict[str, Any], Path]:
    """Inject ``fault``; the leader's stalled verdict and its new bundle, timed."""
    before = await stepping(c)
    t0 = time.monotonic()
    fault()
    index = await next_state(c, "stalled", before, VERDICT_S)
    verdict_s = time.monotonic() - t0
    bundle = await new_bundle(c)
    bundle_s = time.monotonic() - t0
    group = json.loads((bundle / "nodes/group.json").read_text())
    culprit = group["culprit"]
    cause = states(c.leader)[index]["cause"]
    TIMINGS.append(
        f"{name}: verdict ({cause}) {verdict_s:.1f} s, bundle {bundle_s:.1f} s, culprit "
        f"{culprit['node']} rank {culprit['rank']} ({culprit['rule']}, {culprit['confidence']})"
    )
    return states(c.leader)[index], bundle


def node_manifests(c: Cluster, bundle: Path) -> list[dict[str, Any]]:
    """Each node's manifest, in --peers order; each with its one rank's two real stacks."""
    out = []
    for i, peer in enumerate(c.peers):
        node = bundle / "nodes" / peer.replace(":", "_")
        manifest = json.loads((node / "manifest.json").read_text())
        assert manifest["answered"], manifest
        (sample,) = manifest["ranks"]
        assert sample["rank"] == i and len(sample["stacks"]) == 2, sample
        text = (node / manifest["stack_files"][0]).read_text()
        assert "gloo_rank.py" in text, text  # py-spy's dump of the rank itself
        out.append(manifest)
    return out


def culprit_section(bundle: Path) -> str:
    summary = (bundle / "summary.md").read_text()
    assert summary.splitlines()[2] == "## Culprit", summary[:600]
    return summary.split("## Culprit", 1)[1].split("\n## ", 1)[0]


def no_secret_anywhere(c: Cluster) -> None:
    for path in c.group.workdir.rglob("*"):
        if path.is_file() and path.parent.name != "secret":
            assert SECRET.encode() not in path.read_bytes(), path


def waits_in_all_reduce(manifest: dict[str, Any]) -> bool:
    stacks = manifest["ranks"][0]["stacks"]
    # Native frames (c10d::Work::wait...) come first where py-spy's --native worked.
    return all(any(f.startswith("all_reduce (") for f in s) for s in stacks)


async def test_four_ranks_one_out_of_the_collective() -> None:
    """Four pods, a sidecar in each: rank 2 held out of the collective while ranks 0, 1, 3 wait
    in all_reduce; the culprit is named with high confidence (three others agree)."""
    with sidecar_cluster(4) as c:
        _, bundle = await fault_to_bundle(c, "4 ranks, rank 2 skips", lambda: c.group.skip(2))
        culprit = json.loads((bundle / "nodes/group.json").read_text())["culprit"]
        assert (culprit["node"], culprit["rank"], culprit["rule"], culprit["confidence"]) == (
            c.peers[2], 2, "outside-collective", "high"
        ), culprit  # fmt: skip
        manifests = node_manifests(c, bundle)
        assert all(waits_in_all_reduce(m) for i, m in enumerate(manifests) if i != 2), manifests
        section = culprit_section(bundle)
        assert c.peers[2] in section and "rank 2" in section, section
        c.group.unskip(2)
        no_secret_anywhere(c)
    print("\n[gloo sidecars, 4 ranks] " + TIMINGS[-1])


async def test_rank_1_stopped_is_named_from_the_leaders_bundle(cluster: Cluster) -> None:
    c = cluster
    verdict, bundle = await fault_to_bundle(c, "SIGSTOP rank 1", lambda: c.group.stop(1))
    culprit = json.loads((bundle / "nodes/group.json").read_text())["culprit"]
    assert (culprit["node"], culprit["rank"], culprit["rule"]) == (c.peers[1], 1, "rank-stopped")
    assert culprit["pid"] == c.group.ranks[1].pod_pid  # as its node's sidecar numbers it
    leader, worker = node_manifests(c, bundle)
    assert waits_in_all_reduce(leader), leader
    assert worker["ranks"][0]["state"] == "stopped", worker
    section = culprit_section(bundle)
    assert c.peers[1] in section and "rank 1" in section, section
    assert verdict["state"] == "stalled", verdict
    c.group.resume(1)
    no_secret_anywhere(c)


async def test_rank_1_out_of_the_collective_is_named(cluster: Cluster) -> None:
    c = cluster
    _, bundle = await fault_to_bundle(c, "rank 1 skips", lambda: c.group.skip(1))
    culprit = json.loads((bundle / "nodes/group.json").read_text())["culprit"]
    assert (culprit["node"], culprit["rank"], culprit["rule"]) == (
        c.peers[1], 1, "outside-collective"
    ), culprit  # fmt: skip
    leader, worker = node_manifests(c, bundle)
    assert waits_in_all_reduce(leader), leader
    assert any("skipped_collective" in f for s in worker["ranks"][0]["stacks"] for f in s), worker
    section = culprit_section(bundle)
    assert c.peers[1] in section and "rank 1" in section, section
    c.group.unskip(1)
    no_secret_anywhere(c)


async def test_rank_0_stopped_on_the_leaders_own_node(cluster: Cluster) -> None:
    """The leader's own engine stops: its /metrics with it (rank 0 serves them), and the
    fan-out still captures both nodes; the culprit is on the leader's node."""
    c = cluster
    _, bundle = await fault_to_bundle(c, "SIGSTOP rank 0", lambda: c.group.stop(0))
    culprit = json.loads((bundle / "nodes/group.json").read_text())["culprit"]
    assert (culprit["node"], culprit["rank"], culprit["rule"]) == (c.peers[0], 0, "rank-stopped")
    leader, worker = node_manifests(c, bundle)
    assert leader["ranks"][0]["state"] == "stopped" and waits_in_all_reduce(worker), worker
    c.group.resume(0)
    no_secret_anywhere(c)


def restarting_leader(c: Cluster) -> Container:
    """The leader again, its ladder now ``capture,restart``: the group stays, the capture-only
    leader makes way (its peer port with it)."""
    c.leader.stop()
    argv = leader_argv(c.group, c.incidents, c.secret, actions="capture,restart")
    env = sidecar_env(c.group, 0, c.incidents)
    return c.group.run(0, "watchdog-restart", argv, ENGINE_UID, env=env, caps=CAPS)


def restart_record(c: Cluster) -> dict[str, Any] | None:
    path = c.incidents / "actions.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    done = [json.loads(x) for x in lines if '"restart"' in x]
    return done[0] if done else None


async def test_the_group_restart_leaves_nothing(cluster: Cluster) -> None:
    """Last (it ends the group): rank 1 stopped under a leader whose ladder goes on to
    ``restart``. After the bundle the leader orders every node to stop its ranks and check
    itself clean: both nodes' records say stopped and clean, no rank process and no segment the
    ranks made is left. Nothing starts the group again here: that is whatever runs it."""
    c = cluster
    c.leader = restarting_leader(c)
    ranks = [psutil.Process(r.host_pid) for r in c.group.ranks]
    made = {p for i in range(2) for p in c.group.heartbeat(i)["segments"]}
    fault_at: list[float] = []

    def stop_rank_1() -> None:
        fault_at.append(time.monotonic())
        c.group.stop(1)

    _, bundle = await fault_to_bundle(c, "SIGSTOP rank 1, then restart", stop_rank_1)
    record = await eventually(
        lambda: restart_record(c), RESTART_S, interval=0.1, what="the restart record"
    )
    restart_s = time.monotonic() - fault_at[0]
    detail = record["detail"]
    print(f"\n[gloo sidecars, restart record] {record['result']}: {detail}")
    assert detail.startswith("group stopped and clean: "), detail
    # The leader's own "restart" in watch mode: rank 0 (a worker, no engine core) is ended by
    # its node's stop; whatever runs the engine starts it (nothing here: the test ends it).
    assert record["result"] == "ok", record
    assert detail.endswith("; then engine ended by the group stop; its supervisor restarts it")
    for peer in c.peers:  # one rank a node, its three segments (NCCL, torch, vLLM)
        assert f"{peer}: stopped 1 rank processes, removed 3 files, left 0" in detail, detail
    for peer in c.peers:
        report = json.loads((bundle / "nodes" / peer.replace(":", "_") / "node-clean.json")
                            .read_text())  # fmt: skip
        assert report["answered"] and report["verified"], report
    await eventually(lambda: not [p for p in ranks if running(p)], 15, what="the ranks gone")
    assert len(made) == 6 and [p for p in made if Path(p).exists()] == [], made
    assert [list(r.shm_root.iterdir()) for r in c.group.ranks] == [[], []]
    TIMINGS.append(f"fault -> clean group restart {restart_s:.1f} s, procs left 0, shm left 0")
