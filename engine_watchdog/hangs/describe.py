"""A rule in a few words, for evidence lists (``frames in engine-core stacks: ...``)."""

from __future__ import annotations

from collections.abc import Callable

from engine_watchdog.hangs.schema import (
    CmdlineRule,
    EnvRule,
    FlagRule,
    FlightRecorderRule,
    FrameRule,
    GpuModelRule,
    GpuRule,
    LogRule,
    MultiNodeRule,
    Rule,
    VersionRule,
)


def describe(rule: Rule, negated: bool | None = None) -> str:
    """The rule in a few words (``frame in engine-core: step_with_batch_queue``)."""
    text = _DESCRIBE[type(rule)](rule)
    neg = rule.negate if negated is None else negated
    return f"not {text}" if neg else text


def _describe_frame(r: FrameRule) -> str:
    parts = list(r.frames) + ([" | ".join(r.any_frames)] if r.any_frames else [])
    scope = "every " if r.processes == "all" else ""
    return f"frames in {scope}{r.role} stacks: {' + '.join(parts)}"


def _describe_gpu(r: GpuRule) -> str:
    if r.scope == "split":
        return f"GPUs split: some {r.state}, some {r.peer_state}"
    return f"{'every' if r.scope == 'all' else 'a'} GPU {r.state}"


def _describe_flag(r: FlagRule) -> str:
    cond = f" containing {r.value_contains!r}" if r.value_contains else ""
    cond += f" >= {r.min_value:g}" if r.min_value is not None else ""
    return f"flag {' / '.join(r.names)}{cond}"


_DESCRIBE: dict[type[Rule], Callable[..., str]] = {
    FrameRule: _describe_frame,
    GpuRule: _describe_gpu,
    GpuModelRule: lambda r: f"GPU model {' / '.join(r.names)}",
    FlightRecorderRule: lambda r: (
        "ranks' last collectives differ"
        if r.mismatch
        else f"last collective {r.op or 'any'} {r.state}".rstrip()
    ),
    LogRule: lambda r: (
        "log line with "
        + " + ".join([" | ".join(r.any_of)] * bool(r.any_of) + list(r.all_of))
        + (f" (at least {r.min_count})" if r.min_count > 1 else "")
        + (" beside requests running or waiting" if r.only_with_requests else "")
    ),
    FlagRule: _describe_flag,
    CmdlineRule: lambda r: f"command line mentions {' / '.join(r.any_of)}",
    EnvRule: lambda r: f"{r.name}={r.equals}" if r.equals is not None else f"{r.name} set",
    MultiNodeRule: lambda r: "several nodes",
    VersionRule: lambda r: (
        f"{'NCCL' if r.component == 'nccl' else 'engine'} version in "
        f"[{r.min_version or '-'}, {r.max_version or '-'}]"
    ),
}
