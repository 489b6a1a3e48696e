"""More positive cases: SGLang's symmetric-memory registration and EPLB rebalance hangs
(cases_positive.py says what a case holds)."""

from __future__ import annotations

from typing import Any

POSITIVE_SGLANG: dict[str, dict[str, Any]] = {}

POSITIVE_SGLANG["symm-sglang-11208-gb200-window-register"] = {
    "kind": "positive",
    "expect": "sglang-symm-mem-window-register-deadlock",
    "source": ["https://github.com/sgl-project/sglang/issues/11208"],
    "why": "'[Bug] GLM 4.5 Air FP8 on GB200': right after the KV cache is allocated, the "
    "report's py-spy dump of an SGLang scheduler shows its forward thread parked in "
    "ncclCommWindowRegister, called from register_comm_window_raw when pynccl_allocator's "
    "symmetric-memory context exits in the vocabulary embedding's forward (forward_extend): the "
    "symmetric-memory window registration the signature describes, a year before the cited "
    "reports and on another GPU.",
    "taken": [
        "the six server log lines quoted first, verbatim (KV cache allocated on DP0 TP0 EP0, DP1 "
        "TP2 EP2, DP1 TP3 EP3 and DP0 TP1 EP1; the memory pool line; max_total_num_tokens)",
        "the scheduler's two complete threads of the py-spy dump as quoted: 'Thread-1 "
        "(_read_thread)' (tid 4110423) in torch inductor's compile-worker pool, and 'Thread-2 "
        "(forward_thread_func)' (tid 4113894) from ncclCommWindowRegister "
        "(pynccl_wrapper.py:540) down to forward_batch_generation (tp_worker.py:251)",
    ],
    "left_out": [
        "the dump's header and process id, and the MainThread's inner frames: the parts read "
        "show only its outer frames (decorate_context, run_scheduler_process (scheduler.py:2612) "
        "and the multiprocessing spawn frames)",
        "the forward thread's outermost frame, cut in the quote at 'forward_thread_func_ "
        "(tp_worker_overlap_thread.p'",
        "the launch command: the parts read quote none, so --enable-symm-mem is not in the "
        "bundle (SGLang's pynccl_allocator registers windows only when it is on; that is the "
        "code, not the report)",
        "the GPU count and figures (the title names GB200), versions, and whether the watchdog "
        "fired",
    ],
    "bundle": {
        "engine": "sglang",
        "procs": [
            {
                "pid": 1,
                "role": "engine-core",
                "stacks": [
                    {
                        "name": "Thread-1 (_read_thread)",
                        "tid": 4110423,
                        "frames": [
                            "_recv_msg (torch/_inductor/compile_worker/subproc_pool.py:61)",
                            "_read_thread (torch/_inductor/compile_worker/subproc_pool.py:195)",
                            "run (threading.py:1012)",
                            "_bootstrap_inner (threading.py:1075)",
                            "_bootstrap (threading.py:1032)",
                        ],
                    },
                    {
                        "name": "Thread-2 (forward_thread_func)",
                        "tid": 4113894,
                        "frames": [
                            "ncclCommWindowRegister (pynccl_wrapper.py:540)",
                            "register_comm_window_raw (pynccl.py:308)",
                            "__exit__ (pynccl_allocator.py:122)",
                            "forward (vocab_parallel_embedding.py:476)",
                            "_call_impl (torch/nn/modules/module.py:1784)",
                            "_wrapped_call_impl (torch/nn/modules/module.py:1773)",
                            "forward (deepseek_v2.py:2285)",
                            "_call_impl (torch/nn/modules/module.py:1784)",
                            "_wrapped_call_impl (torch/nn/modules/module.py:1773)",
                            "forward (deepseek_v2.py:2445)",
                            "decorate_context (torch/utils/_contextlib.py:120)",
                            "forward_extend (model_runner.py:1847)",
                            "_forward_raw (model_runner.py:1953)",
                            "forward (model_runner.py:1902)",
                            "forward_batch_generation (tp_worker.py:251)",
                        ],
                    },
                ],
            }
        ],
        "log": [
            "[2025-10-03 20:34:47 DP0 TP0 EP0] KV Cache is allocated. #tokens: 1339395, K size: "
            "58.76 GB, V size: 58.76 GB",
            "[2025-10-03 20:34:47 DP0 TP0 EP0] Memory pool end. avail mem=34.30 GB",
            "[2025-10-03 20:34:47 DP1 TP2 EP2] KV Cache is allocated. #tokens: 1339395, K size: "
            "58.76 GB, V size: 58.76 GB",
            "[2025-10-03 20:34:47 DP1 TP3 EP3] KV Cache is allocated. #tokens: 1339395, K size: "
            "58.76 GB, V size: 58.76 GB",
            "[2025-10-03 20:34:47 DP0 TP1 EP1] KV Cache is allocated. #tokens: 1339395, K size: "
            "58.76 GB, V size: 58.76 GB",
            "[2025-10-03 20:34:48 DP0 TP0 EP0] max_total_num_tokens=1339395, "
            "chunked_prefill_size=2032, max_prefill_tokens=16384, max_running_requests=4096, "
            "context_len=131072, available_gpu_mem=33.74 GB",
        ],
    },
}

POSITIVE_SGLANG["eplb-sglang-7956-p2p-weight-exchange"] = {
    "kind": "positive",
    "expect": "sglang-eplb-rebalance-p2p-hang",
    "source": ["https://github.com/sgl-project/sglang/issues/7956"],
    "why": "'[Bug] EPLB weight exchange hangs when P2P is activated': DeepSeek R1 with EPLB "
    "deadlocks during the weight communication and times out; py-spy puts all 32 ranks in "
    "batch_isend_irecv under _execute_p2p_ops (eplb/expert_location_updater.py), and "
    "NCCL_P2P_DISABLE=1 avoids it: the single P2P batch that PR #30829 later chunked on CUDA.",
    "taken": [
        "the py-spy stack quoted as the freezing point of all 32 ranks, verbatim as far as the "
        "quote goes: 'Thread-4 (forward_thread_func)' (tid 465126) in _coalescing_manager "
        "(torch/distributed/distributed_c10d.py:2587) <- __exit__ (contextlib.py:142) <- "
        "batch_isend_irecv (torch/distributed/distributed_c10d.py:2649) <- _execute_p2p_ops "
        "(eplb/expert_location_updater.py:441); one scheduler process carries it (the report "
        "gives one stack for all ranks and no process ids)",
    ],
    "left_out": [
        "the stack's outer frames, cut in the parts read at '_entr'",
        "the launch command and environment (the setup the report refers to is not in the "
        "parts read; NCCL_P2P_DISABLE=1 is the workaround, not the hanging run's setting)",
        "GPUs, versions and log lines",
    ],
    "bundle": {
        "engine": "sglang",
        "procs": [
            {
                "pid": 1,
                "role": "engine-core",
                "stacks": [
                    {
                        "name": "Thread-4 (forward_thread_func)",
                        "tid": 465126,
                        "frames": [
                            "_coalescing_manager (torch/distributed/distributed_c10d.py:2587)",
                            "__exit__ (contextlib.py:142)",
                            "batch_isend_irecv (torch/distributed/distributed_c10d.py:2649)",
                            "_execute_p2p_ops (eplb/expert_location_updater.py:441)",
                        ],
                    }
                ],
            }
        ],
    },
}
