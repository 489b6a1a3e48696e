"""What each fixture bundle holds, shaped on its upstream report (the signature id is the key).

Frames, log lines and flags are the ones the reports quote; where a report leaves something out
(a line number, the model path, an uninvolved process), the fixture fills it with a neutral
value and says so in a comment. No fixture holds a stack, line or flag its report contradicts.
"""

from __future__ import annotations

from typing import Any

from tests.data.hangs.build import CREATED, SPAWN_TAIL, THREAD_TAIL, nat, py, thread

API = ["python3", "-m", "vllm.entrypoints.openai.api_server"]


def api_proc(pid: int, cmdline: list[str], threads: bool = True, **extra: Any) -> dict[str, Any]:
    frames = [
        py("select", "selectors.py", 468),
        py("_run_once", "asyncio/base_events.py", 1961),
        py("run_forever", "asyncio/base_events.py", 645),
        py("run_until_complete", "asyncio/base_events.py", 678),
        py("run", "asyncio/runners.py", 118),
        py("run_server", "vllm/entrypoints/openai/api_server.py", 1866),
        py("<module>", "vllm/entrypoints/openai/api_server.py", 1930),
    ]
    return {
        "pid": pid,
        "role": "api-server",
        "title": " ".join(cmdline)[:80],
        "state": "sleeping",
        "cmdline": cmdline,
        "threads": [thread(pid, "MainThread", frames)] if threads else None,
    } | extra


def io_threads(base: int) -> list[dict[str, Any]]:
    """EngineCore's two socket threads (vllm/v1/engine/core.py), idle in every report."""
    return [
        thread(
            base + 1,
            "Thread-1 (process_input_sockets)",
            [
                py("poll", "zmq/sugar/poll.py", 106),
                py("process_input_sockets", "vllm/v1/engine/core.py", 1092),
                *THREAD_TAIL,
            ],
        ),
        thread(
            base + 2,
            "Thread-2 (process_output_sockets)",
            [
                py("wait", "threading.py", 359),
                py("get", "queue.py", 180),
                py("process_output_sockets", "vllm/v1/engine/core.py", 1140),
                *THREAD_TAIL,
            ],
        ),
    ]


def core_proc(
    pid: int, main: list[Any], title: str = "VLLM::EngineCore", **extra: Any
) -> dict[str, Any]:
    loop = [
        py("run_busy_loop", "vllm/v1/engine/core.py", 944),
        py("run_engine_core", "vllm/v1/engine/core.py", 905),
        *SPAWN_TAIL,
    ]
    threads = [
        thread(pid, "MainThread", [*main, *loop], active=extra.pop("active", False)),
        *io_threads(pid),
    ]
    return {
        "pid": pid,
        "role": "engine-core",
        "title": title,
        "state": "sleeping",
        "cmdline": [title],
        "environ": extra.pop("environ", {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}),
        "threads": threads,
    } | extra


def worker_proc(pid: int, rank: int, main: list[Any] | None, title: str = "") -> dict[str, Any]:
    frames = (
        None
        if main is None
        else [
            thread(
                pid,
                "MainThread",
                [
                    *main,
                    py("worker_busy_loop", "vllm/v1/executor/multiproc_executor.py", 862),
                    py("worker_main", "vllm/v1/executor/multiproc_executor.py", 801),
                    *SPAWN_TAIL,
                ],
            )
        ]
    )
    name = title or f"VLLM::Worker_TP{rank}"
    return {
        "pid": pid,
        "role": "worker",
        "title": name,
        "state": "sleeping",
        "cmdline": [name],
        "threads": frames,
    }


WAIT_ON_WORKERS = [  # vllm #40926 (description) and #50835: the engine core waiting on its workers
    py("wait", "vllm/distributed/device_communicators/shm_broadcast.py", 610),
    py("acquire_read", "vllm/distributed/device_communicators/shm_broadcast.py", 675),
    py("dequeue", "vllm/distributed/device_communicators/shm_broadcast.py", 756),
    py("get_response", "vllm/v1/executor/multiproc_executor.py", 388),
    py("_wait_for_response", "vllm/v1/executor/multiproc_executor.py", 95),
    py("result", "vllm/v1/executor/multiproc_executor.py", 90),
    py("step_with_batch_queue", "vllm/v1/engine/core.py", 523),
    py("_process_engine_step", "vllm/v1/engine/core.py", 1205),
]


def stats(n: int, running: int, waiting: int, gen: str = "0.0", hhmm: str = "20:2") -> list[str]:
    return [
        f"(APIServer pid=100) INFO 05-28 {hhmm}{i}:0{i % 10} [loggers.py:271] Engine 000: Avg prompt "
        f"throughput: 0.0 tokens/s, Avg generation throughput: {gen} tokens/s, Running: {running} reqs, "
        f"Waiting: {waiting} reqs, GPU KV cache usage: 22.9%, Prefix cache hit rate: 0.2%"
        for i in range(n)
    ]


def scrapes(running: float, waiting: float, tokens: list[float]) -> list[dict[str, Any]]:
    """timeline.jsonl scrape records (raw exposition text, as the watcher stores them)."""
    out = []
    for i, tok in enumerate(tokens):
        body = (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0",model_name="m"}} {running if i > 2 else 8.0}\n'
            f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting if i > 2 else 24.0}\n'
            "# TYPE vllm:generation_tokens_total counter\n"
            f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {tok}\n'
        )
        out.append(
            {
                "v": 1,
                "t": CREATED - 300 + 10 * i,
                "kind": "scrape",
                "status": 200,
                "elapsed_s": 0.01,
                "body": body,
            }
        )
    return out


# vllm #40350: the reproducer's command line, verbatim.
SEED_CMD = [
    *API,
    "--model",
    "nvidia/Qwen3.5-397B-A17B-NVFP4",
    "--tensor-parallel-size",
    "4",
    "--kv-cache-dtype",
    "fp8_e4m3",
    "--trust-remote-code",
    "--max-model-len",
    "3072",
    "--no-enable-prefix-caching",
    "--language-model-only",
    "--async-scheduling",
    "--attention-backend",
    "FLASHINFER",
    "--enable-expert-parallel",
    "--quantization",
    "modelopt",
    "--compilation_config.max_cudagraph_capture_size",
    "2048",
    "--speculative_config.method",
    "mtp",
]

SPECS: dict[str, dict[str, Any]] = {}

SPECS["vllm-nvfp4-mtp-blackwell-stall"] = {
    # The report quotes no stacks: py-spy was refused here (a Baseline pod without SYS_PTRACE).
    "engine": "vllm",
    "cause": "no-progress",
    "pyspy_status": "permission-denied",
    "procs": [
        api_proc(100, SEED_CMD, threads=False),
        {
            "pid": 200,
            "role": "engine-core",
            "title": "VLLM::EngineCore",
            "state": "sleeping",
            "cmdline": ["VLLM::EngineCore"],
            "threads": None,
        },
        *(worker_proc(300 + r, r, None) for r in range(4)),
    ],
    "gpus": [{"name": "NVIDIA B300 SXM6 AC", "class": "idle", "power": 190.0} for _ in range(4)],
    "log": [
        "(APIServer pid=100) INFO 05-28 20:10:00 [api_server.py:1896] vLLM API server version 0.19.1rc1.dev391+g80b18230e",
        *stats(3, 8, 26, "93.5", "20:1"),
        *stats(6, 1, 54),
    ],
    "timeline": scrapes(1.0, 54.0, [9000, 9400, 9900, 10100, 10100, 10100, 10100, 10100]),
    "evidence": ["running=1 waiting=54, generation_tokens_total flat for 180 s"],
}

SPECS["vllm-mtp-engine-core-waits-on-workers"] = {
    # vllm #40926: GLM-5.1-FP8, TP=8, MTP; the model path and the other flags are neutral values.
    "engine": "vllm",
    "cause": "no-progress",
    "procs": [
        api_proc(
            100,
            [
                "vllm",
                "serve",
                "zai-org/GLM-5.1-FP8",
                "--tensor-parallel-size",
                "8",
                "--speculative-config",
                '{"method":"mtp","num_speculative_tokens":1}',
                "--trust-remote-code",
            ],
        ),
        core_proc(200, WAIT_ON_WORKERS),
        *(worker_proc(300 + r, r, None) for r in range(8)),
    ],  # worker stacks timed out
    "pyspy_detail": "300-307: timeout",
    "gpus": [{"name": "NVIDIA H200", "class": "idle", "power": 118.0} for _ in range(8)],
    "log": [
        "(EngineCore_DP0 pid=200) INFO 05-28 20:21:00 [shm_broadcast.py:542] No available shared memory broadcast block found in 60 seconds. This typically happens when some processes are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache quantization).",
        "(EngineCore_DP0 pid=200) ERROR 05-28 20:26:00 [dump_input.py:81] Dumping scheduler stats: SchedulerStats(num_running_reqs=2, num_waiting_reqs=0, step_counter=0, kv_cache_usage=0.405)",
        "(EngineCore_DP0 pid=200) ERROR 05-28 20:26:00 [core.py:1101] TimeoutError: RPC call to sample_tokens timed out.",
    ],
    "where": ["EngineCore main thread waiting on a condition in acquire_read under engine step"],
}

SPECS["vllm-multinode-shm-reader-stall"] = {
    # vllm #51921: 4x GB10, TP=4 across nodes; this bundle is the head node's (one local worker).
    "engine": "vllm",
    "cause": "no-progress",
    "machine": "aarch64",
    "procs": [
        api_proc(
            100,
            [
                "vllm",
                "serve",
                "/models/model",
                "--tensor-parallel-size",
                "4",
                "--nnodes",
                "4",
                "--node-rank",
                "0",
                "--master-addr",
                "10.0.0.1",
            ],
        ),
        core_proc(
            200,
            [
                py("wait", "vllm/distributed/device_communicators/shm_broadcast.py", 620),
                py("acquire_read", "vllm/distributed/device_communicators/shm_broadcast.py", 802),
                py("dequeue", "vllm/distributed/device_communicators/shm_broadcast.py", 880),
                py("get_response", "vllm/v1/executor/multiproc_executor.py", 400),
                py("collective_rpc", "vllm/v1/executor/multiproc_executor.py", 352),
                py("execute_model", "vllm/v1/executor/multiproc_executor.py", 300),
                py("step_with_batch_queue", "vllm/v1/engine/core.py", 600),
                py("_process_engine_step", "vllm/v1/engine/core.py", 1250),
            ],
        ),
        worker_proc(
            300,
            0,
            [
                py("acquire_read", "vllm/distributed/device_communicators/shm_broadcast.py", 802),
                py("dequeue", "vllm/distributed/device_communicators/shm_broadcast.py", 880),
            ],
        ),
    ],
    "gpus": [{"name": "NVIDIA GB10", "class": "idle", "power": 11.0}],
    "log": [
        f"(EngineCore pid=200) INFO 08-12 03:{34 + i}:43 [shm_broadcast.py:802] No available shared memory broadcast block found in 60 seconds. This typically happens when some processes are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache quantization)."
        for i in range(5)
    ],
}

SAMPLER_WAIT = [  # vllm #42897 (py-spy --native)
    nat("cuEventSynchronize", "libcuda.so.595.45.04"),
    nat(
        "cudaEventSynchronize",
        "/usr/local/lib/python3.13/dist-packages/nvidia/cuda_runtime/lib/libcudart.so.13",
    ),
    nat(
        "THPEvent_synchronize",
        "/usr/local/lib/python3.13/dist-packages/torch/lib/libtorch_python.so",
    ),
    py("synchronize", "torch/cuda/streams.py", 254),
    py("_to_list", "vllm/v1/worker/gpu_model_runner.py", 3102),
    py("get_output", "vllm/v1/worker/gpu_model_runner.py", 301),
    py("result", "vllm/v1/executor/uniproc_executor.py", 38),
    py("step_with_batch_queue", "vllm/v1/engine/core.py", 595),
    py("_process_engine_step", "vllm/v1/engine/core.py", 1205),
]
SPECS["vllm-sm12x-flashinfer-topk-sampler-hang"] = {
    # vllm #42897: the launch command verbatim, RTX 5090, TP=1 (the model runs inside EngineCore).
    "engine": "vllm",
    "cause": "no-progress",
    "procs": [
        api_proc(
            100,
            [
                "vllm",
                "serve",
                "RedHatAI/Qwen3.6-35B-A3B-NVFP4",
                "--host",
                "0.0.0.0",
                "--port",
                "8356",
                "--quantization",
                "compressed-tensors",
                "--moe-backend",
                "flashinfer_cutlass",
                "--kv-cache-dtype",
                "fp8_e4m3",
                "--max-model-len",
                "196608",
                "--gpu-memory-utilization",
                "0.847",
                "--max-num-seqs",
                "8",
                "--max-num-batched-tokens",
                "4096",
                "--enable-prefix-caching",
                "--enable-chunked-prefill",
                "--enable-auto-tool-choice",
                "--reasoning-parser",
                "qwen3",
                "--tool-call-parser",
                "qwen3_coder",
                "--trust-remote-code",
            ],
        ),
        core_proc(200, SAMPLER_WAIT, active=True),
    ],
    "gpus": [{"name": "NVIDIA GeForce RTX 5090", "class": "spinning", "util": 96.0, "power": 71.0}],
    "driver": "595.45.04",
    "log": [
        "(APIServer pid=100) INFO 05-17 08:00:00 [api_server.py:1896] vLLM API server version 0.21.0",
        *stats(2, 3, 0, "41.0", "11:0"),
        *stats(1, 3, 0, "0.0", "11:1"),
    ],
    "where": [
        "EngineCore main thread waiting in cuEventSynchronize in synchronize under engine step"
    ],
}

SPECS["vllm-flashinfer-gdn-prefill-hang"] = {
    # vllm #37250: Qwen3.5-397B-A17B-FP8, TP=4, enforce_eager, CUDA_LAUNCH_BLOCKING=1 (the report
    # ran it through Ray Data; this is the equivalent serve command). Its worker stack verbatim.
    "engine": "vllm",
    "cause": "no-progress",
    "procs": [
        api_proc(
            100,
            [
                "vllm",
                "serve",
                "/pfs/vllm/Qwen3.5-397B-A17B-FP8",
                "--tensor-parallel-size",
                "4",
                "--max-model-len",
                "2048",
                "--load-format",
                "fastsafetensors",
                "--enforce-eager",
            ],
        ),
        core_proc(200, WAIT_ON_WORKERS, environ={"CUDA_LAUNCH_BLOCKING": "1"}),
        worker_proc(
            300,
            0,
            [
                py("gdn_prefill", "flashinfer/gdn_prefill.py", 63),
                py("chunk_gated_delta_rule", "flashinfer/gdn_prefill.py", 196),
                py("fi_chunk_gated_delta_rule", "vllm/model_executor/models/qwen3_next.py", 138),
                py("forward_cuda", "vllm/model_executor/models/qwen3_next.py", 176),
                py("forward", "vllm/model_executor/custom_op.py", 129),
                py("_call_impl", "torch/nn/modules/module.py", 1787),
                py("_wrapped_call_impl", "torch/nn/modules/module.py", 1776),
                py("_forward_core", "vllm/model_executor/models/qwen3_next.py", 780),
                py("gdn_attention_core", "vllm/model_executor/models/qwen3_next.py", 1451),
                py("__call__", "torch/_ops.py", 1255),
                py("execute_model", "vllm/v1/worker/gpu_model_runner.py", 3600),
                py("execute_model", "vllm/v1/worker/gpu_worker.py", 640),
            ],
        ),
        *(
            worker_proc(
                300 + r,
                r,
                [
                    py(
                        "acquire_read",
                        "vllm/distributed/device_communicators/shm_broadcast.py",
                        675,
                    ),
                    py("dequeue", "vllm/distributed/device_communicators/shm_broadcast.py", 756),
                ],
            )
            for r in range(1, 4)
        ),
    ],
    "log": [
        "(EngineCore_DP0 pid=200) ERROR 03-16 10:20:00 [core.py:1101] Traceback (most recent call last):",
        '(EngineCore_DP0 pid=200) ERROR 03-16 10:20:00 [core.py:1101]   File "vllm/v1/executor/multiproc_executor.py", line 376, in get_response',
        "(EngineCore_DP0 pid=200) ERROR 03-16 10:20:00 [core.py:1101] TimeoutError: RPC call to sample_tokens timed out.",
    ],
}
