"""The canary: a 1-token completion through the engine's own OpenAI API.

Sent only when the detector asks (progress flat with work present, or now and then while idle).
A completed canary proves the engine alive; one that times out is strong evidence of a stall.
Errors that say more about the canary than the engine (401 without the engine's --api-key,
404 for a wrong model, an answer that is not an OpenAI one) are reported as ``unusable:...`` and
never count as evidence. No answer, however bad, raises: each ends as an observation.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Callable

import aiohttp

from engine_watchdog.core.model import CanaryObs, Cause, HttpStatus
from engine_watchdog.engines.profile import EngineProfile
from engine_watchdog.net.connection import EngineConnection
from engine_watchdog.net.failures import TLS, TOO_LARGE
from engine_watchdog.net.http import Answer, fetch

_ids = itertools.count(1)
_RUN = secrets.token_hex(4)
"""In every canary's id, so that two watchdogs on one engine (a sidecar and a fleet watcher)
never share one: the simulator, like vLLM releases whose output processor refused a duplicate,
answers 400 "Request id ... already running" to the second in flight (seen with four watchdogs
on one simulator), and an abort by id would end the other watchdog's canary."""
UNUSABLE = "unusable:"


class Canary:
    """Sends canaries to one engine; remembers the served model name."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        connection: EngineConnection,
        timeout_s: float = 8.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.session = session
        self.connection = connection
        """Where and with which credential (the key on /v1, else the URL's Basic: never both)."""
        self.timeout_s = timeout_s
        self.clock = clock
        self.model: str | None = None
        self.pending: set[str] = set()
        """Engine-side ids of canaries in flight (an abort by id can end them)."""

    async def send(self, profile: EngineProfile) -> CanaryObs:
        """One canary to an engine of ``profile`` (its paths and its request ids); every
        answer, however bad, ends as an observation (never an exception)."""
        sent, started = self.clock(), time.monotonic()
        if self.model is None:
            self.model, failure = await self._discover_model(profile)
            if self.model is None:
                return CanaryObs(self.clock(), ok=False, error=failure, sent_t=sent)
        # One bound for the whole canary, model discovery included ("slower than this: failed").
        left = max(0.1, self.timeout_s - (time.monotonic() - started))
        answer = await self._complete(profile, self.model, left)
        ok, error = _judge(answer)
        latency = round(answer.elapsed_s, 4) if ok else None
        return CanaryObs(self.clock(), ok=ok, latency_s=latency, error=error, sent_t=sent)

    async def _discover_model(self, profile: EngineProfile) -> tuple[str | None, str]:
        """(the first model the engine serves, "") or (None, why not)."""
        path = profile.models_path
        conn = self.connection
        answer = await fetch(
            self.session, "GET", conn.url(path), timeout_s=self.timeout_s, access=conn.access
        )
        if answer.error in (TOO_LARGE, TLS):
            return None, f"{UNUSABLE} {path}: {answer.error}"
        if answer.error is not None or answer.status is None:
            # No answer at all: evidence, as any request.
            return None, answer.error or Cause.NO_ANSWER
        if answer.status != 200:
            return None, f"{UNUSABLE} {path} answered HTTP {answer.status}"
        doc = answer.json()
        if doc is None:
            return None, f"{UNUSABLE} {path} answered with something that is not JSON"
        model = _first_model(doc)
        if model is None:
            return None, f"{UNUSABLE} {path} lists no model (not an OpenAI model list)"
        return model, ""

    async def _complete(self, profile: EngineProfile, model: str, timeout_s: float) -> Answer:
        # A request id of our own: a stuck canary can be aborted by id where the engine allows.
        request_id = f"engine-watchdog-canary-{_RUN}-{next(_ids)}"
        # vLLM tracks a completion as cmpl-<X-Request-Id>-<prompt index> (openai/completion/
        # serving.py); that is the id its abort endpoint takes.
        engine_id = profile.canary_id_format.format(request_id)
        body = {"model": model, "prompt": "ping", "max_tokens": 1, "temperature": 0.0}
        url = self.connection.url(profile.completions_path)
        self.pending.add(engine_id)
        try:
            return await fetch(
                self.session,
                "POST",
                url,
                timeout_s=timeout_s,
                access=self.connection.access,
                json_body=body,
                headers={"X-Request-Id": request_id},
            )
        finally:
            self.pending.discard(engine_id)


def _judge(answer: Answer) -> tuple[bool, str | None]:
    """(ok, error) of a completion's answer."""
    if answer.error in (TOO_LARGE, TLS):
        return False, f"{UNUSABLE} completion: {answer.error}"
    if answer.error is not None or answer.status is None:
        return False, answer.error or Cause.NO_ANSWER  # timeout, disconnected...: evidence
    if answer.status >= 500:
        # The engine failed it (EngineDeadError is a 500).
        return False, HttpStatus.of(answer.status)
    if answer.status != 200:
        return False, f"{UNUSABLE} http-{answer.status}"  # our request's fault (4xx)
    choice = _first_choice(answer.json())
    if choice is None:
        return False, f"{UNUSABLE} the completion answer is not an OpenAI completion"
    if choice.get("finish_reason") == "abort":
        return False, "aborted"  # ended by an abort (ours, on a stuck engine): no proof of life
    return True, None


def _first_model(doc: object) -> str | None:
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return None
    ids = [m.get("id") for m in data if isinstance(m, dict)]
    return ids[0] if ids and isinstance(ids[0], str) and ids[0] else None


def _first_choice(doc: object) -> dict[str, object] | None:
    """The first of an answer's ``choices``; None when it is not an OpenAI completion."""
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    return choices[0]


def unusable_hint(error: str, has_key: bool) -> tuple[str, str] | None:
    """(kind, one line naming the fix) for a canary that cannot be used, said once; or None."""
    if not error.startswith(UNUSABLE):
        return None
    if "401" in error or "403" in error:
        if has_key:
            return "auth", (
                f"the engine refuses the canary's API key ({error}): give the key it was "
                "started with (--api-key-file, ENGINE_WATCHDOG_API_KEY or VLLM_API_KEY)"
            )
        return "auth", (
            f"the engine wants an API key for the canary ({error}): give it with "
            "--api-key-file PATH or ENGINE_WATCHDOG_API_KEY (vLLM's VLLM_API_KEY is read too); "
            "until then stalls are called only after --stall-seconds"
        )
    return error, f"the canary cannot be used ({error}); it proves nothing until that is fixed"
