"""GPM (NVML's GPU Performance Monitoring, Hopper and later): activity over an interval.

A GPM metric is computed from two samples of a device. :class:`GpmSampler` keeps two sample
buffers per device and reuses the newer sample of one read as the older of the next, so each
read covers the whole interval since the previous one. Every call blocks (NVML).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

# NVML ids (nvml.h); numbers rather than module attributes so older nvidia-ml-py releases and
# the test fake need not define every name.
GPM_METRICS: dict[str, int] = {
    "graphics_util": 1,
    "sm_util": 2,
    "sm_occupancy": 3,
    "tensor_util": 5,
    "dram_bw_util": 10,
}
GPM_MIN_INTERVAL_S = 0.1
"""GPM samples closer than this give noise; the first sample of a pair is then taken again."""


@dataclass
class Device:
    """One GPU as the probe holds it."""

    index: int
    handle: Any
    gpm: list[Any] = field(default_factory=list)
    """Two GPM sample buffers ([previous, spare]) when GPM is supported."""
    gpm_t: float | None = None
    """When buffer 0 was filled (monotonic)."""


class GpmSampler:
    """GPM metrics of many devices; a device whose last sample is missing or older than
    ``max_age_s`` first gets a fresh one, ``interval_s`` before the second."""

    def __init__(
        self,
        nvml: Any,
        error: type[BaseException],
        *,
        monotonic: Callable[[], float],
        sleep: Callable[[float], None],
        interval_s: float,
        max_age_s: float,
    ) -> None:
        self.nvml, self._err = nvml, error
        self._monotonic, self._sleep = monotonic, sleep
        self._interval_s, self._max_age_s = interval_s, max_age_s

    def init(self, dev: Device) -> str | None:
        """Give ``dev`` its two sample buffers; a note when it has no usable GPM."""
        try:
            if not self.nvml.nvmlGpmQueryDeviceSupport(dev.handle).isSupportedDevice:
                return f"GPU {dev.index}: no GPM (before Hopper): no tensor/DRAM activity"
            dev.gpm = [self.nvml.nvmlGpmSampleAlloc(), self.nvml.nvmlGpmSampleAlloc()]
        except (self._err, AttributeError) as e:
            return f"GPU {dev.index}: GPM not usable: {e}"
        return None

    def read(self, devices: Sequence[Device]) -> dict[int, dict[str, float]]:
        """Device index -> GPM metric name -> percent since the previous read."""
        devs = [d for d in devices if d.gpm]
        now = self._monotonic()
        stale = [d for d in devs if d.gpm_t is None or now - d.gpm_t > self._max_age_s]
        for dev in stale:
            self._take(dev, 0)
        wait = self._interval_s if stale else 0.0
        recent = max((d.gpm_t for d in devs if d.gpm_t is not None), default=None)
        if recent is not None:
            wait = max(wait, GPM_MIN_INTERVAL_S - (self._monotonic() - recent))
        if wait > 0:
            self._sleep(wait)
        out = {}
        for dev in devs:
            if dev.gpm_t is None or not self._take(dev, 1):
                continue
            out[dev.index] = self._metrics(dev)
            dev.gpm.reverse()  # the new sample becomes the first of the next pair
        return out

    def _take(self, dev: Device, slot: int) -> bool:
        try:
            self.nvml.nvmlGpmSampleGet(dev.handle, dev.gpm[slot])
        except self._err:
            dev.gpm_t = None
            return False
        dev.gpm_t = self._monotonic()
        return True

    def _metrics(self, dev: Device) -> dict[str, float]:
        req = self.nvml.c_nvmlGpmMetricsGet_t()
        req.version = getattr(self.nvml, "NVML_GPM_METRICS_GET_VERSION", 1)
        req.numMetrics = len(GPM_METRICS)
        req.sample1, req.sample2 = dev.gpm[0], dev.gpm[1]
        for i, metric_id in enumerate(GPM_METRICS.values()):
            req.metrics[i].metricId = metric_id
        try:
            self.nvml.nvmlGpmMetricsGet(req)
        except self._err:
            return {}
        return {
            name: round(float(req.metrics[i].value), 2)
            for i, name in enumerate(GPM_METRICS)
            if int(req.metrics[i].nvmlReturn) == 0
        }
