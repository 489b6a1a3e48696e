"""Positive cases: reports of a catalog hang that the catalog does not cite (a duplicate, a
follow-up, a comment elsewhere, or a report held out of the catalog's links for this set).

Only what each report shows is here (build.py says where each piece goes); every case's
``taken`` and ``left_out`` become its source.md.
"""

from __future__ import annotations

import shlex
from typing import Any

POSITIVE: dict[str, dict[str, Any]] = {}

POSITIVE["p2p-vllm-14449-rtx-a6000"] = {
    "kind": "positive",
    "expect": "nccl-pcie-p2p-allreduce-spin",
    "source": ["https://github.com/vllm-project/vllm/issues/14449"],
    "why": "Two PCIe workstation GPUs (RTX A6000) hang at 100 % in vLLM's first TP=2 run; the "
    "reporter then tried NCCL_P2P_DISABLE=1 (which moved the failure elsewhere): the P2P spin "
    "the signature describes, on a GPU without GPM.",
    "taken": [
        "the command line in the title: vllm serve Qwen/QwQ-32B-AWQ --tensor-parallel-size 2",
        "the GPUs: two RTX A6000 at max utilization (title)",
    ],
    "left_out": [
        "stacks, engine log, versions, power and memory figures: the report gives none for the "
        "hang itself",
        "the environment: the first run sets no NCCL variable the report shows",
    ],
    "bundle": {
        "engine": "vllm",
        "procs": [
            {
                "pid": 1,
                "role": "api-server",
                "cmdline": ["vllm", "serve", "Qwen/QwQ-32B-AWQ", "--tensor-parallel-size", "2"],
            }
        ],
        "gpus": [{"name": "RTX A6000", "util": 100.0}, {"name": "RTX A6000", "util": 100.0}],
    },
}

POSITIVE["sm12x-vllm-52247-copy-event"] = {
    "kind": "positive",
    "expect": "vllm-sm12x-flashinfer-topk-sampler-hang",
    "source": ["https://github.com/vllm-project/vllm/issues/52247"],
    "why": "The engine core parked in the sampled tokens' copy event after FlashInfer 0.6.13's "
    "RadixTopKMaskLogitsKernel_MultiCTA wedged on SM120: the catalog's sampler hang. Held out "
    "of the signature's links for this set.",
    "taken": [
        "the py-spy stack both model runners park in (V2 runner line): synchronize "
        "(torch/cuda/streams.py:254) <- get_output (vllm/v1/worker/gpu/async_utils.py:50) <- "
        "result (vllm/v1/executor/uniproc_executor.py:38) <- step_with_batch_queue "
        "(vllm/v1/engine/core.py:595), thread 'MainThread', idle",
    ],
    "left_out": [
        "the GPU's model name (the report says SM120), its utilisation and the command line",
        "the engine log",
    ],
    "bundle": {
        "engine": "vllm",
        "procs": [
            {
                "pid": 1,
                "role": "engine-core",
                "stacks": [
                    {
                        "name": "MainThread",
                        "frames": [
                            "synchronize (torch/cuda/streams.py:254)",
                            "get_output (vllm/v1/worker/gpu/async_utils.py:50)",
                            "result (vllm/v1/executor/uniproc_executor.py:38)",
                            "step_with_batch_queue (vllm/v1/engine/core.py:595)",
                        ],
                    }
                ],
            }
        ],
    },
}

POSITIVE["mtp-vllm-41530-dsv4-tp8"] = {
    "kind": "positive",
    "expect": "vllm-mtp-engine-core-waits-on-workers",
    "source": ["https://github.com/vllm-project/vllm/issues/41530"],
    "why": "DeepSeek-V4-Pro with MTP at TP=8: the TP workers hang and the engine core's "
    "sample_tokens RPC times out (EngineDeadError). Held out of the signature's links.",
    "taken": [
        "the serve script: the environment variables it exports and the vllm serve flags "
        "(--enable-expert-parallel, --tensor-parallel-size 8, "
        '--speculative_config \'{"method":"mtp","num_speculative_tokens":1}\' and the rest)',
        "the error the title names: RPC call to sample_tokens timed out (TimeoutError)",
    ],
    "left_out": ["stacks, GPU figures: not in the parts read", "the model path ('xxx/')"],
    "bundle": {
        "engine": "vllm",
        "procs": [
            {
                "pid": 1,
                "role": "api-server",
                "cmdline": shlex.split(
                    "vllm serve '$MODEL_PATH' --trust-remote-code --served-model-name "
                    "deepseek-v4-pro --kv-cache-dtype fp8 --block-size 256 "
                    "--enable-expert-parallel "
                    "--tensor-parallel-size 8 --max-model-len 800000 --max-num-seqs 512 "
                    '--max-num-batched-tokens 512 --compilation-config \'{"mode": 0, '
                    '"cudagraph_mode": "FULL_DECODE_ONLY"}\' --gpu-memory-utilization 0.95 '
                    "--no-enable-flashinfer-autotune --tokenizer-mode deepseek_v4 "
                    "--tool-call-parser deepseek_v4 --enable-auto-tool-choice --reasoning-parser "
                    "deepseek_v4 --speculative_config "
                    '\'{"method":"mtp","num_speculative_tokens":1}\''
                ),
                "environ": {
                    "VLLM_ENGINE_READY_TIMEOUT_S": "3600",
                    "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0",
                    "NCCL_TIMEOUT": "1800000",
                    "NCCL_HEART_BEAT_POLL_MS": "5000",
                    "NCCL_DEBUG": "WARN",
                },
            }
        ],
        "log": ["TimeoutError: RPC call to sample_tokens timed out."],
    },
}

POSITIVE["hicache-sglang-22607-prefetch"] = {
    "kind": "positive",
    "expect": "sglang-hicache-prefetch-allreduce-deadlock",
    "source": ["https://github.com/sgl-project/sglang/issues/22607"],
    "why": "A production report on the HiCache consistency issue (comment by stephen0110, "
    "2026-07-07): TP0 in the prefetch all_reduce while TP1-3 moved on to the next loop "
    "iteration, the mismatched collective of #30760 at another call site.",
    "taken": [
        "sglang 0.5.13.post1; the flags quoted: --tp 4, --enable-hierarchical-cache, "
        "--hicache-storage-backend mooncake, --hicache-storage-prefetch-policy timeout",
        "TP0's py-spy stack: all_reduce (torch/distributed/distributed_c10d.py:3075) <- "
        "_all_reduce_attn_groups (hiradix_cache.py:196) <- can_terminate_prefetch "
        "(hiradix_cache.py:1350) <- check_prefetch_progress (hiradix_cache.py:1373) <- "
        "_get_new_batch_prefill_raw (scheduler.py:2679)",
        "TP1-3's: broadcast (torch/distributed/distributed_c10d.py:2974) <- broadcast_pyobj "
        "(utils/common.py:1437) <- _broadcast_reqs_across_ranks "
        "(scheduler_components/request_receiver.py:187)",
    ],
    "left_out": [
        "the launch command itself (the comment lists the flags; the model is GLM-5.2-FP8 "
        "with EAGLE speculative decoding, whose flags it does not quote)",
        "GPU state and engine log",
    ],
    "bundle": {
        "engine": "sglang",
        "versions": {"engine_version": "0.5.13.post1"},
        "procs": [
            {
                "pid": 1,
                "role": "api-server",
                "cmdline": shlex.split(
                    "--tp 4 --enable-hierarchical-cache --hicache-storage-backend mooncake "
                    "--hicache-storage-prefetch-policy timeout"
                ),
            },
            {
                "pid": 2,
                "role": "engine-core",
                "stacks": [
                    {
                        "name": "TP0",
                        "frames": [
                            "all_reduce (torch/distributed/distributed_c10d.py:3075)",
                            "_all_reduce_attn_groups (hiradix_cache.py:196)",
                            "can_terminate_prefetch (hiradix_cache.py:1350)",
                            "check_prefetch_progress (hiradix_cache.py:1373)",
                            "_get_new_batch_prefill_raw (scheduler.py:2679)",
                        ],
                    }
                ],
            },
            *[
                {
                    "pid": 3 + i,
                    "role": "engine-core",
                    "stacks": [
                        {
                            "name": f"TP{i + 1}",
                            "frames": [
                                "broadcast (torch/distributed/distributed_c10d.py:2974)",
                                "broadcast_pyobj (utils/common.py:1437)",
                                "_broadcast_reqs_across_ranks "
                                "(scheduler_components/request_receiver.py:187)",
                            ],
                        }
                    ],
                }
                for i in range(3)
            ],
        ],
    },
}

POSITIVE["llamacpp-13085-cuda-oom-stuck"] = {
    "kind": "positive",
    "expect": "llamacpp-cuda-error-server-stuck",
    "source": ["https://github.com/ggml-org/llama.cpp/issues/13085"],
    "why": "llama-server stays unresponsive after a CUDA out-of-memory error on the first "
    "request: the stuck-after-CUDA-error state of #13281.",
    "taken": [
        "the command line (build 5172, eb1776b1), verbatim",
        "the error the title and description name: CUDA error: out of memory",
        "the log lines quoted before it: 'srv  params_from_: Chat format: Content-only'",
        "the GPUs: three NVIDIA GeForce RTX 3090",
    ],
    "left_out": ["the rest of the log (cut in the report), GPU figures, stacks"],
    "bundle": {
        "engine": "llamacpp",
        "procs": [
            {
                "pid": 1,
                "role": "api-server",
                "cmdline": shlex.split(
                    "/models/llama.cpp/llama-server -m "
                    "/models/Mistral-Small-3.1-24B-Instruct-2503-Q8_0.gguf -md "
                    "/models/Mistral-Small-3.1-DRAFT-0.5B.Q8_0.gguf -fa -sm row --no-mmap -ngl 99 "
                    "-ngld 99 --port 9009 -c 65536 --draft-max 16 --draft-min 5 --draft-p-min 0.5 "
                    "--device CUDA2,CUDA1 --device-draft CUDA1 --tensor-split 0,1,1 --slots "
                    "--metrics --numa distribute -t 40 --no-warmup"
                ),
            }
        ],
        "log": ["srv  params_from_: Chat format: Content-only", "CUDA error: out of memory"],
        "gpus": [{"name": "NVIDIA GeForce RTX 3090"} for _ in range(3)],
    },
}
