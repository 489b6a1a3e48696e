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
from collections.abc import Mapping
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
