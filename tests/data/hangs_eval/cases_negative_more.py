"""More healthy or benign cases (see cases_negative.py)."""

from __future__ import annotations

from typing import Any

NEGATIVE_MORE: dict[str, dict[str, Any]] = {}

NEGATIVE_MORE["healthy-llamacpp-5104-one-context-shift"] = {
    "kind": "healthy",
    "source": ["https://github.com/ggml-org/llama.cpp/pull/5104"],
    "why": "A llama.cpp server log from the self-extend PR's discussion (comment by "
    "Maximilian-Winter, 2024-01-28): one request shifts its context once, finishes and is "
    "answered 200. One shift is a normal long generation, not the endless loop.",
    "taken": [
        "the command line: llama.cpp/server -m neural-chat-7b-v3-3.Q8_0.gguf -c 6860 -ngl 33 "
        "-b 1024 -t 8",
        "the server log from 'Available slots' to the request line, verbatim (timing figures "
        "included as quoted)",
    ],
    "left_out": ["GPU figures, versions"],
    "bundle": {
        "engine": "llamacpp",
        "procs": [
            {
                "pid": 1,
                "role": "api-server",
                "cmdline": [
                    "llama.cpp/server",
                    "-m",
                    "neural-chat-7b-v3-3.Q8_0.gguf",
                    "-c",
                    "6860",
                    "-ngl",
                    "33",
                    "-b",
                    "1024",
                    "-t",
                    "8",
                ],
            }
        ],
        "log": [
            "Available slots:",
            " -> Slot 0 - max context: 6860",
            '{"timestamp":1706432998,"level":"INFO","function":"main","line":2546,"message":'
            '"model loaded"}',
            "all slots are idle and system prompt is empty, clear the KV cache",
            "slot 0 is processing [task id: 0]",
            "slot 0 : in cache: 0 tokens | to process: 6852 tokens",
            "slot 0 : kv cache rm - [0, end)",
            "slot 0: context shift - n_keep = 0, n_left = 6858, n_discard = 3429",
            "",
            "print_timings: prompt eval time =    6478.14 ms /  6852 tokens (    0.95 ms per "
            "token,  1057.71 tokens per second)",
            "print_timings:        eval time =     726.26 ms /    17 runs   (   42.72 ms per "
            "token,    23.41 tokens per second)",
            "print_timings:       total time =    7204.41 ms",
            "slot 0 released (3440 tokens in cache)",
            '{"timestamp":1706433011,"level":"INFO","function":"log_server_request","line":2366,'
            '"message":"request","remote_addr":"127.0.0.1","remote_port":64254,"status":200,'
            '"method":"POST","path":"/completion","params":{}}',
        ],
    },
}
