"""Real GPU work for the simulator's engine cores (``sim --gpu``), through PyTorch on CUDA.

With it an engine core is a real CUDA process: NVML lists it on the GPU, its steps keep the
tensor cores busy, its ``spin`` fault waits in a kernel that spins on the clock (busy, no tensor,
no memory traffic: what a rank stuck in a collective its peer never joins looks like), and a
CUDA core dump of it names that kernel. PyTorch is imported only here, only with ``--gpu``.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import Any

MATMUL_N = 4096
"""Side of the bf16 matrices each step multiplies (about 0.2 ms apiece on an H200)."""

SPIN_CHUNK_CYCLES = 200_000_000
"""One spin kernel's length in GPU clock cycles (about 0.1 s): the stop condition is checked
between kernels, so clearing the fault ends the spin within about that long."""


class GpuUnavailableError(RuntimeError):
    """--gpu was asked for where PyTorch cannot use a CUDA GPU; the message says why."""


def load_torch() -> Any:
    """PyTorch with a usable CUDA device, or GpuUnavailableError naming the fix."""
    try:  # only with --gpu: the simulator itself needs no PyTorch
        torch = importlib.import_module("torch")
    except ImportError as exc:
        raise GpuUnavailableError(f"--gpu needs PyTorch with CUDA ({exc})") from None
    if not torch.cuda.is_available():
        raise GpuUnavailableError("--gpu needs a CUDA GPU: torch.cuda.is_available() is False")
    if not hasattr(torch.cuda, "_sleep"):
        raise GpuUnavailableError("--gpu needs torch.cuda._sleep (PyTorch 1.x or later)")
    return torch


class GpuWork:
    """One engine core's GPU: a pair of bf16 matrices on CUDA device 0."""

    def __init__(self) -> None:
        self.torch = load_torch()
        shape = (MATMUL_N, MATMUL_N)
        self.a = self.torch.randn(shape, device="cuda", dtype=self.torch.bfloat16)
        self.b = self.torch.randn(shape, device="cuda", dtype=self.torch.bfloat16)
        self.out = self.torch.empty(shape, device="cuda", dtype=self.torch.bfloat16)
        self.compute_until(time.monotonic() + 0.1)  # kernels loaded before the first step

    def compute_until(self, deadline: float) -> None:
        """Matrix products until ``deadline`` (monotonic): the tensor cores and DRAM busy."""
        while time.monotonic() < deadline:
            for _ in range(8):
                self.torch.matmul(self.a, self.b, out=self.out)
            self.torch.cuda.synchronize()

    def spin_until(self, stop: Callable[[], bool]) -> None:
        """Clock-spinning kernels, one after another, until ``stop()``: the GPU at 100 % with
        no tensor or memory activity, the host thread waiting in cudaDeviceSynchronize."""
        while not stop():
            self.torch.cuda._sleep(SPIN_CHUNK_CYCLES)
            self.torch.cuda.synchronize()
