"""Engine profiles: everything engine-specific (metric names, endpoints, process titles)."""

from engine_watchdog.engines.llamacpp import LLAMACPP
from engine_watchdog.engines.profile import EngineProfile
from engine_watchdog.engines.sglang import SGLANG
from engine_watchdog.engines.tgi import TGI
from engine_watchdog.engines.trtllm import TRTLLM
from engine_watchdog.engines.vllm import VLLM

PROFILES: dict[str, EngineProfile] = {p.name: p for p in (VLLM, SGLANG, TGI, LLAMACPP, TRTLLM)}

__all__ = ["LLAMACPP", "PROFILES", "SGLANG", "TGI", "TRTLLM", "VLLM", "EngineProfile"]
