"""The signature file's data model: one :class:`Signature` per known hang, made of rules.

Every rule kind reads one thing a bundle holds (docs/known-hangs.md has the file format):

- ``frame``: a thread in a process of a role whose stack holds given frames;
- ``gpu``: the GPU classification (spinning, computing, idle, busy), on any, all, or split GPUs;
- ``gpu_model``: the GPU's model name;
- ``flight_recorder``: the flight recorder's last collective per rank, or a mismatch between ranks;
- ``log``: lines of the engine log;
- ``flag``: a flag on the engine's command line (present, value, minimum);
- ``cmdline``: words anywhere on the command line (the model name, a quantization);
- ``env``: an environment variable of the engine's processes;
- ``version``: the engine's version (or NCCL's: ``component``), found in the bundle, within a
  range;
- ``multi_node``: the engine spans several nodes (any launcher's sign: hangs/topology.py).

A rule with ``negate`` holds when its condition does not. A rule with ``required`` must not be
contradicted for the signature to count at all (docs/known-hangs.md: match and possible match).

The kinds are of two sorts: ``frame``, ``gpu``, ``log`` and ``flight_recorder`` read what the
engine was doing (the hang itself); the others read how it was set up. A signature is named only
when something of the first sort matched.
"""

from __future__ import annotations

from dataclasses import dataclass

FORMAT = "engine-watchdog/hang-signatures"
FORMAT_VERSION = 1
ROLES = ("engine-core", "worker", "api-server", "dp-coordinator", "any")
ENGINES = ("vllm", "sglang", "trtllm", "tgi", "llamacpp", "any")
GPU_STATES = ("spinning", "computing", "idle", "busy")
GPU_SCOPES = ("any", "all", "split")
VERSION_COMPONENTS = ("engine", "nccl")


@dataclass(frozen=True, kw_only=True)
class Rule:
    why: str
    """What the upstream report shows that this rule looks for (shown beside the evidence)."""
    weight: int = 1
    required: bool = False
    negate: bool = False

    @property
    def kind(self) -> str:
        return KIND_OF[type(self)]


@dataclass(frozen=True, kw_only=True)
class FrameRule(Rule):
    role: str = "any"
    frames: tuple[str, ...] = ()
    """Each pattern must match a frame of the same thread: ``func`` (a glob on the function name)
    or ``func@file`` (the file name must contain ``file``)."""
    any_frames: tuple[str, ...] = ()
    """At least one of these patterns must match a frame of that thread too."""
    processes: str = "any"
    """``all``: every process of the role that has stacks has such a thread."""


@dataclass(frozen=True, kw_only=True)
class GpuRule(Rule):
    state: str
    scope: str = "any"
    peer_state: str = "idle"
    """For ``split``: at least one GPU in ``state`` and at least one in ``peer_state``."""


@dataclass(frozen=True, kw_only=True)
class GpuModelRule(Rule):
    names: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class FlightRecorderRule(Rule):
    op: str = ""
    """A fragment of the last collective's name (``all_reduce``); empty for any."""
    state: str = ""
    """The last collective's state (``scheduled``, ``started``, ``completed``); empty for any."""
    mismatch: bool = False
    """The ranks' last collectives differ (name or sequence number)."""


@dataclass(frozen=True, kw_only=True)
class LogRule(Rule):
    any_of: tuple[str, ...] = ()
    all_of: tuple[str, ...] = ()
    none_of: tuple[str, ...] = ()
    min_count: int = 1
    only_with_requests: bool = False
    """The line means a hang only beside requests running or waiting (a line an idle engine
    logs too): with the bundle showing none, the rule does not hold; with nothing telling, it
    is unknown."""


@dataclass(frozen=True, kw_only=True)
class FlagRule(Rule):
    names: tuple[str, ...]
    """Spellings of one flag (``--tensor-parallel-size``, ``-tp``); ``_`` and ``-`` are equal."""
    role: str = "any"
    value_contains: str = ""
    min_value: float | None = None


@dataclass(frozen=True, kw_only=True)
class CmdlineRule(Rule):
    any_of: tuple[str, ...]
    role: str = "any"


@dataclass(frozen=True, kw_only=True)
class EnvRule(Rule):
    name: str
    equals: str | None = None
    """None: the variable is set (to anything)."""
    role: str = "any"


@dataclass(frozen=True, kw_only=True)
class VersionRule(Rule):
    min_version: str = ""
    max_version: str = ""
    component: str = "engine"
    """Whose version: the engine's, or NCCL's (``NCCL version X`` / ``vLLM is using nccl==X``
    in the engine log)."""


@dataclass(frozen=True, kw_only=True)
class MultiNodeRule(Rule):
    """The engine spans several nodes (no fields of its own)."""


KIND_OF: dict[type[Rule], str] = {
    FrameRule: "frame",
    GpuRule: "gpu",
    GpuModelRule: "gpu_model",
    FlightRecorderRule: "flight_recorder",
    LogRule: "log",
    FlagRule: "flag",
    CmdlineRule: "cmdline",
    EnvRule: "env",
    VersionRule: "version",
    MultiNodeRule: "multi_node",
}
SYMPTOM_KINDS = frozenset({"frame", "gpu", "log", "flight_recorder"})
"""Kinds that read what the engine was doing; the rest read its set-up."""
RULE_TYPES: dict[str, type[Rule]] = {kind: cls for cls, kind in KIND_OF.items()}


@dataclass(frozen=True)
class Link:
    ref: str
    """``owner/repo#number``."""
    url: str
    shows: str
    """What that report or PR shows, in a sentence."""


@dataclass(frozen=True)
class Signature:
    id: str
    title: str
    engine: str
    summary: str
    seen_in: tuple[str, ...]
    fixed_in: str
    workaround: str
    links: tuple[Link, ...]
    rules: tuple[Rule, ...]
    not_confirmed: str = ""
    """What the cited reports do not show (or what a claim about them did not hold)."""


@dataclass(frozen=True)
class SignatureSet:
    revision: str
    signatures: tuple[Signature, ...]
    source: str
    """Where the set was read from (a path, or the installed file's name)."""

    def ids(self) -> tuple[str, ...]:
        return tuple(s.id for s in self.signatures)
