"""name_culprit over real py-spy dumps of real gloo ranks (tests/data/multinode/README.md):
one test per fault kind, and the case where nothing tells a rank apart."""

from __future__ import annotations

from pathlib import Path

from engine_watchdog.capture.pyspy_text import parse_dump_text, rank_stack
from engine_watchdog.core.culprit import name_culprit
from engine_watchdog.core.ranks import Confidence, NodeReport, RankSample, RankState

DATA = Path(__file__).resolve().parents[1] / "data" / "multinode"


def sample(
    fixture: str,
    rank: int,
    node: str,
    state: RankState = RankState.SLEEPING,
    gpu_util: float | None = None,
    samples: int = 2,
) -> RankSample:
    texts = [(DATA / fixture / f"rank{rank}.s{s}.txt").read_text() for s in range(1, samples + 1)]
    pid = parse_dump_text(texts[0])[0].pid
    gpu = rank % 2 if gpu_util is not None else None
    stacks = tuple(rank_stack(t) for t in texts)
    return RankSample(node, rank, pid, state, stacks, gpu=gpu, gpu_util=gpu_util)


def two_nodes(ranks: list[RankSample], per_node: int = 2) -> list[NodeReport]:
    """Ranks 0..per_node-1 on worker-0, the next on worker-1, and so on."""
    nodes: dict[str, list[RankSample]] = {}
    for r in ranks:
        nodes.setdefault(r.node, []).append(r)
    return [NodeReport(n, True, tuple(rs)) for n, rs in nodes.items()]


def node_of(rank: int, per_node: int = 2) -> str:
    return f"worker-{rank // per_node}"


def test_parser_reads_native_and_python_frames_of_a_real_dump() -> None:
    text = (DATA / "native" / "rank0.s1.txt").read_text()
    (thread,) = parse_dump_text(text)
    assert thread.name == "MainThread" and thread.tid == thread.pid and not thread.active
    names = [f.name for f in thread.frames]
    assert "c10d::Work::wait" in names and "pthread_cond_wait" in names
    reduce = next(f for f in thread.frames if f.name == "all_reduce")
    assert reduce.file == "torch/distributed/distributed_c10d.py" and not reduce.native
    assert all(f.native for f in thread.frames if f.file.endswith(".so"))
    # The C++ lambda name holds parentheses of its own; its module is still the last one.
    assert any(f.name.startswith("pybind11::cpp_function::initialize") for f in thread.frames)
    assert rank_stack(text)[0].startswith("0x") and "(libc.so.6)" in rank_stack(text)[0]


def test_parser_gives_nothing_for_pyspys_error_text() -> None:
    text = "Process 1: python\n\nError: Failed to get stack traces\n\nCaused by:\n    0: x\n"
    assert parse_dump_text(text) == [] and rank_stack(text) == ()


def test_a_stopped_rank_among_ranks_waiting_in_all_reduce_is_named_high() -> None:
    # Rank 1 was SIGSTOPped inside all_reduce: its stack is the others'; only the state tells.
    ranks = [
        sample("stop", r, node_of(r), RankState.STOPPED if r == 1 else RankState.SLEEPING)
        for r in range(4)
    ]
    culprit = name_culprit(two_nodes(ranks))
    assert (culprit.confidence, culprit.node, culprit.rank) == (Confidence.HIGH, "worker-0", 1)
    assert culprit.rule == "rank-stopped" and culprit.pid == ranks[1].pid
    assert culprit.why == (
        "rank 1 on node worker-0 is stopped (SIGSTOP) while ranks 0, 2, 3 wait in all_reduce"
    )
    assert any(
        line.startswith("rank 1 on node worker-0") and "stopped" in line
        for line in culprit.evidence
    )


def test_a_dead_rank_is_named_high_with_its_gpu() -> None:
    ranks = [sample("skip", r, node_of(r), gpu_util=0.0) for r in (0, 2)]
    dead = RankSample("worker-0", 1, 4242, RankState.DEAD, gpu=1)
    culprit = name_culprit(two_nodes([ranks[0], dead, ranks[1]]))
    assert (culprit.confidence, culprit.rank, culprit.gpu) == (Confidence.HIGH, 1, 1)
    assert culprit.why == (
        "rank 1 on node worker-0 (GPU 1) is dead (its process is gone) while ranks 0, 2 wait "
        "in all_reduce"
    )


def test_a_rank_that_skipped_the_all_reduce_is_named_high() -> None:
    ranks = [sample("skip", r, node_of(r)) for r in range(3)]
    culprit = name_culprit(two_nodes(ranks))
    assert (culprit.confidence, culprit.node, culprit.rank) == (Confidence.HIGH, "worker-0", 1)
    assert culprit.rule == "outside-collective"
    assert culprit.why == (
        "rank 1 on node worker-0 is outside the collective (in main (gloo_ranks.py:40)) while "
        "ranks 0, 2 wait in all_reduce"
    )


def test_native_stacks_name_the_skipping_rank_too() -> None:
    ranks = [sample("native", r, f"node-{r}") for r in range(2)]
    culprit = name_culprit(two_nodes(ranks))
    # Two ranks: one waits, one does not; medium, since a single waiter confirms little.
    assert (culprit.confidence, culprit.rank, culprit.rule) == (
        Confidence.MEDIUM,
        1,
        "outside-collective",
    )
    assert "rank 0 waits in all_reduce" in culprit.why


def test_a_rank_busy_outside_the_barrier_is_named() -> None:
    ranks = [sample("barrier", r, f"node-{r}") for r in range(2)]
    culprit = name_culprit(two_nodes(ranks))
    assert (culprit.rank, culprit.node, culprit.rule) == (1, "node-1", "outside-collective")
    assert "busy_outside_collective" in culprit.why and "rank 0 waits in barrier" in culprit.why


def test_one_gpu_spinning_while_the_rest_idle_is_named_medium() -> None:
    # Every host stack alike (all in all_reduce): the GPUs tell (vllm-project/vllm#51921).
    ranks = [sample("stop", r, node_of(r), gpu_util=100.0 if r == 2 else 0.0) for r in range(4)]
    culprit = name_culprit(two_nodes(ranks))
    assert (culprit.confidence, culprit.node, culprit.rank, culprit.gpu) == (
        Confidence.MEDIUM,
        "worker-1",
        2,
        0,
    )
    assert culprit.why.startswith("rank 2 on node worker-1 (GPU 0) has its GPU at 100 %")


def test_one_stack_unchanged_while_the_others_move_is_named_medium() -> None:
    # Ranks 0 and 2 compute (their stacks move), rank 1 sits still outside any collective.
    moving = sample("barrier", 1, "worker-0")
    still = sample("skip", 1, "worker-0")
    ranks = [
        RankSample("worker-0", 0, 10, RankState.RUNNING, moving.stacks),
        RankSample("worker-0", 1, 11, RankState.SLEEPING, still.stacks),
        RankSample("worker-1", 2, 12, RankState.RUNNING, moving.stacks),
    ]
    # Rule 2 cannot fire: no rank waits in a collective.
    culprit = name_culprit(two_nodes(ranks))
    assert (culprit.confidence, culprit.rank, culprit.rule) == (
        Confidence.MEDIUM,
        1,
        "stack-unchanged",
    )
    assert culprit.why.endswith("while the stacks of ranks 0, 2 moved")


def test_the_only_node_that_did_not_answer_is_a_low_culprit() -> None:
    ranks = [sample("stop", r, node_of(r)) for r in range(2)]
    reports = [*two_nodes(ranks), NodeReport("worker-1", False, error="timed out after 5 s")]
    culprit = name_culprit(reports)
    assert (culprit.confidence, culprit.node, culprit.rank) == (Confidence.LOW, "worker-1", None)
    assert culprit.why.startswith("node worker-1 did not answer (timed out after 5 s)")
    assert "node worker-1 did not answer: timed out after 5 s" in culprit.evidence


def test_a_silent_node_is_in_the_evidence_of_another_judgement() -> None:
    ranks = [sample("skip", r, node_of(r)) for r in range(3)]
    reports = [*two_nodes(ranks), NodeReport("worker-2", False, error="connection refused")]
    culprit = name_culprit(reports)
    assert (
        culprit.rank == 1 and "node worker-2 did not answer: connection refused" in culprit.evidence
    )


def test_nothing_distinguishes_healthy_ranks() -> None:
    ranks = [sample("none", r, f"node-{r}", RankState.RUNNING) for r in range(2)]
    culprit = name_culprit(two_nodes(ranks))
    assert culprit.confidence is Confidence.NONE and culprit.rank is None
    assert culprit.why == (
        "no culprit: nothing tells one rank apart among ranks 0, 1 on 2 nodes "
        "(all wait in all_reduce)"
    )
    assert len(culprit.evidence) == 2


def test_many_ranks_across_many_nodes_are_written_as_ranges() -> None:
    stack = sample("stop", 0, "x").stacks
    ranks = [
        RankSample(f"node-{r // 8}", r, 100 + r, RankState.SLEEPING, stack, gpu=r % 8)
        for r in range(32)
    ]
    ranks[13] = RankSample("node-1", 13, 113, RankState.STOPPED, stack, gpu=5)
    culprit = name_culprit(two_nodes(ranks))
    assert culprit.why == (
        "rank 13 on node node-1 (GPU 5) is stopped (SIGSTOP) while ranks 0-12, 14-31 wait in "
        "all_reduce"
    )
    assert (culprit.node, culprit.gpu) == ("node-1", 5)


def test_a_rank_late_to_the_collective_in_one_sample_only_is_not_named() -> None:
    # A healthy group: the slowest rank is outside the collective now and then, not every time.
    ranks = [sample("skip", r, node_of(r)) for r in range(3)]
    waiting = ranks[0].stacks[0]
    ranks[1] = RankSample("worker-0", 1, 11, RankState.RUNNING, (waiting, ranks[1].stacks[1]))
    culprit = name_culprit(two_nodes(ranks))
    assert culprit.rule != "outside-collective"
