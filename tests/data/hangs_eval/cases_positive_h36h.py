"""Positive cases for two multi-node GB10 signatures that had none: the TP rank divergence around
a collective, and NCCL 2.28.9's cross-node wedge (cases_positive.py says what a case holds)."""

from __future__ import annotations

from typing import Any

POSITIVE_H36H: dict[str, dict[str, Any]] = {}

POSITIVE_H36H["tpdiv-minefield-89-gb10-tp2-allgather"] = {
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

POSITIVE_H36H["nccl2289-vllm-42354-gb10-pip-wheel"] = {
    "kind": "positive",
    "expect": "nccl-2289-cross-node-cudagraph-deadlock",
    "source": ["https://github.com/vllm-project/vllm/issues/42354"],
    "why": "A comment in 'Distributed inference hanging on a 2 node DGX spark cluster with "
    "Mistral 3.5 Medium 128B with TP=2' (vllm-project/vllm#42354, which the catalog does not "
    "cite): on 2x DGX Spark (GB10), vLLM 0.25.1, TP=2 over the mp backend (--nnodes 2, rank 1 "
    "--headless), generation wedged 20-26 min into sustained 4-way load; py-spy put rank 0 in "
    "ncclAllReduce (pynccl_wrapper.py:446) while rank 1's GPU spun at 96 % / ~20 W, and the "
    "NCCL watchdog caught an _ALLGATHER_BASE timeout after 600 s. The pip-bundled NCCL was "
    "2.28.9; replacing it with the DGX-OS system build of the same 2.28.9 fixed it (a clean "
    "60-min soak). The cross-node NCCL 2.28.9 wedge on GB10 that #52504 and #40969 fix by "
    "changing the NCCL binary (to 2.30.4). Unlike #52504, this commenter found --enforce-eager "
    "only lengthened the time to failure: the bundle is the run without it.",
    "taken": [
        "the command lines, from the flags the comment quotes: 'vllm serve' with the model it "
        "names (poolside/Laguna-S-2.1-NVFP4) and --nnodes 2 on both ranks, --headless on "
        "rank 1; --enforce-eager was a later variant, so the wedged run had none",
        "rank 0's frame as quoted: ncclAllReduce (pynccl_wrapper.py:446)",
        "rank 1's GPU: GB10 at 96 % utilisation and ~20 W; rank 0's GPU named with no figures",
        "the watchdog line, as quoted (its wrapped lines joined into one): '[Rank 1] Watchdog "
        "caught collective operation timeout: WorkNCCL(SeqNum=12590, OpType=_ALLGATHER_BASE, "
        "...) ran for 600060 milliseconds before timing out.'",
        "the versions it states: vLLM 0.25.1, NCCL 2.28.9",
    ],
    "left_out": [
        "'RPC call to sample_tokens timed out': this comment does not quote it",
        "the shared-memory broadcast warning: named only in the same commenter's note in "
        "another thread (#41725), not in this one",
        "rank 0's GPU figures, memory utilisation, the power limit",
        "the rest of the command line (TP=2 and the mp backend are prose), the DFlash "
        "speculative-decoding settings",
        "whether CUDA graphs held the wedged collective: the comment does not say",
    ],
    "bundle": {
        "engine": "vllm",
        "procs": [
            {
                "pid": 1,
                "role": "api-server",
                "cmdline": ["vllm", "serve", "poolside/Laguna-S-2.1-NVFP4", "--nnodes", "2"],
            },
            {
                "pid": 2,
                "role": "worker",
                "cmdline": [
                    "vllm",
                    "serve",
                    "poolside/Laguna-S-2.1-NVFP4",
                    "--nnodes",
                    "2",
                    "--headless",
                ],
            },
            {
                "pid": 3,
                "role": "worker",
                "stacks": [
                    {"name": "MainThread", "frames": ["ncclAllReduce (pynccl_wrapper.py:446)"]}
                ],
            },
        ],
        "log": [
            "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12590, "
            "OpType=_ALLGATHER_BASE, NumelIn=1404928, NumelOut=2809856, Timeout(ms)=600000) "
            "ran for 600060 milliseconds before timing out."
        ],
        "gpus": [{"name": "GB10"}, {"name": "GB10", "util": 96.0, "power": 20.0}],
        "versions": {"engine_version": "0.25.1", "nccl_version": "2.28.9"},
    },
}
