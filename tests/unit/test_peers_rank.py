"""Which torch.distributed rank a node's process is, as its sidecar reads it (peers/node.py):
``RANK`` from /proc/PID/environ, else a vLLM worker title that alone names it."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_watchdog.peers.node import rank_of


def fake_proc(root: Path, pid: int, environ: bytes) -> Path:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "environ").write_bytes(environ)
    (root / str(pid) / "status").write_text("Name:\tpython\nPPid:\t1\n")
    return root


@pytest.mark.parametrize(
    ("title", "rank"),
    [
        ("VLLM::Worker_TP3", 3),  # tensor parallelism alone: the TP rank is the rank
        ("custom::Worker_TP12", 12),  # VLLM_PROCESS_NAME_PREFIX
        ("VLLM::Worker_PP1_TP0", -1),  # the rank needs the TP size, which no title has
        ("VLLM::Worker_DP1_TP0", -1),
        ("VLLM::Worker_TP0_EP0", -1),
        ("VLLM::Worker", -1),
        ("python gloo_rank.py Worker_TP1", -1),  # not a title, a command line
    ],
)
def test_a_titled_rank_whose_environment_setproctitle_zeroed(
    tmp_path: Path, title: str, rank: int
) -> None:
    root = fake_proc(tmp_path, 40, b"\0" * 64)  # what setproctitle leaves of it
    assert rank_of(40, root, title) == rank


def test_rank_variable_first_and_an_unreadable_process(tmp_path: Path) -> None:
    root = fake_proc(tmp_path, 40, b"PATH=/usr/bin\0RANK=5\0")
    assert rank_of(40, root, "VLLM::Worker_TP1") == 5
    assert rank_of(41, root, "") == -1  # gone, or another UID's
    assert rank_of(41, root, "VLLM::Worker_TP2") == 2
