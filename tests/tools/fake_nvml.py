"""NVML where no GPU is (this machine): one device whose compute processes a test decides. The
same code runs for real on the device machine (tests/gpu/verify_node_clean.py)."""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any


class FakeNvml:
    """One device; its compute processes are what :meth:`listed` says (``pids``, by default)."""

    def __init__(self, pids: Iterable[int] = ()) -> None:
        self.pids = list(pids)
        self.calls = 0
        """How often the compute processes were asked for (a wait on the driver shows here)."""

    def listed(self) -> list[int]:
        return list(self.pids)

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        self.calls += 1
        return [SimpleNamespace(pid=pid) for pid in self.listed()]
