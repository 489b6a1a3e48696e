"""Engine profiles: everything engine-specific (metric names, endpoints, process titles)."""

from engine_watchdog.engines.profile import EngineProfile
from engine_watchdog.engines.vllm import VLLM

PROFILES: dict[str, EngineProfile] = {VLLM.name: VLLM}

__all__ = ["PROFILES", "VLLM", "EngineProfile"]
