"""The API process: engine cores first, then the HTTP server, until a signal or engine death.

Like vLLM's API server: /health answers 200 while every engine core is alive (hung or not) and
503 once one is dead, after which the process exits 0 within a few seconds; /metrics is served
from the API process's own registry; the stats log line is written every interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import signal
import sys
import threading
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from engine_watchdog.sim.admin import AdminHandlers
from engine_watchdog.sim.api_metrics import SimMetrics
from engine_watchdog.sim.client import EngineDeadError, EngineGroup
from engine_watchdog.sim.faults import ApiFault, FaultSpec
from engine_watchdog.sim.openai import OpenAIHandlers
from engine_watchdog.sim.settings import SimSettings

log = logging.getLogger("engine_watchdog.sim.api")

DEAD_EXIT_DELAY_S = 2.0
"""After an engine core dies: time /health answers 503 before the process exits (vLLM: ~5 s)."""

HTTP_SHUTDOWN_TIMEOUT_S = 2.0
ACCESS_LOG_FORMAT = '%a - "%r" %s'
LOG_FORMAT = "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"
VERSION = "0.33.0+sim"


API_KEY_ENV = "VLLM_API_KEY"
GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")
"""vLLM's --api-key guards these (vllm/entrypoints/serve/middleware/authenticate.py); the
simulator reads the key from the variable vLLM falls back to (vllm/envs.py), not an argument."""


def _api_key_middleware(key: str) -> Any:
    @web.middleware
    async def authenticate(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method != "OPTIONS" and request.path.startswith(GUARDED_PREFIXES):
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token, key):
                return web.json_response({"error": "Unauthorized"}, status=401)
        response: web.StreamResponse = await handler(request)
        return response

    return authenticate


def build_app(
    settings: SimSettings, group: EngineGroup, metrics: SimMetrics, api_fault: ApiFault
) -> web.Application:
    key = os.environ.get(API_KEY_ENV)
    app = web.Application(middlewares=[_api_key_middleware(key)] if key else [])

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=503 if group.dead else 200)

    async def metrics_page(request: web.Request) -> web.Response:
        # vLLM serves it whatever the engines do (values stay where the last output left them);
        # llama-server asks its engine loop first, so a hung loop hangs the scrape too.
        if metrics.on_engine_loop:
            with contextlib.suppress(EngineDeadError):
                await group.call("metrics", {}, ranks=[0])
        return web.Response(
            body=metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def iteration_stats(request: web.Request) -> web.Response:
        return web.json_response(metrics.iteration_stats())

    async def version(request: web.Request) -> web.Response:
        return web.json_response({"version": VERSION})

    app.add_routes([web.get("/health", health), web.get(metrics.metrics_path, metrics_page)])
    if metrics.stats_path:  # trtllm-serve: JSON at /metrics
        app.add_routes([web.get(metrics.stats_path, iteration_stats)])
    app.add_routes([web.get("/version", version)])
    app.add_routes(OpenAIHandlers(settings, group, api_fault.on_inference).routes())
    app.add_routes(AdminHandlers(settings, group, metrics, api_fault).routes())
    return app


class _Lifetime:
    """When to stop, and with which exit code."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.exit_code = 0

    def engine_dead(self, exit_code: int) -> None:
        self.exit_code = exit_code
        asyncio.get_running_loop().call_later(DEAD_EXIT_DELAY_S, self.stop.set)

    def task_done(self, task: asyncio.Task[None]) -> None:
        # Every long-lived task runs until cancelled: if one ends otherwise, say why and stop.
        if task.cancelled():
            return
        log.error("task %s ended unexpectedly: %r", task.get_name(), task.exception())
        self.exit_code = 1
        self.stop.set()


async def _log_stats(group: EngineGroup, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        for stat_logger in group.stat_loggers:
            stat_logger.log()


async def serve(settings: SimSettings) -> int:
    """Run the API process until SIGTERM/SIGINT or engine death; return the exit code."""
    life = _Lifetime()
    metrics = SimMetrics(settings)
    group = EngineGroup(settings, metrics, life.engine_dead)
    api_fault = ApiFault(FaultSpec.from_settings(settings))
    try:
        await group.start()
    except (RuntimeError, OSError, ValueError, asyncio.TimeoutError) as exc:
        log.error("engine core start-up failed: %s", exc)
        await group.stop()
        return 1
    runner = web.AppRunner(
        build_app(settings, group, metrics, api_fault),
        access_log_format=ACCESS_LOG_FORMAT,
        shutdown_timeout=HTTP_SHUTDOWN_TIMEOUT_S,
        # vLLM's completion and chat routes are @with_cancellation: a client that goes away
        # aborts its request at once, even one waiting for its next token (vLLM's
        # @with_cancellation, vllm/entrypoints/utils.py).
        handler_cancellation=True,
    )
    await runner.setup()
    try:
        # uvicorn's default backlog, which vLLM's API server runs with (aiohttp's is 128: a
        # burst of a thousand connections would wait out SYN retries).
        await web.TCPSite(runner, settings.host, settings.port, backlog=2048).start()
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", settings.host, settings.port, exc)
        await group.stop()
        await runner.cleanup()
        return 1
    log.info("Starting vLLM API server 0 on http://%s:%d", settings.host, settings.port)
    return await _run_until_stopped(settings, life, group, runner, api_fault)


async def _run_until_stopped(
    settings: SimSettings,
    life: _Lifetime,
    group: EngineGroup,
    runner: web.AppRunner,
    api_fault: ApiFault,
) -> int:
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread:  # signal handlers can only be set there (run_sim may run elsewhere)
        for sig in signals:
            loop.add_signal_handler(sig, life.stop.set)
        api_fault.install_signal()
    tasks: list[asyncio.Task[None]] = []
    if not settings.disable_log_stats:
        tasks.append(
            asyncio.create_task(_log_stats(group, settings.log_stats_interval), name="log-stats")
        )
    for task in tasks:
        task.add_done_callback(life.task_done)
    try:
        await life.stop.wait()
    finally:
        log.info("Shutting down API server (exit code %d)", life.exit_code)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await group.stop()  # fails in-flight requests first, so their handlers end promptly
        await runner.cleanup()
        if in_main_thread:
            for sig in signals:
                loop.remove_signal_handler(sig)
    return life.exit_code


def run_sim(settings: SimSettings) -> int:
    """Run a simulated vLLM server (API process here, engine cores as children) until SIGTERM,
    SIGINT or engine death. Blocking; returns the process exit code (0 as vLLM's)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(
            stream=sys.stdout, level=logging.INFO, format=LOG_FORMAT, datefmt="%m-%d %H:%M:%S"
        )
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(serve(settings))
    return 130
