"""A positive case for a multi-node GB10 signature that had none: the TP rank divergence around
a collective (cases_positive.py says what a case holds)."""

from __future__ import annotations

from typing import Any

POSITIVE_MULTINODE: dict[str, dict[str, Any]] = {}

POSITIVE_MULTINODE["tpdiv-minefield-89-gb10-tp2-allgather"] = {
    "kind": "positive",
    "expect": "vllm-tp-collective-divergence",
    "source": ["https://github.com/Blackwellboy/model-serving-minefield/issues/89"],
    "why": "'Two-box TP=2 dies 20 minutes into sustained load: one rank stuck in a collective the "
    "other never entered' (Blackwellboy/model-serving-minefield#89, which the catalog does not "
    "cite): a vLLM serve with TP=2 across two DGX Spark nodes (GB10) passes bring-up and light "
    "traffic, then dies 15 to 25 minutes into sustained load. Two py-spy passes on both ranks, "
    "50 seconds apart and frame-identical, put one rank inside ncclAllGather and the other in "
    "the local op just before it (fused_add_rms_norm): 'rank divergence around a collective, "
    "not a fabric fault', symmetric as to which box ends up stuck. The head logs shared-memory "
    "broadcast stall warnings, then 'RPC call to sample_tokens timed out' and EngineDeadError; "
    "SM utilisation looks busy and RDMA error counters stay at zero. The same multi-node TP "
    "hang as #46097 and the RFC #48720: one rank in a collective its peer never issues.",
    "taken": [
        "the frames the description names, one per rank, without file or line (it gives "
        "none): ncclAllGather on one rank, fused_add_rms_norm on the other",
        "the log text it quotes verbatim: 'RPC call to sample_tokens timed out' and "
        "'EngineDeadError' (each a quoted fragment, written as its own line)",
        "the GPUs: two GB10 (one per node), with no figures",
    ],
    "left_out": [
        "the shared-memory broadcast warnings: the description names them in prose and "
        "quotes no line",
        "GPU figures: 'SM utilisation looks busy' is not a figure, so no GPU state can be computed",
        "the command lines and the launcher's variables (TP=2 across two nodes is prose), so "
        "the bundle shows no multi-node sign",
        "versions, the model, and which build fixed it: the parts of the thread read name "
        "'the engine build' only",
        "a flight-recorder dump: none is quoted",
    ],
    "bundle": {
        "engine": "vllm",
        "procs": [
            {
                "pid": 1,
                "role": "worker",
                "stacks": [{"name": "MainThread", "frames": ["ncclAllGather"]}],
            },
            {
                "pid": 2,
                "role": "worker",
                "stacks": [{"name": "MainThread", "frames": ["fused_add_rms_norm"]}],
            },
        ],
        "log": ["RPC call to sample_tokens timed out", "EngineDeadError"],
        "gpus": [{"name": "GB10"} for _ in range(2)],
    },
}
