"""A positive case for SGLang's DP-attention MLP-sync all-gather wedge (cases_positive.py says
what a case holds)."""

from __future__ import annotations

from typing import Any

POSITIVE_SGLANG_DP: dict[str, dict[str, Any]] = {}

POSITIVE_SGLANG_DP["mlpsync-sglang-29123-gloo-allgather"] = {
    "kind": "positive",
    "expect": "sglang-dp-attn-mlp-sync-allgather-wedge",
    "source": ["https://github.com/sgl-project/sglang/issues/29123"],
    "why": "'Gloo timeout deadlock in disaggregated decode DP attention (all_gather_into_tensor)': "
    "a disaggregated decode worker with DP attention waits two hours (Gloo's default timeout) "
    "in the Gloo all_gather_into_tensor of dp_attn.py until SLURM kills the job; the traceback "
    "runs from the disaggregated decode loop into maybe_prepare_mlp_sync_batch and "
    "prepare_mlp_sync_batch: the MLP-sync all-gather the signature describes, seven weeks "
    "before #34582 and in a decode worker rather than at warm-up.",
    "taken": [
        "the two Gloo timeout errors the report quotes, verbatim (recv and send, 7200000 ms)",
        "the traceback's lines as quoted, verbatim, into engine.log (an exception's "
        "traceback, not a stack of the hung threads, so not a py-spy dump): "
        "run_scheduler_process (scheduler.py:4273), dispatch_event_loop (scheduler.py:4152), "
        "get_next_disagg_decode_batch_to_run (decode.py:1867), maybe_prepare_mlp_sync_batch "
        "(dp_attn.py:300) with the call to prepare_mlp_sync_batch",
    ],
    "left_out": [
        "the traceback's inner frames: the parts read end after the dp_attn.py frame, at "
        "'File \"/sgl-workspace/sglang'",
        "the launch command and environment: the parts read quote none, so --enable-dp-attention "
        "and the DP size are not in the bundle (the title and the decode.py frame say DP "
        "attention and disaggregated decode)",
        "the log file's other lines (only their names and line numbers, "
        "inkwell-copper-cn09_decode_w0.out:14155 and :14191, are given), versions, GPUs, "
        "node count",
    ],
    "bundle": {
        "engine": "sglang",
        "log": [
            "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
            "Timed out waiting 7200000ms for recv operation to complete",
            "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:129] "
            "Timed out waiting 7200000ms for send operation to complete",
            'File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 4273, '
            "in run_scheduler_process",
            "  scheduler.run_event_loop()",
            'File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 4152, '
            "in dispatch_event_loop",
            "  scheduler.event_loop_overlap_disagg_decode()",
            'File "/sgl-workspace/sglang/python/sglang/srt/disaggregation/decode.py", line 1867, '
            "in get_next_disagg_decode_batch_to_run",
            "  ret = self.dp_attn_adapter.maybe_prepare_mlp_sync_batch(ret)",
            'File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler_components/'
            'dp_attn.py", line 300, in maybe_prepare_mlp_sync_batch',
            "  batch = self.prepare_mlp_sync_batch(batch)",
        ],
    },
}
