"""The canary: a 1-token completion through the engine's own OpenAI API.

Sent only when the detector asks (progress flat with work present, or now and then while idle).
A completed canary proves the engine alive; one that times out is strong evidence of a stall.
Errors that say more about the canary than the engine (401 with --api-key, 404 for a wrong
model) are reported as ``unusable:...`` and never count as evidence.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable

import aiohttp

from engine_watchdog.core.model import CanaryObs
from engine_watchdog.engines.profile import EngineProfile
from engine_watchdog.net.http import error_code

_ids = itertools.count(1)


class Canary:
    """Sends canaries to one engine; remembers the served model name."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        profile: EngineProfile,
        timeout_s: float = 8.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.session = session
        self.base_url = base_url
        self.profile = profile
        self.timeout_s = timeout_s
        self.clock = clock
        self.model: str | None = None
        self.pending: set[str] = set()
        """Engine-side ids of canaries in flight (an abort by id can end them)."""

    async def send(self) -> CanaryObs:
        sent = self.clock()
        started = time.monotonic()
        try:
            model = self.model or await self._discover_model()
            status, finish = await self._complete(model)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            return CanaryObs(self.clock(), ok=False, error=error_code(exc), sent_t=sent)
        except LookupError as exc:
            return CanaryObs(self.clock(), ok=False, error=f"unusable: {exc}", sent_t=sent)
        latency = time.monotonic() - started
        if status == 200 and finish == "abort":
            # Ended by an abort (ours, on a stuck engine): no proof of life.
            return CanaryObs(self.clock(), ok=False, error="aborted", sent_t=sent)
        if status == 200:
            return CanaryObs(self.clock(), ok=True, latency_s=round(latency, 4), sent_t=sent)
        # 5xx: the engine failed it (vLLM's EngineDeadError is a 500); 4xx: our request's fault.
        error = f"http-{status}" if status >= 500 else f"unusable: http-{status}"
        return CanaryObs(self.clock(), ok=False, latency_s=None, error=error, sent_t=sent)

    async def _discover_model(self) -> str:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        url = self.base_url + self.profile.models_path
        async with self.session.get(url, timeout=timeout) as resp:
            if resp.status != 200:
                raise LookupError(f"{self.profile.models_path} answered HTTP {resp.status}")
            data = await resp.json(content_type=None)
        models = [m.get("id") for m in data.get("data", []) if isinstance(m, dict)]
        if not models or not isinstance(models[0], str):
            raise LookupError(f"{self.profile.models_path} lists no model")
        self.model = models[0]
        return self.model

    async def _complete(self, model: str) -> tuple[int, str | None]:
        """(HTTP status, the first choice's finish_reason)."""
        # A request id of our own: a stuck canary can be aborted by id where the engine allows.
        request_id = f"engine-watchdog-canary-{next(_ids)}"
        headers = {"X-Request-Id": request_id}
        # vLLM tracks a completion as cmpl-<X-Request-Id>-<prompt index> (openai/completion/
        # serving.py); that is the id its abort endpoint takes.
        engine_id = self.profile.canary_id_format.format(request_id)
        body = {"model": model, "prompt": "ping", "max_tokens": 1, "temperature": 0.0}
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        url = self.base_url + self.profile.completions_path
        self.pending.add(engine_id)
        try:
            async with self.session.post(url, json=body, headers=headers, timeout=timeout) as resp:
                text = await resp.text()
                return resp.status, _finish_reason(text) if resp.status == 200 else None
        finally:
            self.pending.discard(engine_id)


def _finish_reason(text: str) -> str | None:
    try:
        choices = json.loads(text).get("choices") or [{}]
        reason = choices[0].get("finish_reason")
    except (ValueError, AttributeError, IndexError):
        return None
    return reason if isinstance(reason, str) else None
