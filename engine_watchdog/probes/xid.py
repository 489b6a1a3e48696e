"""Xid events: the critical errors NVML reports per GPU, collected without waiting at each sample.

Every call blocks (NVML); the GPU probe makes them under its own lock.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from engine_watchdog.probes.gpm import Device

NVML_ERROR_TIMEOUT = 10
XID_CRITICAL_ERROR_EVENT = 0x8
XID_KEEP = 256
XID_DRAIN_MAX = 64


@dataclass(frozen=True)
class XidEvent:
    t: float
    gpu: int | None
    xid: int


class XidEvents:
    """An NVML event set for the Xid critical errors of every device, and the newest XID_KEEP
    events seen since :meth:`register`."""

    def __init__(self, nvml: Any, error: type[BaseException], clock: Callable[[], float]) -> None:
        self.nvml, self._err, self._clock = nvml, error, clock
        self.event_set: Any | None = None
        self._seen: deque[XidEvent] = deque(maxlen=XID_KEEP)

    def register(self, devices: Sequence[Device]) -> list[str]:
        """Create the event set and register every device; a note for each thing that failed."""
        try:
            self.event_set = self.nvml.nvmlEventSetCreate()
        except (self._err, AttributeError) as e:
            return [f"Xid events not available: {e}"]
        notes = []
        for dev in devices:
            try:
                self.nvml.nvmlDeviceRegisterEvents(
                    dev.handle, XID_CRITICAL_ERROR_EVENT, self.event_set
                )
            except self._err as e:
                notes.append(f"GPU {dev.index}: Xid events not available: {e}")
        return notes

    def drain(self) -> str | None:
        """Collect the events queued since the last call, without waiting (0 ms). Returns a note
        when waiting on the event set fails (it is then given up)."""
        if self.event_set is None:
            return None
        wait = getattr(self.nvml, "nvmlEventSetWait_v2", None) or self.nvml.nvmlEventSetWait
        for _ in range(XID_DRAIN_MAX):
            try:
                data = wait(self.event_set, 0)
            except self._err as e:
                if getattr(e, "value", None) == NVML_ERROR_TIMEOUT:
                    return None
                self.event_set = None
                return f"Xid event wait failed: {e}"
            self._seen.append(
                XidEvent(self._clock(), self._index_of(data.device), int(data.eventData))
            )
        return None

    def _index_of(self, handle: Any) -> int | None:
        try:
            return int(self.nvml.nvmlDeviceGetIndex(handle))
        except (self._err, AttributeError):
            return None

    def events(self) -> tuple[XidEvent, ...]:
        return tuple(self._seen)

    def close(self) -> None:
        """Free the event set (errors ignored: this is shutting down)."""
        if self.event_set is not None:
            free = self.nvml.nvmlEventSetFree
            with contextlib.suppress(self._err):
                free(self.event_set)
        self.event_set = None
