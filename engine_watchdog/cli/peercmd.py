"""``peer``: a worker node's sidecar where there is no engine API to watch (vLLM's
``--headless`` ranks, Ray workers): the peer endpoint alone, answering the leader."""

from __future__ import annotations

import sys
from typing import Any

import click

from engine_watchdog.cli.option_group import One, Opt, all_consumed
from engine_watchdog.cli.options import PEERS, PY_SPY_OPT
from engine_watchdog.core.settings import ProcessSettings
from engine_watchdog.runtime.loop import run as run_loop

PEER_ENGINE = One(
    Opt(
        "--engine",
        "engine",
        "Engine profile: its process titles find the ranks (without --pid).",
        click.Choice(["vllm", "sglang", "tgi", "llamacpp", "trtllm"]),
    ),
    default="vllm",
)
PEER_PIDS = One(
    Opt(
        "--pid",
        "pids",
        "A rank process (repeatable); default: every process with the engine's titles.",
        int,
        multiple=True,
    ),
    default=(),
)
PEER_PY_SPY = One(PY_SPY_OPT)
PEER_ENGINE_UID = One(
    Opt(
        "--engine-uid",
        "engine_uid",
        "The engine's UID: only its rank processes are stopped on a restart order "
        "[default: the sidecar's own].",
        click.IntRange(min=0),
    )
)


@click.command("peer")
@PEER_ENGINE
@PEER_PIDS
@PEER_PY_SPY
@PEER_ENGINE_UID
@PEERS
def peer_command(**kw: Any) -> None:
    """Answer the group leader's capture orders for this node's ranks (docs/multi-node.md).

    The group comes from --peers or LeaderWorkerSet's environment; the secret from
    --peer-secret-file or ENGINE_WATCHDOG_PEER_SECRET.
    """
    from engine_watchdog.engines import PROFILES
    from engine_watchdog.runtime.peering import run_peer

    profile = PROFILES[PEER_ENGINE.take(kw)]
    pids = tuple(PEER_PIDS.take(kw))
    py_spy = PEER_PY_SPY.take(kw)
    engine_uid = PEER_ENGINE_UID.take(kw)
    peers = PEERS.take(kw)
    all_consumed(kw)
    sys.exit(
        run_loop(run_peer(peers, profile, pids, py_spy, engine_uid), ProcessSettings(listen=None))
    )
