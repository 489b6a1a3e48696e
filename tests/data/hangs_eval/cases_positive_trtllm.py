"""Positive cases for TensorRT-LLM disaggregated-serving hangs (see cases_positive.py)."""

from __future__ import annotations

from typing import Any

POSITIVE_TRTLLM: dict[str, dict[str, Any]] = {}

POSITIVE_TRTLLM["gentransfer-trtllm-14414-gb300-pp-executor"] = {
    "kind": "positive",
    "expect": "trtllm-disagg-gen-transfer-status-block",
    "source": ["https://github.com/NVIDIA/TensorRT-LLM/pull/14414"],
    "why": "'avoid indefinite block in disagg gen-side KV transfer': on gb300 NVL72 the "
    "receiver-side disaggregated KV transfer of the CI's ctxtp2_genpp2 configuration leaves the "
    "generation worker's PP executor loop stuck inside _recv_disagg_gen_cache -> "
    "_check_disagg_gen_cache_transfer_status -> kv_cache_transceiver.check_gen_transfer_status "
    "(CacheTransceiver::checkGenTransferStatus's bare std::future::get() on a receive whose "
    "sender never completes) until the 300 s server-start timeout gives up.",
    "taken": [
        "the executor thread's Python frames the description names, innermost first: "
        "check_gen_transfer_status, _check_disagg_gen_cache_transfer_status, "
        "_recv_disagg_gen_cache (no files or lines: the description gives the chain only)",
    ],
    "left_out": [
        "a verbatim dump (the description names the chain, it quotes no py-spy output)",
        "the native frame under it (the description names CacheTransceiver::checkGenTransferStatus "
        "and its std::future::get() as the cause, not as a captured frame)",
        "the GPUs (gb300 NVL72: no count, utilisation or power), command lines, logs and the "
        "TensorRT-LLM version",
    ],
    "bundle": {
        "engine": "trtllm",
        "procs": [
            {
                "pid": 1,
                "role": "worker",
                "stacks": [
                    {
                        "name": "MainThread",
                        "frames": [
                            "check_gen_transfer_status",
                            "_check_disagg_gen_cache_transfer_status",
                            "_recv_disagg_gen_cache",
                        ],
                    }
                ],
            }
        ],
    },
}
