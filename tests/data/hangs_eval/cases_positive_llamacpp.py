"""More positive cases: the llama.cpp KV-cache retry loop and a second context-shift
loop (see cases_positive.py)."""

from __future__ import annotations

from typing import Any

POSITIVE_LLAMACPP: dict[str, dict[str, Any]] = {}

POSITIVE_LLAMACPP["kvfull-llamacpp-4185-decode-retry"] = {
    "kind": "positive",
    "expect": "llamacpp-kv-cache-full-decode-retry-loop",
    "source": ["https://github.com/ggml-org/llama.cpp/issues/4185"],
    "why": "'update_slots : failed to decode the batch': after about 800 of 1000 prompts the KV "
    "cache seems to fill up and the whole server hangs infinitely and accepts no more requests; "
    "the log shows the batch halved from 256 to 1 and the decode failing at n_batch = 1: the "
    "retry loop of #6617.",
    "taken": [
        "the server's log lines as the description quotes them, verbatim (docker compose's "
        "'llama.cpp-gpu  | ' prefix kept): the system prompt update, slot 0 taking task 812, the "
        "nine 'failed to find free space in the KV cache, retrying with smaller n_batch' lines "
        "(256 down to 1) and 'failed to decode the batch, n_batch = 1, ret = 1'",
    ],
    "left_out": [
        "the command line, the model and the GPU (not in the parts of the report read here)",
        "the comment of 2024-02-09 in the same thread (another user's capture, after 366 "
        "generations): one report, one case",
    ],
    "bundle": {
        "engine": "llamacpp",
        "log": [
            "llama.cpp-gpu  | system prompt updated",
            "llama.cpp-gpu  | slot 0 is processing [task id: 812]",
            "llama.cpp-gpu  | slot 0 : kv cache rm - [24, end)",
            *[
                "llama.cpp-gpu  | update_slots : failed to find free space in the KV cache, "
                f"retrying with smaller n_batch = {n}"
                for n in (256, 128, 64, 32, 16, 8, 4, 2, 1)
            ],
            "llama.cpp-gpu  | update_slots : failed to decode the batch, n_batch = 1, ret = 1",
        ],
    },
}

_CTXSHIFT_6979 = (
    '{"tid":"0x1da3a5ec0","timestamp":%d,"level":"INFO","function":"update_slots","line":1845,'
    '"msg":"slot context shift","id_slot":3,"id_task":79,"n_keep":0,"n_left":50,"n_discard":25,'
    '"n_ctx":512,"n_past":50,"n_system_tokens":0,"n_cache_tokens":0}'
)

POSITIVE_LLAMACPP["ctxshift-llamacpp-6979-fast-requests-loop"] = {
    "kind": "positive",
    "expect": "llamacpp-context-shift-endless-generation",
    "source": ["https://github.com/ggml-org/llama.cpp/issues/6979"],
    "why": "'Fast request make the server stuck': ten slots (-np 10, n_ctx 512 per slot) and two "
    "quick runs of a chat-completion script send the server into an infinite loop of 'slot "
    "context shift' for the same task (79): the endless context shift of #3969.",
    "taken": [
        "the command line, verbatim (./server ... -ngl 99 -cb -np 10; the model path as quoted)",
        "the server's JSON log lines as quoted: two 'slot context shift' lines for slot 3, task 79 "
        "(timestamps 1714395994 and 1714395995), and a third cut where the part of the report "
        "read here ends",
    ],
    "left_out": [
        "the GPU (not named; '-ngl 99' offloads to one), versions (llama3-8b q4_0 through "
        "ollama's blob, build not stated), stacks and GPU figures",
    ],
    "bundle": {
        "engine": "llamacpp",
        "procs": [
            {
                "pid": 1,
                "role": "api-server",
                "cmdline": [
                    "./server",
                    "-m",
                    "~/.ollama/models/blobs/sha256-00e1317cbf74d901080d7100f57580ba8dd8de57203072"
                    "dc6f668324ba545f29",
                    "-a",
                    "llamacpp",
                    "--host",
                    "0.0.0.0",
                    "--port",
                    "11435",
                    "-ngl",
                    "99",
                    "-cb",
                    "-np",
                    "10",
                ],
            }
        ],
        "log": [
            _CTXSHIFT_6979 % 1714395994,
            _CTXSHIFT_6979 % 1714395995,
            '{"tid":"0x1da3a5ec0","timestamp":1714395995,"level":"INFO","function":"update_slots",'
            '"line":1845,"msg":"slot context shift","id_slot":3,"id_task":79,"n_keep":0,'
            '"n_left":50,"n_discard":25,"n_ctx":512',
        ],
    },
}
