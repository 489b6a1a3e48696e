"""Hard negatives (real hangs of other causes that look like a catalog entry: the same kernel on
other GPUs, the same collective, the same connector, the same GPU state) and healthy or benign
dumps (an idle engine, a slow load or compile, a long prefill). Nothing should be named."""

from __future__ import annotations

import shlex
from typing import Any

NEGATIVE: dict[str, dict[str, Any]] = {}

NEGATIVE["neg-vllm-17676-a2-sampler-warmup"] = {
    "kind": "negative",
    "source": ["https://github.com/vllm-project/vllm/issues/17676"],
    "why": "The FlashInfer sampler hangs at warm-up on an A2 (comment by alastair-swan, "
    "2026-09-13): the multi-CTA top-k on a GPU with few SMs (flashinfer#4544, PR #4595), not the "
    "SM12x barrier race. The GPU family must keep vllm-sm12x-flashinfer-topk-sampler-hang out.",
    "taken": [
        "the py-spy dump of VLLM::EngineCore (thread 2403, active), top frames verbatim down to "
        "_initialize_kv_caches (vllm/v1/engine/core.py:345)",
        "the GPU: an A2",
    ],
    "left_out": ["the command line, versions, GPU figures, engine log"],
    "bundle": {
        "engine": "vllm",
        "procs": [
            {
                "pid": 2403,
                "role": "engine-core",
                "cmdline": ["VLLM::EngineCore"],
                "stacks": [
                    {
                        "name": "",
                        "tid": 2403,
                        "active": True,
                        "frames": [
                            "top_k_top_p_sampling_from_logits (flashinfer/sampling.py:1548)",
                            "_auto_dump_wrapper (flashinfer/api_logging.py:2333)",
                            "flashinfer_sample (vllm/v1/sample/ops/topk_topp_sampler.py:508)",
                            "sample (vllm/v1/worker/gpu/sample/sampler.py:310)",
                            "__call__ (vllm/v1/worker/gpu/sample/sampler.py:141)",
                            "sample (vllm/v1/worker/gpu/model_runner.py:1440)",
                            "sample_tokens (vllm/v1/worker/gpu/model_runner.py:1862)",
                            "wrapper (vllm/v1/worker/gpu/eplb_utils.py:27)",
                            "decorate_context (torch/utils/_contextlib.py:124)",
                            "sample_tokens (vllm/v1/worker/gpu_worker.py:1105)",
                            "decorate_context (torch/utils/_contextlib.py:124)",
                            "warmup_kernels (vllm/v1/worker/gpu/warmup.py:348)",
                            "decorate_context (torch/utils/_contextlib.py:124)",
                            "compile_or_warm_up_model (vllm/v1/worker/gpu_worker.py:866)",
                            "sync_wrapper (vllm/tracing/otel.py:178)",
                            "run_method (vllm/v1/serial_utils.py:510)",
                            "collective_rpc (vllm/v1/executor/uniproc_executor.py:103)",
                            "compile_or_warm_up_model (vllm/v1/executor/abstract.py:127)",
                            "_initialize_kv_caches (vllm/v1/engine/core.py:345)",
                            "sync_wrapper (vllm/tracing/otel.py:178)",
                            "__init__ (vllm/v1/engine/core.py:145)",
                        ],
                    }
                ],
            }
        ],
        "gpus": [{"name": "A2"}],
    },
}

NEGATIVE["neg-1cat-652-v100-custom-allreduce-startup"] = {
    "kind": "negative",
    "source": ["https://github.com/1CatAI/1Cat-vLLM/issues/652"],
    "why": "A custom all-reduce kernel that spins forever at start-up on two V100 PCIe GPUs in "
    "an SM70 build of vLLM (1.5.0): not #8410's unsafe synchronisation fixed after 0.6.1, and no "
    "request in flight. Looks like vllm-custom-allreduce-rank-hang and the shm line.",
    "taken": [
        "the launch flags (--tensor-parallel-size 2 --attention-backend FLASH_ATTN_V100 "
        "--kv-cache-dtype fp8_e5m2 --max-model-len 262144 --block-size 2048 "
        "--mamba-block-size 8192 --gpu-memory-utilization 0.85)",
        "the GPUs: 2x NVIDIA Tesla V100-PCIE-32GB; vLLM 1.5.0 (the 1Cat build)",
        "the log line EngineCore repeats every 60 s, as far as the report quotes it",
    ],
    "left_out": [
        "the model argument (the report names the model, not the path), stacks, GPU figures",
    ],
    "bundle": {
        "engine": "vllm",
        "versions": {"engine_version": "1.5.0"},
        "procs": [
            {
                "pid": 1,
                "role": "api-server",
                "cmdline": shlex.split(
                    "--tensor-parallel-size 2 --attention-backend FLASH_ATTN_V100 --kv-cache-dtype "
                    "fp8_e5m2 --max-model-len 262144 --block-size 2048 --mamba-block-size 8192 "
                    "--gpu-memory-utilization 0.85"
                ),
            }
        ],
        "log": [
            "(EngineCore pid=...) INFO [shm_broadcast.py:705] No available shared memory "
            "broadcast block found in 60 seco"
        ],
        "gpus": [{"name": "NVIDIA Tesla V100-PCIE-32GB"} for _ in range(2)],
    },
}

NEGATIVE["neg-lmcache-4759-mp-retrieve"] = {
    "kind": "negative",
    "source": ["https://github.com/LMCache/LMCache/issues/4759"],
    "why": "LMCache's multiprocess mode on two GB10 nodes: a large retrieve never completes, "
    "but every process is idle (a lost completion), not blocked importing a peer's event: "
    "the same connector as lmcache-rocm-import-event-deadlock, another cause.",
    "taken": [
        "the py-spy summary of the live hang (comment by sethforprivacy, 2026-08-27): both "
        "workers' MainThread in worker_busy_loop -> shm_broadcast dequeue; EngineCore's busy "
        "loop in _process_input_queue -> queue wait; the connector's mq-client-shared-loop "
        "threads in zmq poll at lmcache/v1/multiprocess/mq.py:240",
        "the GPUs: NVIDIA GB10, two nodes",
    ],
    "left_out": [
        "verbatim dumps (the comment summarises them: frames below carry the names and files "
        "it gives, no line numbers), command lines, logs",
    ],
    "bundle": {
        "engine": "vllm",
        "procs": [
            {
                "pid": 1,
                "role": "engine-core",
                "stacks": [
                    {"name": "busy loop", "frames": ["wait (queue)", "_process_input_queue"]},
                    {
                        "name": "mq-client-shared-loop",
                        "frames": ["poll (lmcache/v1/multiprocess/mq.py:240)"],
                    },
                ],
            },
            {
                "pid": 2,
                "role": "worker",
                "stacks": [
                    {
                        "name": "MainThread",
                        "frames": ["dequeue (shm_broadcast)", "worker_busy_loop"],
                    }
                ],
            },
        ],
        "gpus": [{"name": "NVIDIA GB10"}],
    },
}

NEGATIVE["neg-sglang-33549-h20-spin-no-stacks"] = {
    "kind": "negative",
    "source": ["https://github.com/sgl-project/sglang/issues/33549"],
    "why": "DeepSeek-V4 at TP=8 on one node of H20s: a decode forward hangs at ~245K context "
    "with every GPU spinning at 100 % and low power, and py-spy was refused: the GPU state of "
    "the NCCL and TP-divergence signatures, on one node, without their GPUs or launch.",
    "taken": [
        "the title: TP=8 on 8x H20, all GPUs at 100 % utilisation and low power",
        "a log line of the watchdog dump: '[2026-08-04 11:58:42 TP1] Scheduler debug info:'",
        "py-spy failed on every rank (Permission denied): no stacks",
    ],
    "left_out": ["the command line (the report names the dsv4 backend and DSPARK)", "power"],
    "bundle": {
        "engine": "sglang",
        "log": ["[2026-08-04 11:58:42 TP1] Scheduler debug info:"],
        "gpus": [{"name": "H20", "util": 100.0} for _ in range(8)],
    },
}

NEGATIVE["neg-llamacpp-15128-load-hang"] = {
    "kind": "negative",
    "source": ["https://github.com/ggml-org/llama.cpp/issues/15128"],
    "why": "llama-server occasionally hangs while loading a model, /health answering 503; a "
    "maintainer points at the driver or hardware: not the CUDA-error state of #13281.",
    "taken": ["the log lines: 'srv  log_server_r: request: GET /health 127.0.0.1 503'"],
    "left_out": ["the command line, GPUs, stacks"],
    "bundle": {
        "engine": "llamacpp",
        "log": ["srv  log_server_r: request: GET /health 127.0.0.1 503" for _ in range(3)],
    },
}

NEGATIVE["healthy-vllm-25720-idle-worker-shm"] = {
    "kind": "healthy",
    "source": ["https://github.com/vllm-project/vllm/pull/25720"],
    "why": "An idle worker logs the shared-memory broadcast line every minute while it waits "
    "for work (the PR stops the worker side from logging it): an idle engine, not a hang.",
    "taken": ["the log line the PR quotes, verbatim"],
    "left_out": ["everything else: the PR shows the one line"],
    "bundle": {
        "engine": "vllm",
        "log": [
            "(Worker_DP0_TP1_EP1 pid=1682938) INFO 09-25 19:55:44 "
            "[distributed/device_communicators/shm_broadcast.py:458] No available shared memory "
            "broadcast block found in 60 seconds. This typically happens when some processes are "
            "hanging, doing some time-consuming work (e.g. compilation), or sitting idle."
        ],
    },
}

NEGATIVE["healthy-vllm-17451-slow-compile"] = {
    "kind": "healthy",
    "source": ["https://github.com/vllm-project/vllm/issues/17451"],
    "why": "vLLM 0.8.5 'keeps hanging' at start-up while torch.compile compiles graphs for tens "
    "of seconds each (comment by lhcavalcanti, 2025-05-01): a slow start, not a hang.",
    "taken": ["the log lines quoted, verbatim"],
    "left_out": ["command line, GPUs, stacks"],
    "bundle": {
        "engine": "vllm",
        "versions": {"engine_version": "0.8.5"},
        "log": [
            "INFO 05-01 00:07:00 [backends.py:430] Dynamo bytecode transform time: 9.88 s",
            "INFO 05-01 00:07:03 [backends.py:136] Cache the graph of shape None for later use",
            "INFO 05-01 00:07:40 [backends.py:148] Compiling a graph for general shape takes "
            "39.42 s",
            "INFO 05-01 00:07:40 [backends.py:148] Compiling a graph for general shape takes "
            "41.35 s",
        ],
    },
}

NEGATIVE["healthy-ik-llama-1210-long-prefill"] = {
    "kind": "healthy",
    "source": ["https://github.com/ikawrakow/ik_llama.cpp/issues/1210"],
    "why": "/slots and /health do not answer while a CPU-only server processes a long prompt "
    "(30-60 minutes); they answer again once generation starts: a long prefill.",
    "taken": ["the command line, verbatim (version 4146, a247699d)"],
    "left_out": ["logs, stacks: the report's log section is empty"],
    "bundle": {
        "engine": "llamacpp",
        "procs": [
            {
                "pid": 1,
                "role": "api-server",
                "cmdline": shlex.split(
                    "./build_8c_a247699d/bin/llama-server -m "
                    "/mnt/vm-shared-files/models/unsloth/"
                    "Kimi-K2-Instruct-UD-Q3_K_XL-00001-of-00010.gguf "
                    "--numa distribute -mla 3 -amb 512 --split-mode none -t 46 -b 4096 -ub 4096 "
                    "--host 0.0.0.0 --port 8080 -c 262144 --parallel 4 --mlock -thp "
                    "--slot-save-path /mnt/vm-shared-files/model_cache"
                ),
            }
        ],
    },
}

NEGATIVE["healthy-club3090-652-idle-5090s"] = {
    "kind": "healthy",
    "source": ["https://github.com/noonghunna/club-3090/issues/652"],
    "why": "A benchmark report's nvidia-smi of two RTX 5090 serving Qwen3.6-35B-A3B with vLLM, "
    "taken idle: the SM12x sampler's GPU family at rest.",
    "taken": ["nvidia-smi: GPU 0 RTX 5090 0 %, 10 W of 575 W; GPU 1 0 %, 12 W of 575 W"],
    "left_out": ["command line, logs, stacks"],
    "bundle": {
        "engine": "vllm",
        "gpus": [
            {"name": "NVIDIA GeForce RTX 5090", "util": 0.0, "power": 10.0, "power_limit": 575.0},
            {"name": "NVIDIA GeForce RTX 5090", "util": 0.0, "power": 12.0, "power_limit": 575.0},
        ],
    },
}

NEGATIVE["neg-vllm-11139-ray-pp-lws-init"] = {
    "kind": "negative",
    "source": ["https://github.com/vllm-project/vllm/issues/11139"],
    "why": "vLLM with Ray on an LWS-allocated pod hangs once --pipeline_parallel_size > 1, at "
    "NCCL initialisation: Ray and pipeline parallelism like vllm-ray-pp-shm-deadlock, but stuck "
    "before serving, not in the shared message queue.",
    "taken": ["the last log line: 'INFO 12-12 05:28:31 pynccl.py:69] vLLM is using nccl==2.21.5'"],
    "left_out": ["the command line (the title names --pipeline_parallel_size > 1), stacks, GPUs"],
    "bundle": {
        "engine": "vllm",
        "log": ["INFO 12-12 05:28:31 pynccl.py:69] vLLM is using nccl==2.21.5"],
    },
}

NEGATIVE["neg-sglang-7553-watchdog-no-pyspy"] = {
    "kind": "negative",
    "source": ["https://github.com/sgl-project/sglang/issues/7553"],
    "why": "An SGLang decode hang (DP4 TP4, DeepSeek-R1) where the watchdog fired and py-spy "
    "was not installed: the watchdog line of sglang-overlap-copy-done-hang, without its stack.",
    "taken": [
        "the two log lines: '[2025-06-26 07:25:31 DP4 TP4] Pyspy failed to dump PID 113688. "
        "Error: /bin/bash: line 1: py-spy: command not found' and '[2025-06-26 07:25:31 DP4 TP4] "
        "Watchdog timeout (self.watchdog_timeout=300)'",
    ],
    "left_out": ["the server's command line (the report shows the benchmark client's)", "GPUs"],
    "bundle": {
        "engine": "sglang",
        "log": [
            "[2025-06-26 07:25:31 DP4 TP4] Pyspy failed to dump PID 113688. Error: /bin/bash: "
            "line 1: py-spy: command not found",
            "[2025-06-26 07:25:31 DP4 TP4] Watchdog timeout (self.watchdog_timeout=300)",
        ],
    },
}

NEGATIVE["neg-vllm-44185-dp-spec-shm"] = {
    "kind": "negative",
    "source": ["https://github.com/vllm-project/vllm/issues/44185"],
    "why": "Speculative decoding with an MoE draft near max_model_len under data parallelism "
    "hangs with both DP engine cores logging the shared-memory line: data parallel and the "
    "line, another mechanism than the zero-token drift.",
    "taken": ["the EngineCore_DP0 / EngineCore_DP1 log lines quoted, verbatim (first three)"],
    "left_out": ["command line, stacks, GPUs: not in the parts read"],
    "bundle": {
        "engine": "vllm",
        "log": [
            f"(EngineCore_DP{dp} pid={pid}) INFO 05-28 {t} [shm_broadcast.py:681] No available "
            "shared memory broadcast block found in 60 seconds. This typically happens when some "
            "processes are hanging or doing some time-consuming work (e.g. compilation, "
            "weight/kv cache quantization)."
            for dp, pid, t in ((1, 1455, "14:44:28"), (0, 1454, "14:45:27"), (1, 1455, "14:45:28"))
        ],
    },
}

NEGATIVE["neg-llamacpp-16448-stops-responding"] = {
    "kind": "negative",
    "source": ["https://github.com/ggml-org/llama.cpp/issues/16448"],
    "why": "llama-server on two RTX 5090 randomly stops generating with CPU and GPUs at 0 %, no "
    "CUDA error reported: the healthy-looking stall, not the CUDA-error state of #13281.",
    "taken": ["the command line, verbatim (version 6658)", "two RTX 5090 at 0 %"],
    "left_out": ["log lines (the report describes them), stacks"],
    "bundle": {
        "engine": "llamacpp",
        "procs": [
            {
                "pid": 1,
                "role": "api-server",
                "cmdline": [
                    "llama-server.exe",
                    "-m",
                    r"C:\models\L3.3-70B-Animus-V12.1-Q4_K_M.gguf",
                    *shlex.split("--n-gpu-layers 81 --port 5001 -c 32768 --host 0.0.0.0"),
                    *shlex.split("-ts 30,34 --threads 16"),
                ],
            }
        ],
        "gpus": [{"name": "NVIDIA GeForce RTX 5090", "util": 0.0} for _ in range(2)],
    },
}

NEGATIVE["neg-trtllm-9680-l40s-tp-idle"] = {
    "kind": "negative",
    "source": ["https://github.com/NVIDIA/TensorRT-LLM/issues/9680"],
    "why": "trtllm-serve hangs with TP > 1 on four L40S (64 MB /dev/shm), the GPUs idle: a "
    "TensorRT-LLM hang no catalog entry is about.",
    "taken": ["nvidia-smi at the hang: NVIDIA L40S, 0 %, 78 W of 350 W (GPU 0)"],
    "left_out": ["the command line and the other GPUs' rows (cut in the part read)"],
    "bundle": {
        "engine": "trtllm",
        "gpus": [{"name": "NVIDIA L40S", "util": 0.0, "power": 78.0, "power_limit": 350.0}],
    },
}

NEGATIVE["healthy-vllm-53181-fsm-line-serving"] = {
    "kind": "healthy",
    "source": ["https://github.com/vllm-project/vllm/issues/53181"],
    "why": "xgrammar's 'Failed to advance FSM' error fires during a soak test while every other "
    "request completes (comment by RoboRiley, 2026-09-08): an error line of a serving engine.",
    "taken": [
        "the log line (request id elided in the report)",
        "the flags quoted: --speculative-config with MTP, --tool-call-parser qwen3_coder, "
        "--reasoning-parser qwen3; one RTX PRO 6000 Blackwell Max-Q",
    ],
    "left_out": ["the full command line (the model is nvidia/Qwen3.6-27B-NVFP4), stacks"],
    "bundle": {
        "engine": "vllm",
        "versions": {"engine_version": "0.28.0"},
        "procs": [
            {
                "pid": 1,
                "role": "api-server",
                "cmdline": shlex.split(
                    '--speculative-config \'{"method":"mtp","num_speculative_tokens":2}\' '
                    "--tool-call-parser qwen3_coder --reasoning-parser qwen3"
                ),
            }
        ],
        "log": [
            "ERROR [backend_xgrammar.py:167] Failed to advance FSM for request chatcmpl-... for "
            "tokens 271. Please file an issue."
        ],
        "gpus": [{"name": "NVIDIA RTX PRO 6000 Blackwell Max-Q"}],
    },
}

NEGATIVE["healthy-vllm-5365-first-download"] = {
    "kind": "healthy",
    "source": ["https://github.com/vllm-project/vllm/issues/5365"],
    "why": "Loading a model takes 15 minutes the first time; a maintainer: the download from "
    "Hugging Face takes a while. The Ctrl-C traceback shows the engine in load_model.",
    "taken": ["the traceback lines the reporter pasted after Ctrl-C, first four"],
    "left_out": ["command line (the Python API was used), GPUs"],
    "bundle": {
        "engine": "vllm",
        "log": [
            "[rank0]:     llm = vllm.LLM(",
            '[rank0]:   File "~/.conda/envs/kdd/lib/python3.10/site-packages/vllm/'
            'entrypoints/llm.py", line 144, in __init__',
            "[rank0]:     self.llm_engine = LLMEngine.from_engine_args(",
            "[rank0]:     self.driver_worker.load_model()",
        ],
    },
}

NEGATIVE["neg-flashinfer-4814-b300-2cta-tactic"] = {
    "kind": "negative",
    "source": ["https://github.com/flashinfer-ai/flashinfer/issues/4814"],
    "why": "A TRT-LLM-gen FP4 MoE GEMM deadlock on one B300 from a 2-CTA tactic (c2x1x1) "
    "chosen at batch 2048, SGLang's container: the FP4 MoE family and a Blackwell GPU, not the "
    "PDL wait.",
    "taken": [
        "the GPU: NVIDIA B300 SXM6 (SM103); FlashInfer v0.6.18rc10; the container "
        "lmsysorg/sglang:v0.5.17-cu130",
    ],
    "left_out": ["host stacks (the report names the GPU kernel, not a host frame)", "logs"],
    "bundle": {"engine": "sglang", "gpus": [{"name": "NVIDIA B300 SXM6"}]},
}
