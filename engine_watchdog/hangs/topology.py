"""Whether the engine spans several nodes, from what the bundle holds: every launcher's sign, not
only vLLM's ``--nnodes``.

- flags: ``--nnodes N`` (vLLM, SGLang, torchrun) with N >= 2; ``--node-rank`` above 0 (this is
  not the first node); vLLM's ``--headless`` (a node with no API server: the others have it);
  ``--data-parallel-size-local`` below ``--data-parallel-size`` (ranks on other nodes);
  ``--data-parallel-address``, SGLang's ``--dist-init-addr``, torchrun's ``--master-addr`` /
  ``--rdzv-endpoint`` and ``ray start --address`` naming a host that is not this one's loopback;
- environment: LeaderWorkerSet's ``LWS_GROUP_SIZE`` >= 2 or ``LWS_LEADER_ADDRESS``; ``NNODES``,
  ``SLURM_NNODES`` / ``SLURM_JOB_NUM_NODES`` >= 2; ``WORLD_SIZE`` above ``LOCAL_WORLD_SIZE``;
  ``MASTER_ADDR`` or ``RAY_ADDRESS`` naming another host;
- a multi-node bundle's ``nodes/group.json``.

None of them on a command line the bundle holds: one node. No command line and no environment:
unknown. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from engine_watchdog.hangs import cmdline as cl
from engine_watchdog.hangs.view import BundleView

Found = tuple[bool | None, list[tuple[str, str]], str]
"""(several nodes, or None when unknown; (file, detail) evidence; note)."""

_LOCAL = ("localhost", "127.", "::1", "[::1]", "0.0.0.0", "::", "auto", "local")
_ADDRESS_FLAGS = (
    "--data-parallel-address",
    "--dist-init-addr",
    "--master-addr",
    "--master_addr",
    "--rdzv-endpoint",
)


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _remote(address: str) -> bool:
    host = address.strip().strip("'\"")
    if "://" in host:
        host = host.split("://", 1)[1]
    return bool(host) and not any(host.startswith(p) for p in _LOCAL)


def flag_signs(argv: Sequence[str]) -> list[str]:
    """The multi-node signs on one command line, as ``flag value`` texts."""
    out: list[str] = []
    got = dict(reversed(cl.flags(argv)))  # the first spelling of each flag wins
    nnodes = _number(got.get("--nnodes"))
    if nnodes is not None and nnodes >= 2:
        out.append(f"--nnodes {got['--nnodes']}")
    rank = _number(got.get("--node-rank"))
    if rank is not None and rank >= 1:
        out.append(f"--node-rank {got['--node-rank']}")
    if "--headless" in got:
        out.append("--headless")
    size, local = _number(got.get("--data-parallel-size")), None
    for name in ("--data-parallel-size-local", "-dpl"):
        local = local if local is not None else _number(got.get(name))
    if size is not None and local is not None and local < size:
        out.append(f"--data-parallel-size-local {local:g} of --data-parallel-size {size:g}")
    for name in _ADDRESS_FLAGS:
        value = got.get(cl.norm(name))
        if value and _remote(value):
            out.append(f"{cl.norm(name)} {value}")
    if "ray" in argv[:2] and "start" in argv[:3]:
        addr = got.get("--address")
        if addr and _remote(addr):
            out.append(f"ray start --address {addr}")
    return out


def env_signs(env: Mapping[str, str]) -> list[str]:
    out: list[str] = []
    for name in ("LWS_GROUP_SIZE", "NNODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"):
        n = _number(env.get(name))
        if n is not None and n >= 2:
            out.append(f"{name}={env[name]}")
    if env.get("LWS_LEADER_ADDRESS"):
        out.append(f"LWS_LEADER_ADDRESS={env['LWS_LEADER_ADDRESS']}")
    world, local = _number(env.get("WORLD_SIZE")), _number(env.get("LOCAL_WORLD_SIZE"))
    if world is not None and local is not None and world > local:
        out.append(f"WORLD_SIZE={env['WORLD_SIZE']} > LOCAL_WORLD_SIZE={env['LOCAL_WORLD_SIZE']}")
    for name in ("MASTER_ADDR", "RAY_ADDRESS"):
        if env.get(name) and _remote(env[name]):
            out.append(f"{name}={env[name]}")
    return out


def several_nodes(view: BundleView) -> Found:
    evidence: list[tuple[str, str]] = []
    if view.group is not None:
        evidence.append(("nodes/group.json", "a multi-node bundle (every node's answer)"))
    known = False
    for p in view.procs:
        if p.cmdline:
            known = True
            evidence += [
                ("processes.json", f"PID {p.pid} ({p.role}): {s}") for s in flag_signs(p.cmdline)
            ]
        if p.environ:
            known = True
            evidence += [("processes.json", f"PID {p.pid}: {s}") for s in env_signs(p.environ)]
    if evidence:
        return True, evidence, ""
    if not known:
        return None, [], "no command line or environment in processes.json"
    return False, [], "no sign of another node on the command lines or in the environments"
