"""Positive cases for the signatures added in issue 36 by helper h36a (see cases_positive.py)."""

from __future__ import annotations

from typing import Any

POSITIVE_H36A: dict[str, dict[str, Any]] = {}

POSITIVE_H36A["kvfull-llamacpp-4185-decode-retry"] = {
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
