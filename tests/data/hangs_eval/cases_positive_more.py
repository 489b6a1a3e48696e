"""More positive cases (see cases_positive.py)."""

from __future__ import annotations

from typing import Any

POSITIVE_MORE: dict[str, dict[str, Any]] = {}

POSITIVE_MORE["pdl-coreweave-188-kimi-gb300"] = {
    "kind": "positive",
    "expect": "flashinfer-trtllm-fp4-moe-pdl-hang",
    "source": ["https://github.com/coreweave/ml-containers/pull/188"],
    "why": "A production hang of dynamo-vllm on GB300 (Kimi-K2.6, flashinfer_trtllm MoE, TP=4), "
    "captured three times: the engine core waits on an RPC while 3-4 TP workers sit in "
    "cuLaunchKernelEx inside flashinfer::trtllm_fp4_block_scale_moe.",
    "taken": [
        "the workers' native frames the description names: cuLaunchKernelEx inside "
        "flashinfer::trtllm_fp4_block_scale_moe (routing/quantization kernels)",
        "the engine core blocked waiting on an RPC response (no frames quoted)",
        "the GPUs: GB300",
    ],
    "left_out": [
        "verbatim dumps, file names and lines (the description summarises them)",
        "the command line and versions (FlashInfer 0.6.14 is the repository's pin, not the "
        "report's capture)",
    ],
    "bundle": {
        "engine": "vllm",
        "procs": [
            {
                "pid": 1 + i,
                "role": "worker",
                "stacks": [
                    {
                        "name": "MainThread",
                        "frames": [
                            "cuLaunchKernelEx",
                            "flashinfer::trtllm_fp4_block_scale_moe",
                        ],
                    }
                ],
            }
            for i in range(3)
        ],
        "gpus": [{"name": "GB300"} for _ in range(4)],
    },
}
