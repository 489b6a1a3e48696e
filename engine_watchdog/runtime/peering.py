"""Multi-node, assembled: this node's peer endpoint, and on the leader the fan-out step.

Every node of a group runs the peer endpoint (peers/endpoint.py); the leader's capture rung also
runs the fan-out (peers/fanout.py) as one more capture step, so every node's evidence lands in
the leader's one bundle. The supervisor alone decides when: the step runs only when it orders a
capture. ``engine-watchdog peer`` (a worker node without an engine API to watch: vLLM's
``--headless`` ranks, Ray workers) runs the endpoint alone (:func:`run_peer`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from engine_watchdog.capture.step import CaptureStep
from engine_watchdog.core.checks import parse_listen, validate_peers
from engine_watchdog.core.model import Outcome, ProcInfo
from engine_watchdog.core.serving import PeerSettings
from engine_watchdog.core.settings import Secret, SettingsError, WatchSettings
from engine_watchdog.engines.profile import EngineProfile
from engine_watchdog.host.tools import tools_with
from engine_watchdog.peers.auth import SECRET_VAR, load_secret
from engine_watchdog.peers.discovery import GroupView, group_view
from engine_watchdog.peers.endpoint import PeerServer, RestartHook, make_peer_app
from engine_watchdog.peers.fanout import peers_step
from engine_watchdog.peers.group_restart import outcome, stop_group, write_reports
from engine_watchdog.peers.node import FindProcs, LocalNode
from engine_watchdog.peers.node_stop import NodeRestart, shm_root_from
from engine_watchdog.probes.nvml import GpuProbe, load_nvml
from engine_watchdog.probes.procs import sample_procs_async, url_port
from engine_watchdog.recovery.actions import GroupStop
from engine_watchdog.runtime.stopping import MARGIN_S, Stopping

log = logging.getLogger(__name__)


@dataclass
class Peering:
    """This node in its group: the endpoint (listening), and what the leader fans out with."""

    view: GroupView
    secret: Secret
    local: LocalNode
    server: PeerServer
    session: aiohttp.ClientSession
    deadline_s: float
    restart: RestartHook | None = None
    """This node's stop and check (peers/node_stop.py); the leader runs its own in-process."""
    lws: bool = False
    """The group is LeaderWorkerSet's: LWS recreates every pod, no group stop is ordered."""

    def group_stop(self) -> GroupStop | None:
        """The leader's group stop before its own restart (run mode, bare metal with --peers);
        None on a worker, without a hook, and on LWS (RecreateGroupOnPodRestart restarts every
        pod when the leader's engine container restarts, each with an empty /dev/shm)."""
        own = self.restart
        if self.view.role != "leader" or self.lws or own is None:
            return None

        async def stop(bundle: Path | None) -> Outcome:
            stops = await stop_group(self.view, own, self.session, self.secret, self.deadline_s)
            if bundle is not None:
                try:
                    await asyncio.to_thread(write_reports, bundle, stops)
                except OSError as exc:  # the record below still says it all
                    log.warning("node-clean reports not written into %s: %s", bundle, exc)
            return outcome(stops)

        return stop

    def capture_steps(self) -> list[CaptureStep]:
        """The leader's fan-out step; none on a worker (it answers, it does not order)."""
        if self.view.role != "leader":
            return []
        return [peers_step(self.view, self.local, self.session, self.secret, self.deadline_s)]

    async def serve(self) -> None:
        """A named task: the endpoint listens until the task is cancelled."""
        try:
            await asyncio.Event().wait()
        finally:
            await self.server.stop()


def own_names(bind: str) -> set[str]:
    """What this node may be called in --peers: its host names and their addresses."""
    names = {socket.gethostname(), socket.getfqdn()}
    if bind not in ("", "0.0.0.0", "::"):
        names.add(bind)
    for name in list(names):
        try:
            names |= {str(a[4][0]) for a in socket.getaddrinfo(name, None)}
        except OSError:
            continue
    return names


async def start_peering(
    peers: PeerSettings,
    session: aiohttp.ClientSession,
    local_of: FindProcs,
    py_spy: str | None,
    gpu: GpuProbe | None,
    *,
    ports: Mapping[int, str] | None = None,
    engine_uid: int | None = None,
    env: Mapping[str, str] = os.environ,
) -> Peering | None:
    """This node's peering, its endpoint listening; None outside a group. SettingsError (one
    line, naming the flag or variable) for a bad group, a missing secret or a taken port."""
    # Host names and their addresses only for --peers (DNS, off the loop): a single node,
    # the common case, looks nothing up and checks nothing.
    names = await asyncio.to_thread(own_names, peers.bind) if peers.peers else set()
    view = group_view(env, peers.peers, names, peers.port)
    if view is None:
        return None
    if not peers.peers and peers.secret_file is None and not env.get(SECRET_VAR):
        # LWS's variables alone, no secret: a sidecar set up before multi-node keeps working.
        log.warning(
            "in a LeaderWorkerSet group (%s of %d) but no peer secret: watching this node "
            "alone; give --peer-secret-file to capture every node (docs/multi-node.md)",
            view.me.name,
            len(view.peers),
        )
        return None
    validate_peers(peers, dict(ports or {}))
    secret = load_secret(peers.secret_file, env)
    local = LocalNode(view.me.name, local_of, tools_with(py_spy).get("py-spy"), gpu)
    restart = node_restart(local_of, engine_uid, env)
    server = PeerServer(make_peer_app(local, secret, restart), peers.bind, peers.port)
    try:
        await server.start()
    except OSError as exc:
        raise SettingsError(
            f"--peer-port {peers.port} on {peers.bind}: {exc.strerror or exc}; give a free port"
        ) from None
    try:  # the ranks' numbers read now, while they live (a rank that dies is still named)
        await local.describe()
    except Exception as exc:  # an engine not started yet: read at the first order instead
        log.debug("ranks not read at start: %r", exc)
    lws = not peers.peers
    return Peering(view, secret, local, server, session, peers.deadline_s, restart, lws)


def node_restart(
    local_of: FindProcs, engine_uid: int | None, env: Mapping[str, str]
) -> RestartHook:
    """This node's restart hook: its ranks (those a capture samples) of the engine's UID
    (--engine-uid, else ours) stopped, then the node checked with the NVML module."""
    uid = os.getuid() if engine_uid is None else engine_uid
    return NodeRestart(local_of, uid, load_nvml(), shm_root_from(env))


async def target_peering(
    settings: WatchSettings,
    session: aiohttp.ClientSession,
    find_procs: FindProcs,
    gpu: GpuProbe | None,
    guard_listen: str | None,
) -> Peering | None:
    """A watched target's peering (``watch``, ``run``, ``guard``): its ranks are the watched
    engine's processes (``find_procs``), and neither the engine's port nor the guard's is the
    peer port."""
    ports = {url_port(settings.connect_url or settings.url): "the engine's URL"}
    if guard_listen:
        ports[parse_listen(guard_listen, "--guard-listen")[1]] = "--guard-listen"
    uid, py_spy = settings.recovery.engine_uid, settings.capture.py_spy
    return await start_peering(
        settings.peers, session, find_procs, py_spy, gpu, ports=ports, engine_uid=uid
    )


async def run_peer(
    peers: PeerSettings,
    profile: EngineProfile,
    pids: tuple[int, ...],
    py_spy: str | None,
    engine_uid: int | None = None,
) -> int:
    """``engine-watchdog peer``: the endpoint alone, until SIGTERM or SIGINT (exit 0). Its
    restart order stops and checks this node; the engine is started again by whatever runs it
    (the kubelet, systemd, a Slurm script), never by the sidecar."""
    stopping = Stopping(MARGIN_S)
    stopping.install()

    async def find() -> tuple[ProcInfo, ...]:
        return (await sample_procs_async(None, pids, profile=profile)).procs

    load_secret(peers.secret_file, os.environ)  # a worker without the secret is no use: say so
    gpu = GpuProbe(load_nvml())
    try:
        async with aiohttp.ClientSession() as session:
            peering = await start_peering(peers, session, find, py_spy, gpu, engine_uid=engine_uid)
            if peering is None:
                raise SettingsError(
                    "peer: not in a group; give --peers HOST:PORT,... or run it under "
                    "LeaderWorkerSet (LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX)"
                )
            print(
                f"engine-watchdog peer: {peering.view.me.name} ({peering.view.role}) on "
                f"{peers.bind}:{peering.server.port}",
                flush=True,
            )
            try:
                await stopping.event.wait()
            finally:
                await peering.server.stop()
    finally:
        gpu.close()
        stopping.done()
    return 0
