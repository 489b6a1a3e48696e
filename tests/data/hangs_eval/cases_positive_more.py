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

POSITIVE_MORE["trtllm-triton-574-h100-busy"] = {
    "kind": "positive",
    "expect": "trtllm-inflight-batcher-stuck-gpu-busy",
    "source": ["https://github.com/triton-inference-server/tensorrtllm_backend/issues/574"],
    "why": "The Triton server with the TensorRT-LLM backend stops processing requests under high "
    "traffic, GPU utilisation stuck at 100 % (2x H100; a commenter sees it on 2x L20): the stall "
    "of #149 a TensorRT-LLM release later.",
    "taken": ["the GPUs: 2x H100, utilisation stuck at 100 %"],
    "left_out": [
        "power, memory utilisation, the server's command line, logs and stacks",
        "the version line ('TensorRT version: 0.10.0.dev2024043000'), which names TensorRT",
    ],
    "bundle": {"engine": "trtllm", "gpus": [{"name": "H100", "util": 100.0} for _ in range(2)]},
}
