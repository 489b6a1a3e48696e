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

POSITIVE_MORE["ctxshift-llamacpp-7283-update-slots-loop"] = {
    "kind": "positive",
    "expect": "llamacpp-context-shift-endless-generation",
    "source": ["https://github.com/ggml-org/llama.cpp/issues/7283"],
    "why": "'Infinite update_slots issue on latest build (1265c67)': during a long task the model "
    "freezes and the server log repeats 'slot context shift' for the same task: the endless "
    "context-shift loop of #3969.",
    "taken": [
        "the server's JSON log lines as quoted, verbatim: the previous task's timings and "
        "release, 'all slots are idle', then two 'slot context shift' lines for task 15720 (the "
        "second is cut where the quoted text ends)",
    ],
    "left_out": [
        "the command line, the model, the GPU and the rest of the log (the report elides it "
        "with '...')",
    ],
    "bundle": {
        "engine": "llamacpp",
        "log": [
            '{"tid":"139842773884928","timestamp":1715689179,"level":"INFO","function":'
            '"print_timings","line":342,"msg":"          total time =    1749.19 ms","id_slot":0,'
            '"id_task":15676,"t_prompt_processing":234.708,"t_token_generation":1514.486,'
            '"t_total":1749.1940000000002}',
            '{"tid":"139842773884928","timestamp":1715689179,"level":"INFO","function":'
            '"update_slots","line":1780,"msg":"slot released","id_slot":0,"id_task":15676,'
            '"n_ctx":16384,"n_past":159,"n_system_tokens":0,"n_cache_tokens":0,"truncated":false}',
            '{"tid":"139842773884928","timestamp":1715689179,"level":"INFO","function":'
            '"update_slots","line":1806,"msg":"all slots are idle"}',
            '{"tid":"139842773884928","timestamp":1715689851,"level":"INFO","function":'
            '"update_slots","line":1835,"msg":"slot context shift","id_slot":0,"id_task":15720,'
            '"n_keep":0,"n_left":16383,"n_discard":8191,"n_ctx":16384,"n_past":16383,'
            '"n_system_tokens":0,"n_cache_tokens":0}',
            '{"tid":"139842773884928","timestamp":1715690239,"level":"INFO","function":'
            '"update_slots","line":1835,"msg":"slot context shift","id_slot":0,"id_task":15720,"n',
        ],
    },
}

POSITIVE_MORE["raypg-aibrix-927-placement-group-wait"] = {
    "kind": "positive",
    "expect": "vllm-ray-placement-group-wait",
    "source": ["https://github.com/vllm-project/aibrix/issues/927"],
    "why": "'Multi-Node Inference: Waiting for creating a placement group of specs for 310 "
    "seconds': a vLLM engine on a Ray cluster that waits for two GPU bundles it never gets.",
    "taken": [
        "the log lines as quoted, verbatim: the GPU-count warning (its first characters cut in "
        "the report) and three 'Waiting for creating a placement group of specs' lines at 10, "
        "30 and 70 seconds (the last cut where the quoted text ends)",
    ],
    "left_out": ["the command line, the Ray cluster's resources, GPU models and figures"],
    "bundle": {
        "engine": "vllm",
        "log": [
            "NING 04-01 02:45:50 ray_utils.py:320] The number of required GPUs exceeds the total "
            "number of available GPUs in the placement group.",
            *[
                f"INFO 04-01 {t} ray_utils.py:214] Waiting for creating a placement group of specs "
                f"for {s} seconds. specs=[{{'node:10.163.194.101': 0.001, 'GPU': 1.0}}, "
                "{'GPU': 1.0}]. Check `ray status` to see if you have enough resources, and make "
                "sure the IP addresses used by ray cluster are the same as VLLM_HOST_IP "
                "environment variable specified in each node if you are running on a multi-node."
                for t, s in (("02:46:00", 10), ("02:46:20", 30))
            ],
            "INFO 04-01 02:47:00 ray_utils.py:214] Waiting for creating a placement group of specs "
            "for 70 seconds. specs=[{'node:10.163.194.101': 0.001, 'GPU': 1.0}, {'GPU': 1.0}]. "
            "Check `ray status` to see if you have enough resources, and make sure the IP "
            "addresses used by ray cluster are the same as VLLM_HOST_IP environment variable "
            "specified in each node if you a",
        ],
    },
}

POSITIVE_MORE["fsm-vllm-22483-oss20b-fsm-loop"] = {
    "kind": "positive",
    "expect": "vllm-xgrammar-fsm-stuck-request",
    "source": ["https://github.com/vllm-project/vllm/issues/22483"],
    "why": "'OSS-20B [backend_xgrammar.py:160] Failed to advance FSM': the engine core logs the "
    "failure step after step for one request (resp_2021...), the stuck-request loop of PR #18780.",
    "taken": ["the seven EngineCore log lines quoted for request resp_20217d9f..., verbatim"],
    "left_out": ["the command line, versions and GPUs (the environment section is empty)"],
    "bundle": {
        "engine": "vllm",
        "log": [
            f"(EngineCore_0 pid=344054) ERROR 08-08 {t} [backend_xgrammar.py:160] Failed to "
            "advance FSM for request resp_20217d9f89044056949fa9498cdd56a4 for tokens "
            f"{tok}. Please file an issue."
            for t, tok in (
                ("02:53:13", 410),
                ("02:53:13", 745),
                ("02:53:13", 256),
                ("02:53:13", 77),
                ("02:53:13", 134186),
                ("02:53:13", 256),
                ("02:53:14", 67),
            )
        ],
    },
}

POSITIVE_MORE["deepep-sglang-6701-cpu-recv-timeout"] = {
    "kind": "positive",
    "expect": "deepep-dispatch-timeout-missing-peer",
    "source": ["https://github.com/sgl-project/sglang/issues/6701"],
    "why": "'High concurrency leads to \"DeepEP error: CPU recv timeout\"': SGLang with DeepEP "
    "logs a prefill batch at 02:40:36 and nothing until the TP worker's exception at 02:52:38, "
    "twelve minutes later: a DeepEP collective that a peer never joined, on another engine "
    "than the cited reports.",
    "taken": [
        "the server log lines quoted before the crash, verbatim (the last request, the prefill "
        "batch, the TpModelWorkerClient exception line)",
        "the error the title quotes: DeepEP error: CPU recv timeout",
    ],
    "left_out": [
        "the launch command and the traceback's frames (an exception's traceback, not a stack "
        "of the hung threads)",
        "GPU figures",
    ],
    "bundle": {
        "engine": "sglang",
        "log": [
            '[2025-05-29 02:40:36] INFO:     127.0.0.1:56756 - "POST /generate HTTP/1.1" 200 OK',
            "[2025-05-29 02:40:36 TP0] Prefill batch. #new-seq: 1, #new-token: 6145, "
            "#cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0",
            "[2025-05-29 02:52:38 TP0] TpModelWorkerClient hit an exception: Traceback (most "
            "recent call last):",
            "DeepEP error: CPU recv timeout",
        ],
    },
}

POSITIVE_MORE["mnnvl-lil-618-gb10-rendezvous"] = {
    "kind": "positive",
    "expect": "vllm-multinode-custom-allreduce-rendezvous-hang",
    "source": ["https://github.com/local-inference-lab/vllm/pull/618"],
    "why": "A four-node DGX Spark (GB10, TP=4, one rank per node) never finished init_device in "
    "two of four boots: py-spy put rank 0 in in_the_same_node_as's broadcast_object_list and "
    "ranks 1 and 2 in the symmetric-memory rendezvous of CustomAllreduce's _init_mnnvl_buffer; "
    "--disable-custom-all-reduce was the workaround. The ranks split between the rendezvous and "
    "the next group's collective, as in #52907.",
    "taken": [
        "the py-spy frames the description names: rank 0 in broadcast_object_list of "
        "in_the_same_node_as (no file given); ranks 1 and 2 in rendezvous "
        "(torch/distributed/_symmetric_memory/__init__.py) <- _init_mnnvl_buffer "
        "(custom_all_reduce.py:269)",
        "rank 0's log line, as quoted: 'Custom collectives are disabled because this multi-node "
        "group does not support MNNVL multicast'",
    ],
    "left_out": [
        "the command line and the launcher's variables (the nodes are named in prose only), "
        "so the bundle shows no multi-node sign",
        "rank 3, GPU figures, versions (a fork branch, dev/jovian-judgement)",
    ],
    "bundle": {
        "engine": "vllm",
        "procs": [
            {
                "pid": 1,
                "role": "worker",
                "stacks": [
                    {
                        "name": "MainThread",
                        "frames": ["broadcast_object_list", "in_the_same_node_as"],
                    }
                ],
            },
            *[
                {
                    "pid": 2 + i,
                    "role": "worker",
                    "stacks": [
                        {
                            "name": "MainThread",
                            "frames": [
                                "rendezvous (torch/distributed/_symmetric_memory/__init__.py)",
                                "_init_mnnvl_buffer (custom_all_reduce.py:269)",
                            ],
                        }
                    ],
                }
                for i in range(2)
            ],
        ],
        "log": [
            "Custom collectives are disabled because this multi-node group does not support "
            "MNNVL multicast"
        ],
    },
}
