"""What summary.md and report.md say of the ranks' last collectives (the real two-rank dumps are
in test_hangs_h200.py; these are the other shapes a flight recorder shows)."""

from __future__ import annotations

import pickle

import pytest

from engine_watchdog.hangs.collectives import (
    CollectiveView,
    collectives_lines,
    load_dump,
    parse_collectives,
)


def col(rank: int, op: str, seq: int | None, state: str = "scheduled") -> CollectiveView:
    return CollectiveView(rank, f"flight_recorder/rank{rank}_trace", op, state, seq)


@pytest.mark.parametrize(
    ("cols", "reading"),
    [
        (
            [
                col(0, "nccl:all_reduce", 7),
                col(1, "nccl:all_reduce", 6, "completed"),
                col(2, "nccl:all_reduce", 7),
                col(3, "nccl:all_reduce", 5, "completed"),
            ],
            "Ranks 0, 2 reached collective 7 (`nccl:all_reduce`, scheduled); ranks 1, 3 never "
            "issued it (their last: 6, 5): look at ranks 1, 3",
        ),
        (
            [col(0, "nccl:all_reduce", 4), col(1, "nccl:_allgather_base", 4)],
            "At collective 4 the ranks issued different collectives "
            "(nccl:_allgather_base, nccl:all_reduce).",
        ),
        (
            [col(0, "nccl:broadcast", 3, "started"), col(1, "nccl:broadcast", 3, "started")],
            "Every rank is at collective 3 (`nccl:broadcast`): none is behind.",
        ),
    ],
    ids=["ranks-behind", "mismatch", "together"],
)
def test_the_reading_names_the_ranks_to_look_at(cols: list[CollectiveView], reading: str) -> None:
    lines = collectives_lines(cols)
    assert lines[0] == "| rank | last collective | sequence | state |"
    assert len([ln for ln in lines if ln.startswith("| ") and "`" in ln]) == len(cols)
    assert reading in lines[-1]


def test_one_rank_or_no_sequence_numbers_give_the_table_alone() -> None:
    assert collectives_lines([col(0, "nccl:all_reduce", 2)])[-1].startswith("| 0 |")
    lines = collectives_lines([col(0, "nccl:all_reduce", None), col(1, "nccl:all_reduce", None)])
    assert lines[-1].startswith("| 1 |") and "| - |" in lines[-1]


def test_a_pickle_that_names_a_class_is_refused_not_run() -> None:
    """A dump of unknown origin may be a crafted pickle: no global is ever resolved."""
    crafted = pickle.dumps({"entries": [{"profiling_name": "x", "when": pickle.PickleError}]})
    with pytest.raises(ValueError, match="refused global"):
        load_dump(crafted)
    notes: list[str] = []
    files = {"flight_recorder/rank0_trace": crafted, "flight_recorder/index.json": b"{}"}
    assert parse_collectives(files, notes) is None
    assert "not read" in notes[0]
