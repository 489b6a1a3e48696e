"""``engine-watchdog sim``: a thin click layer over :func:`run_sim`."""

from __future__ import annotations

import os
from typing import Any

import click

from engine_watchdog.sim.api import run_sim
from engine_watchdog.sim.cuda_load import GpuUnavailableError, load_torch
from engine_watchdog.sim.settings import DIALECTS, FAULT_NAMES, SimSettings, SimSettingsError

_D = SimSettings()  # defaults, shown in --help


@click.command(name="sim")
@click.option("--host", default=_D.host, show_default=True, help="Address to bind.")
@click.option("--port", type=int, default=_D.port, show_default=True, help="API server port.")
@click.option("--served-model-name", default=_D.served_model_name, show_default=True)
@click.option(
    "--tokens-per-second",
    type=float,
    default=_D.tokens_per_second,
    show_default=True,
    help="Decode rate of each request (engine steps per second; every step gives one token "
    "to every running request).",
)
@click.option("--max-num-seqs", type=int, default=_D.max_num_seqs, show_default=True)
@click.option(
    "--kv-capacity-tokens",
    type=int,
    default=_D.kv_capacity_tokens,
    show_default=True,
    help="KV-cache size in tokens (also the max model length).",
)
@click.option(
    "--prefill-tokens-per-second",
    type=float,
    default=_D.prefill_tokens_per_second,
    show_default=True,
)
@click.option("--data-parallel-size", type=int, default=_D.data_parallel_size, show_default=True)
@click.option("--enable-scale-out", is_flag=True, help="Serve POST /inference/v1/abort_requests.")
@click.option("--disable-log-stats", is_flag=True, help="No vllm: series, no stats log line.")
@click.option(
    "--log-stats-interval",
    type=float,
    default=_D.log_stats_interval,
    show_default=True,
    envvar="VLLM_LOG_STATS_INTERVAL",
)
@click.option(
    "--preemption/--no-preemption",
    default=_D.preemption,
    show_default=True,
    help="Preempt the newest request when the KV cache is full (else reserve whole requests).",
)
@click.option(
    "--fault",
    type=click.Choice(FAULT_NAMES),
    default=_D.fault,
    show_default=True,
    help="Fault armed at start-up (change it later with POST /sim/fault).",
)
@click.option("--freeze-last-n", type=int, default=_D.freeze_last_n, show_default=True)
@click.option(
    "--long-prefill-seconds", type=float, default=_D.long_prefill_seconds, show_default=True
)
@click.option(
    "--slow-tokens-per-second", type=float, default=_D.slow_tokens_per_second, show_default=True
)
@click.option("--api-freeze-seconds", type=float, default=_D.api_freeze_seconds, show_default=True)
@click.option("--stuck-after-tokens", type=int, default=_D.stuck_after_tokens, show_default=True)
@click.option(
    "--stamp-events", is_flag=True, help='Each streamed chunk carries "sim_t" (benchmarks).'
)
@click.option(
    "--dialect",
    type=click.Choice(DIALECTS),
    default=_D.dialect,
    show_default=True,
    help="Speak this engine's /metrics dialect (names, labels, types); the API stays vLLM's.",
)
@click.option(
    "--gpu",
    is_flag=True,
    default=_D.gpu,
    help="Engine cores compute on CUDA device 0 (PyTorch); the spin fault spins a GPU kernel.",
)
@click.option(
    "--nodes",
    type=int,
    default=0,
    show_default=True,
    help="Multi-node mode: this many node processes of --ranks-per-node rank processes each, "
    "all in one collective; no API server (docs/multi-node.md).",
)
@click.option("--ranks-per-node", type=int, default=2, show_default=True)
@click.option(
    "--rank-fault",
    default="none",
    show_default=True,
    help="Multi-node mode: KIND:RANK, KIND one of rank-stop, rank-skip, rank-dead, gpu-spin.",
)
@click.option("--fault-after-steps", type=int, default=20, show_default=True)
@click.pass_context
def sim_command(ctx: click.Context, /, **options: Any) -> None:
    """Run a vLLM-compatible engine simulator with injectable faults.

    An API process (HTTP, /metrics) and one engine-core child per data-parallel rank, titled
    VLLM::EngineCore like vLLM's. Dev endpoints (/pause, /sleep, /abort_requests...) need
    VLLM_SERVER_DEV_MODE=1, as in vLLM. SIGUSR2 ends an api-freeze.
    """
    group = [options.pop(k) for k in ("nodes", "ranks_per_node", "rank_fault", "fault_after_steps")]
    if group[0]:
        ctx.exit(_run_group(*group))
    dev_mode = os.environ.get("VLLM_SERVER_DEV_MODE", "0").strip().lower() in ("1", "true")
    try:
        settings = SimSettings(dev_mode=dev_mode, **options)
        if settings.gpu:
            load_torch()  # say so now, not from an engine core that fails to start
    except (SimSettingsError, GpuUnavailableError) as exc:
        raise click.UsageError(str(exc)) from exc
    ctx.exit(run_sim(settings))


def _run_group(nodes: int, ranks_per_node: int, rank_fault: str, after: int) -> int:
    from engine_watchdog.sim.multinode import GroupSpec, MultiNodeError
    from engine_watchdog.sim.multinode_group import run_group

    try:
        spec = GroupSpec.parse(nodes, ranks_per_node, rank_fault, after)
    except MultiNodeError as exc:
        raise click.UsageError(str(exc)) from exc
    return run_group(spec)
