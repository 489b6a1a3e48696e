"""Control endpoints: vLLM's abort endpoints with their gating, its dev-mode endpoints, and the
simulator's own fault control under ``/sim``.

vLLM runs pause, is_paused, sleep and wake_up on the engine core's busy loop, so they hang while
the loop is hung; here too (clients must time out). Aborts finish requests in the API process
and only then tell the engine, so they work against a hung engine, but cannot unblock it.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from engine_watchdog.sim.api_metrics import SimMetrics
from engine_watchdog.sim.client import EngineDeadError, EngineGroup
from engine_watchdog.sim.faults import API_FAULTS, ApiFault, FaultError, FaultSpec
from engine_watchdog.sim.openai import bad_request, engine_dead
from engine_watchdog.sim.settings import SimSettings

SCALE_OUT_DISABLED = "Scale-out endpoints are disabled. Set --enable-scale-out to enable them."
PAUSE_MODES = ("abort", "wait", "keep")
SLEEP_LEVELS = (1, 2)


class AdminHandlers:
    """Abort, dev-mode and /sim routes of one simulated server."""

    def __init__(
        self, settings: SimSettings, group: EngineGroup, metrics: SimMetrics, api_fault: ApiFault
    ) -> None:
        self.settings = settings
        self.group = group
        self.metrics = metrics
        self.api_fault = api_fault
        self.engine_default = FaultSpec.from_settings(settings)
        if settings.fault not in API_FAULTS and settings.fault != "none":
            armed = {
                "fault": settings.fault,
                "state": "armed",
                "params": self.engine_default.to_wire(),
            }
            for rank in range(settings.data_parallel_size):
                group.fault_states.setdefault(rank, armed)

    def routes(self) -> list[web.RouteDef]:
        routes = [
            web.post("/inference/v1/abort_requests", self.scale_out_abort),
            web.get("/sim/fault", self.get_fault),
            web.post("/sim/fault", self.post_fault),
            web.get("/sim/requests", self.list_requests),
        ]
        if self.settings.dev_mode:  # vLLM registers these only with VLLM_SERVER_DEV_MODE=1
            routes += [
                web.post("/abort_requests", self.abort),
                web.post("/pause", self.pause),
                web.post("/resume", self.resume),
                web.get("/is_paused", self.is_paused),
                web.post("/sleep", self.sleep),
                web.post("/wake_up", self.wake_up),
                web.get("/is_sleeping", self.is_sleeping),
            ]
        return routes

    async def scale_out_abort(self, request: web.Request) -> web.Response:
        """vLLM's scale-out endpoint needs the ids (400 without them)."""
        if not self.settings.enable_scale_out:
            return web.json_response({"error": SCALE_OUT_DISABLED}, status=403)
        return await self._abort(request, all_if_empty=False)

    async def abort(self, request: web.Request) -> web.Response:
        """Dev mode's endpoint: empty or missing request_ids abort every in-flight request
        (vLLM 0.32 entrypoints/rl/online/api_router.py)."""
        return await self._abort(request, all_if_empty=True)

    async def _abort(self, request: web.Request, all_if_empty: bool) -> web.Response:
        try:
            body = await request.json() if request.can_read_body else {}
        except ValueError:
            body = None
        ids = body.get("request_ids") if isinstance(body, dict) else None
        if all_if_empty and isinstance(body, dict) and not ids:
            ids = list(self.group.requests)
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            return bad_request('expected {"request_ids": ["...", ...]}', "request_ids").response()
        return web.json_response({"aborted": self.group.abort(ids)})

    async def pause(self, request: web.Request) -> web.Response:
        mode = request.query.get("mode", "abort")
        if mode not in PAUSE_MODES:
            return bad_request(f"mode must be one of {', '.join(PAUSE_MODES)}", "mode").response()
        return await self._call("pause", {"mode": mode}, lambda _: {"status": "paused"})

    async def resume(self, request: web.Request) -> web.Response:
        return await self._call("resume", {}, lambda _: {"status": "resumed"})

    async def is_paused(self, request: web.Request) -> web.Response:
        return await self._call("is_paused", {}, lambda r: {"is_paused": all(r)})

    async def is_sleeping(self, request: web.Request) -> web.Response:
        return await self._call("is_sleeping", {}, lambda r: {"is_sleeping": any(r)})

    async def sleep(self, request: web.Request) -> web.Response:
        try:
            level = int(request.query.get("level", "1"))
        except ValueError:
            level = 0
        if level not in SLEEP_LEVELS:
            return bad_request("level must be 1 or 2", "level").response()
        response = await self._call("sleep", {"level": level}, lambda _: {"status": "sleeping"})
        if response.status == 200:
            for rank in range(self.settings.data_parallel_size):
                self.metrics.set_sleep_level(rank, level)
        return response

    async def wake_up(self, request: web.Request) -> web.Response:
        response = await self._call("wake_up", {}, lambda _: {"status": "awake"})
        if response.status == 200:
            for rank in range(self.settings.data_parallel_size):
                self.metrics.set_sleep_level(rank, 0)
        return response

    async def _call(self, method: str, args: dict[str, Any], shape: Any) -> web.Response:
        try:
            results = await self.group.call(method, args)
        except EngineDeadError:
            return engine_dead().response()
        return web.json_response(shape(results))

    async def get_fault(self, request: web.Request) -> web.Response:
        return web.json_response(self._fault_doc())

    async def post_fault(self, request: web.Request) -> web.Response:
        """``{"fault": NAME, ...params, "engine": "0"?}``; ``{"fault": "none"}`` clears."""
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise FaultError("expected a JSON object")
            ranks = self._ranks(body.pop("engine", None))
            if body.get("fault") in API_FAULTS:
                self.api_fault.arm_now(self.api_fault.spec.with_request(body))
                return web.json_response(self._fault_doc())
            spec = self.engine_default.with_request(body)
        except (ValueError, FaultError) as exc:
            return bad_request(str(exc), "fault").response()
        if spec.name == "none":
            self.api_fault.clear(FaultSpec())
        try:
            states = await self.group.call("set_fault", {"spec": spec.to_wire()}, ranks)
        except EngineDeadError:
            return engine_dead().response()
        for rank, state in zip(ranks, states, strict=True):
            self.group.fault_states[rank] = state
        return web.json_response(self._fault_doc())

    def _ranks(self, engine: Any) -> list[int]:
        ranks = list(range(self.settings.data_parallel_size))
        if engine is None:
            return ranks
        if str(engine) not in {str(r) for r in ranks}:
            raise FaultError(f"no engine {engine!r}; engines are {', '.join(map(str, ranks))}")
        return [int(engine)]

    def _fault_doc(self) -> dict[str, Any]:
        idle = {"fault": "none", "state": "idle"}
        engines = {
            str(r): self.group.fault_states.get(r, idle)
            for r in range(self.settings.data_parallel_size)
        }
        return {"api": self.api_fault.describe(), "engines": engines}

    async def list_requests(self, request: web.Request) -> web.Response:
        """In-flight requests as the API process sees them (a simulator extra, for tests)."""
        now = time.monotonic()
        rows = [
            {
                "request_id": s.request_id,
                "engine": str(s.rank),
                "prompt_tokens": s.prompt_tokens,
                "max_tokens": s.max_tokens,
                "generated_tokens": s.num_generated,
                "age_s": round(now - s.arrival, 3),
            }
            for s in self.group.requests.values()
        ]
        return web.json_response({"requests": rows})
