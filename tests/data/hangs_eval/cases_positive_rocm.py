"""A positive case for the ROCm AITER JIT baton that is never released (cases_positive.py says
what a case holds)."""

from __future__ import annotations

from typing import Any

POSITIVE_ROCM: dict[str, dict[str, Any]] = {}

POSITIVE_ROCM["baton-sglang-16242-rmsnorm-lock"] = {
    "kind": "positive",
    "expect": "aiter-jit-baton-never-released",
    "source": ["https://github.com/sgl-project/sglang/issues/16242"],
    "why": "'waiting for baton release at "
    "/sgl-workspace/aiter/aiter/jit/build/lock_module_rmsnorm': "
    "an SGLang server at --tp 4 comes up, runs its first prefill batch, TP2 starts the AITER "
    "JIT build of module_rmsnorm and TP1 waits on its baton; the report says the server is "
    "stuck there. The ranks parked on an AITER JIT baton of InferenceX #1360 and Hyperloom #136, "
    "under SGLang's own issue tracker.",
    "taken": [
        "the command line, verbatim (python3 -m sglang.launch_server --model-path "
        "Qwen/Qwen2.5-1.5B-Instruct --tp 4 --host 0.0.0.0 --port 30000 --disable-cuda-graph "
        "--disable-custom-all-reduce)",
        "the log lines as quoted, verbatim: the earlier module_aiter_enum build (start, finish "
        "after 6.7 s, import), the server start, the /get_model_info request and the first "
        "prefill batch, then "
        "'[aiter] start build [module_rmsnorm]', TP2's 'start build [module_rmsnorm]', "
        "'[aiter] waiting for baton release at /sgl-workspace/aiter/aiter/jit/build/"
        "lock_module_rmsnorm' and TP1's 'waiting for baton release at /sgl-workspace/aiter/"
        "aiter/jit/', cut where the part of the report read ends (the title gives the rest "
        "of the path)",
    ],
    "left_out": [
        "SGLang's own copy of the module_aiter_enum import line (cut in the part read) and "
        "the lines between it and the server start (the parts read skip them)",
        "the GPU (the shell prompt's host name, chi-mi325x-pod2-099, suggests an MI325X pod; "
        "no GPU is named or measured), versions, stacks",
        "why the baton is never released: the issue was closed as inactive and the parts read "
        "give no cause",
    ],
    "bundle": {
        "engine": "sglang",
        "procs": [
            {
                "pid": 1,
                "role": "api-server",
                "cmdline": [
                    "python3",
                    "-m",
                    "sglang.launch_server",
                    "--model-path",
                    "Qwen/Qwen2.5-1.5B-Instruct",
                    "--tp",
                    "4",
                    "--host",
                    "0.0.0.0",
                    "--port",
                    "30000",
                    "--disable-cuda-graph",
                    "--disable-custom-all-reduce",
                ],
            }
        ],
        "log": [
            "[aiter] start build [module_aiter_enum] under "
            "/sgl-workspace/aiter/aiter/jit/build/module_aiter_enum",
            "[2025-12-31 22:48:10] INFO core.py:524: start build [module_aiter_enum] under "
            "/sgl-workspace/aiter/aiter/jit/build/module_aiter_enum",
            "[aiter] finish build [module_aiter_enum], cost 6.7s ",
            "[2025-12-31 22:48:17] INFO core.py:673: finish build [module_aiter_enum], cost 6.7s ",
            "[aiter] import [module_aiter_enum] under "
            "/sgl-workspace/aiter/aiter/jit/module_aiter_enum.so",
            "[2025-12-31 22:48:41] INFO:     Waiting for application startup.",
            "[2025-12-31 22:48:41] Using default chat sampling params from model generation "
            "config: {'repetition_penalty': 1.1, 'temperature': 0.7, 'top_k': 20, 'top_p': 0.8}",
            "[2025-12-31 22:48:41] Using default chat sampling params from model generation "
            "config: {'repetition_penalty': 1.1, 'temperature': 0.7, 'top_k': 20, 'top_p': 0.8}",
            "[2025-12-31 22:48:41] INFO:     Application startup complete.",
            "[2025-12-31 22:48:41] INFO:     Uvicorn running on http://0.0.0.0:30000 "
            "(Press CTRL+C to quit)",
            "[2025-12-31 22:48:42] Endpoint '/get_model_info' is deprecated and will be "
            "removed in a future version. Please use '/model_info' instead.",
            '[2025-12-31 22:48:42] INFO:     127.0.0.1:43872 - "GET /get_model_info HTTP/1.1" '
            "200 OK",
            "[2025-12-31 22:48:42 TP0] Prefill batch, #new-seq: 1, #new-token: 6, "
            "#cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, ",
            "[aiter] start build [module_rmsnorm] under "
            "/sgl-workspace/aiter/aiter/jit/build/module_rmsnorm",
            "[2025-12-31 22:48:50 TP2] start build [module_rmsnorm] under "
            "/sgl-workspace/aiter/aiter/jit/build/module_rmsnorm",
            "[aiter] waiting for baton release at "
            "/sgl-workspace/aiter/aiter/jit/build/lock_module_rmsnorm",
            "[2025-12-31 22:48:50 TP1] waiting for baton release at "
            "/sgl-workspace/aiter/aiter/jit/",
        ],
    },
}
