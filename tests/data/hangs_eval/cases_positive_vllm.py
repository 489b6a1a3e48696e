"""More positive cases: vLLM's V1 admission stall on Gemma 4 (hybrid sliding-window) models
(cases_positive.py says what a case holds)."""

from __future__ import annotations

from typing import Any

POSITIVE_VLLM: dict[str, dict[str, Any]] = {}

POSITIVE_VLLM["swa-vllm-39866-gemma4-5090-admission"] = {
    "kind": "positive",
    "expect": "vllm-swa-admission-head-of-line-stall",
    "source": ["https://github.com/vllm-project/vllm/pull/39866"],
    "why": "A comment in the thread of '[Scheduler] Cap SWA admission budget at sliding_window + "
    "chunk_size' (PR #39866, which the catalog does not cite; the cited PR #40946 names it as "
    "the same root cause as #39734): on one RTX 5090 with RedHatAI/gemma-4-26B-A4B-it-NVFP4 "
    "and --max-model-len 262144, single prompts above about 48K tokens were never admitted "
    "before the patch: 'Running: 0, Waiting: 1, GPU KV cache usage: 0.0%' indefinitely, no GPU "
    "activity, no error, and later small requests timed out behind the stuck one until its "
    "client was killed. The same head-of-line admission stall on another Gemma 4 model and GPU.",
    "taken": [
        "the command line, assembled from the model and the serve flags the comment lists "
        "(--max-model-len 262144 --max-num-batched-tokens 16384 --kv-cache-dtype fp8 "
        "--gpu-memory-utilization 0.92 --max-num-seqs 4 --enable-prefix-caching) behind "
        "'vllm serve', the image's entry point (vllm/vllm-openai:cu130-nightly)",
        "the version the comment names: 0.19.1rc1.dev296+gbcc2306ce",
        "the GPU the comment names (RTX 5090), with no figures",
        "one /metrics point from the state it reports while stalled: 0 running, 1 waiting",
    ],
    "left_out": [
        "the engine log: the comment gives the stall as 'Running: 0, Waiting: 1, GPU KV cache "
        "usage: 0.0%', a shortened form of the stats line rather than a line as vLLM logs it "
        "('Running: 0 reqs, Waiting: 1 reqs'), and quotes no other line of the stall, so the "
        "bundle has no engine.log",
        "GPU figures: 'no GPU activity' is not a figure",
        "stacks: the comment shows none",
        "the KV cache budget it quotes (78,256 tokens; 'Maximum concurrency for 262,144 tokens "
        "per request: 2.15x') as a start-up log line: it is quoted in prose, not as the line",
    ],
    "bundle": {
        "engine": "vllm",
        "procs": [
            {
                "pid": 1,
                "role": "api-server",
                "cmdline": [
                    "vllm",
                    "serve",
                    "RedHatAI/gemma-4-26B-A4B-it-NVFP4",
                    "--max-model-len",
                    "262144",
                    "--max-num-batched-tokens",
                    "16384",
                    "--kv-cache-dtype",
                    "fp8",
                    "--gpu-memory-utilization",
                    "0.92",
                    "--max-num-seqs",
                    "4",
                    "--enable-prefix-caching",
                ],
            }
        ],
        "gpus": [{"name": "RTX 5090"}],
        "versions": {"engine_version": "0.19.1rc1.dev296+gbcc2306ce"},
        "scrapes": [{"running": 0, "waiting": 1}],
    },
}
