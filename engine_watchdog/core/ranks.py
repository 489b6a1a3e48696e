"""What one node says about its engine ranks at an incident, and who the culprit is (pure).

The leader's watchdog fans a capture out to every node's sidecar (engine_watchdog/peers/); each
answers with a NodeReport. core/culprit.py reads the reports and names the node, rank and GPU
that stopped. Plain data: the same reports come from real sidecars, from the simulator's
multi-node mode and from tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class RankState(str, Enum):
    """A rank process's scheduler state, as /proc says it (psutil's status, folded)."""

    RUNNING = "running"
    SLEEPING = "sleeping"
    STOPPED = "stopped"
    ZOMBIE = "zombie"
    DEAD = "dead"
    """Gone: the process the node knew as this rank no longer exists."""


@dataclass(frozen=True)
class RankSample:
    """One engine rank process on one node, sampled at the incident."""

    node: str
    """The node's name (its pod name on Kubernetes, the host name otherwise)."""
    rank: int
    """The global rank (the torch.distributed rank), -1 when the node could not tell."""
    pid: int
    """The process id in the node's own PID namespace."""
    state: RankState
    stacks: tuple[tuple[str, ...], ...] = ()
    """py-spy samples of the rank's main thread, oldest first; each innermost frame first,
    formatted "function (file:line)". Two or more samples let a stack that does not move be
    told from one that does."""
    gpu: int | None = None
    """The index of the GPU the rank holds on its node (NVML compute processes), if any."""
    gpu_util: float | None = None
    """That GPU's utilisation in percent (NVML), None without a GPU."""


@dataclass(frozen=True)
class NodeReport:
    """One node's answer to the leader's capture order."""

    node: str
    answered: bool
    """False when the node's sidecar did not answer within the capture budget."""
    ranks: tuple[RankSample, ...] = ()
    error: str = ""
    """Why the node did not answer (one line), empty when it did."""


class Confidence(str, Enum):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"
    NONE = "none"
    """No culprit could be told from the evidence."""


@dataclass(frozen=True)
class Culprit:
    """The node, rank and GPU that stopped, and why the evidence says so."""

    confidence: Confidence
    why: str
    """One sentence a person reads first in summary.md and report.md."""
    node: str | None = None
    rank: int | None = None
    gpu: int | None = None
    evidence: tuple[str, ...] = field(default=())
    """The facts the judgement rests on, one line each."""
    pid: int | None = None
    """The culprit rank's process id on its node, when a rank is named."""
    rule: str = ""
    """The rule that decided (docs/multi-node.md, "The culprit"): rank-stopped,
    outside-collective, gpu-spin, gpu-idle, stack-unchanged, node-silent or none."""
