"""The last collective each rank recorded, from PyTorch flight-recorder dumps in the bundle.

PyTorch writes the dumps as pickles by default (JSON on request). A pickle from a bundle of
unknown origin is never handed to :func:`pickle.loads`: the unpickler here refuses every global,
so no class is built and no callable runs. A flight-recorder dump needs none: it is dicts, lists,
tuples, strings, numbers and None (pytorch/tutorials prototype_source/flight_recorder_tutorial.rst
shows the layout: ``entries`` with ``profiling_name``, ``state``, ``collective_seq_id``).
"""

from __future__ import annotations

import io
import json
import pickle
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PREFIX = "flight_recorder/"
_RANK = re.compile(r"^rank(\d+)_")


@dataclass(frozen=True)
class CollectiveView:
    rank: int
    file: str
    op: str
    """``profiling_name`` of the last entry, e.g. ``nccl:all_reduce``."""
    state: str
    seq: int | None


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


def load_dump(data: bytes) -> Any:
    """A dump's content: JSON, or a pickle of plain data. Raises ValueError otherwise."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        pass
    try:
        return _NoGlobals(io.BytesIO(data)).load()
    except Exception as e:  # the pickle machinery raises many types for a bad stream
        why = f"{type(e).__name__}: {e}"[:160]
        raise ValueError(f"neither JSON nor a plain-data pickle ({why})") from None


def last_collective(dump: Any) -> tuple[str, str, int | None] | None:
    """(name, state, sequence id) of the dump's last entry, or None when it has none."""
    if not isinstance(dump, Mapping):
        return None
    entries = dump.get("entries")
    if not isinstance(entries, list):
        return None
    for entry in reversed(entries):
        if isinstance(entry, Mapping) and entry.get("profiling_name"):
            seq = entry.get("collective_seq_id")
            return (
                str(entry.get("profiling_name"))[:120],
                str(entry.get("state") or "")[:40],
                seq if isinstance(seq, int) and not isinstance(seq, bool) else None,
            )
    return None


def parse_collectives(
    files: Mapping[str, bytes], notes: list[str]
) -> tuple[CollectiveView, ...] | None:
    """One view per readable rank dump; None when the bundle holds no dump at all."""
    dumps = sorted(
        rel
        for rel in files
        if rel.startswith(PREFIX) and rel != PREFIX + "index.json" and "/" not in rel[len(PREFIX) :]
    )
    if not dumps:
        return None
    out = []
    for n, rel in enumerate(dumps):
        try:
            last = last_collective(load_dump(files[rel]))
        except ValueError as e:
            notes.append(f"{rel}: not read: {e}")
            continue
        if last is None:
            notes.append(f"{rel}: no collective entries")
            continue
        m = _RANK.match(rel[len(PREFIX) :])
        out.append(CollectiveView(int(m.group(1)) if m else n, rel, *last))
    return tuple(out) if out else None


def collectives_lines(cols: Sequence[CollectiveView]) -> list[str]:
    """A table of each rank's last collective, then what it says: a rank behind the others is
    the peer that never joined (PyTorch's analyser, torchfrtrace, says "Not all ranks joining
    collective ... missing ranks" of the same dumps; it also compares whole rings, this only the
    last entries)."""
    rows = ["| rank | last collective | sequence | state |", "|---|---|---|---|"]
    for c in sorted(cols, key=lambda c: c.rank):
        seq = "-" if c.seq is None else str(c.seq)
        rows.append(f"| {c.rank} | `{c.op}` | {seq} | {c.state or '-'} |")
    reading = _reading(cols)
    return [*rows, "", reading] if reading else rows


def _ranks(cols: Sequence[CollectiveView]) -> str:
    ranks = sorted(c.rank for c in cols)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _reading(cols: Sequence[CollectiveView]) -> str:
    known = [c for c in cols if c.seq is not None]
    if len(known) < 2:
        return ""
    top = max(c.seq or 0 for c in known)
    ahead = [c for c in known if c.seq == top]
    behind = [c for c in known if c.seq != top]
    ops = sorted({c.op for c in ahead})
    if behind:
        behind = sorted(behind, key=lambda c: c.rank)
        whose = "its last is" if len(behind) == 1 else "their last:"
        return (
            f"{_ranks(ahead).capitalize()} reached collective {top} (`{ops[0]}`, "
            f"{ahead[0].state or 'state unknown'}); {_ranks(behind)} never issued it ({whose} "
            f"{', '.join(str(c.seq) for c in behind)}): look at {_ranks(behind)}, "
            "the peer that never joined."
        )
    if len(ops) > 1:
        return f"At collective {top} the ranks issued different collectives ({', '.join(ops)})."
    return f"Every rank is at collective {top} (`{ops[0]}`): none is behind."
