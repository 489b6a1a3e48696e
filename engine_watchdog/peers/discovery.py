"""A node's view of its engine group: am I the leader, what is my name, where are the others.

Two sources, both read without I/O (pure functions of what they are given):

- LeaderWorkerSet's environment. LWS sets ``LWS_LEADER_ADDRESS``, ``LWS_GROUP_SIZE`` and
  ``LWS_WORKER_INDEX`` in every container of a group (kubernetes-sigs/lws,
  api/leaderworkerset/v1/leaderworkerset_types.go: ``LwsLeaderAddress``, ``LwsGroupSize``,
  ``LwsWorkerIndex``). The leader's worker index is always 0; worker pods are named
  ``<lws>-<group>-<index>`` after the leader's ``<lws>-<group>``, and their host names share the
  leader's subdomain (the same file's ``SubdomainShared``: ``my-lws-0.my-lws``,
  ``my-lws-0-1.my-lws``). So worker i's address is the leader's with ``-i`` after its first label.
- An explicit list (``--peers host:port,host:port``: Ray, bare metal), the leader first. This
  node is the entry whose host is one of its own names and whose port is its ``--peer-port``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from engine_watchdog.core.settings import SettingsError

Role = Literal["leader", "worker"]

LEADER_VAR = "LWS_LEADER_ADDRESS"
SIZE_VAR = "LWS_GROUP_SIZE"
INDEX_VAR = "LWS_WORKER_INDEX"
MAX_GROUP = 1024
"""More nodes than this in one group is a typo, not a deployment."""


@dataclass(frozen=True)
class Peer:
    """One node's sidecar, as the others reach it."""

    name: str
    """The node's name: its pod name on LWS, ``host:port`` in an explicit list."""
    host: str
    port: int

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class GroupView:
    """What one node knows of its group."""

    role: Role
    me: Peer
    leader: Peer
    peers: tuple[Peer, ...]
    """Every node of the group, the leader first, this node included."""

    @property
    def others(self) -> tuple[Peer, ...]:
        return tuple(p for p in self.peers if p != self.me)


def _int_var(env: Mapping[str, str], name: str, low: int, high: int) -> int:
    raw = env.get(name, "").strip()
    try:
        value = int(raw)
    except ValueError:
        why = f"{name}={raw!r}: not a whole number (LeaderWorkerSet sets it)"
        raise SettingsError(why) from None
    if not low <= value <= high:
        raise SettingsError(f"{name}={value}: must be between {low} and {high}")
    return value


def in_lws(env: Mapping[str, str]) -> bool:
    """LeaderWorkerSet's variables are set (any of them: a partial set is an error later)."""
    return any(name in env for name in (LEADER_VAR, SIZE_VAR, INDEX_VAR))


def from_lws(env: Mapping[str, str], peer_port: int) -> GroupView:
    """The group from LWS's environment; SettingsError naming the variable when it is wrong."""
    leader_address = env.get(LEADER_VAR, "").strip()
    if not leader_address or any(c in leader_address for c in "/: "):
        raise SettingsError(
            f"{LEADER_VAR}={leader_address!r}: not a host name (LeaderWorkerSet sets the "
            "leader pod's DNS name, e.g. my-lws-0.my-lws.default)"
        )
    size = _int_var(env, SIZE_VAR, 1, MAX_GROUP)
    index = _int_var(env, INDEX_VAR, 0, size - 1)
    leader_pod, _, domain = leader_address.partition(".")
    peers = []
    for i in range(size):
        pod = leader_pod if i == 0 else f"{leader_pod}-{i}"
        peers.append(Peer(pod, f"{pod}.{domain}" if domain else pod, peer_port))
    return GroupView("leader" if index == 0 else "worker", peers[index], peers[0], tuple(peers))


def parse_peer(text: str, flag: str = "--peers") -> Peer:
    """``host:port`` (``[v6]:port``) -> Peer named as written."""
    host, sep, port_text = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise SettingsError(f"{flag}: {text.strip()!r} is not HOST:PORT (e.g. 10.0.0.2:9401)")
    return Peer(text.strip(), host, int(port_text))


def from_peers(
    entries: Sequence[str], own_names: Collection[str], peer_port: int, flag: str = "--peers"
) -> GroupView:
    """The group from an explicit list, the leader first; this node is the entry whose host is
    one of ``own_names`` (host name, FQDN, addresses) on ``peer_port``."""
    peers = tuple(parse_peer(e, flag) for e in entries if e.strip())
    if not peers:
        raise SettingsError(f"{flag}: empty; give HOST:PORT,HOST:PORT with the leader first")
    if len({p.address for p in peers}) != len(peers):
        raise SettingsError(f"{flag}: a node is listed twice")
    mine = [p for p in peers if p.host in own_names and p.port == peer_port]
    if len(mine) != 1:
        raise SettingsError(
            f"{flag}: this node ({', '.join(sorted(own_names)[:4])} on --peer-port {peer_port}) "
            f"is {'not in' if not mine else 'more than once in'} the list: name it there once"
        )
    me = mine[0]
    return GroupView("leader" if me == peers[0] else "worker", me, peers[0], peers)


def group_view(
    env: Mapping[str, str], entries: Sequence[str], own_names: Collection[str], peer_port: int
) -> GroupView | None:
    """``--peers`` when given, else LWS's environment, else None (a single node)."""
    if entries:
        return from_peers(entries, own_names, peer_port)
    if in_lws(env):
        return from_lws(env, peer_port)
    return None
