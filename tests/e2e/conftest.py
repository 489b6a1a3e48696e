"""Fixtures for end-to-end tests against a REAL vLLM server on the CPU.

A test module gets one server for all its tests through the module-scoped ``vllm_server``
fixture. It may tune that server with module attributes::

    VLLM_EXTRA_ARGS = ["--enable-scale-out"]
    VLLM_EXTRA_ENV = {"VLLM_SERVER_DEV_MODE": "1"}

or start servers of its own with ``vllm_server_factory(extra_args=..., extra_env=...)``; every
server is stopped (its whole process group, SIGCONT first) when the module ends, whatever
happened. When a test fails, the tail of each live server's log is added to its report.

The vLLM venv and the tiny model are prepared once, after collection and before the first test,
only when e2e tests were selected, so their cost (minutes, cold) stays outside the per-test
timeout. ``python tests/tools/vllm_env.py`` does it ahead of time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.tools.llama_server import (
    LlamaServer,
    LlamaServerError,
    build_shim,
    launch,
    server_env,
    stop,
    wait_ready,
)
from tests.tools.llama_server_build import LOCK_TIMEOUT_S as LLAMA_LOCK_TIMEOUT_S
from tests.tools.llama_server_build import ensure_llama_server
from tests.tools.vllm_env import (
    CACHE_DIR,
    NEWEST,
    OLDEST,
    VllmEnv,
    VllmEnvError,
    ensure_vllm_env,
    prebuild_in_background,
    stop_prebuild,
)
from tests.tools.vllm_server import LIVE_SERVERS, VllmServer, start_server, stop_server

ServerFactory = Callable[..., VllmServer]

_PREPARED: dict[str, VllmEnv | VllmEnvError] = {}


def _wants_e2e(items: Sequence[pytest.Item]) -> bool:
    return any(item.get_closest_marker("e2e") is not None for item in items)


LLAMACPP_MODULE = "test_llamacpp.py"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist every e2e test runs in one worker (tests/conftest.py), which builds
    the vLLM venv on first use, so the first test may take long. The real-llama.cpp module
    goes last: its server is compiled in the background from the suite's start (minutes on a
    fresh machine; make test), and the vLLM modules before it leave that build the time."""
    for item in items:
        if item.path.name == LLAMACPP_MODULE:
            # Its first test may wait on the background build's lock, which is bounded itself.
            item.add_marker(pytest.mark.timeout(LLAMA_LOCK_TIMEOUT_S + 300))
        elif item.get_closest_marker("e2e") is not None:
            item.add_marker(pytest.mark.timeout(900))
    items.sort(key=lambda item: item.path.name == LLAMACPP_MODULE)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Prepare the vLLM venv and model before the first test, if any e2e test will run (not
    under xdist: there every worker collects every test, and only the e2e one needs it)."""
    if hasattr(session.config, "workerinput"):
        return
    if session.config.option.collectonly or not _wants_e2e(session.items):
        return
    started = time.monotonic()
    try:
        _PREPARED["env"] = ensure_vllm_env()
    except VllmEnvError as exc:
        _PREPARED["env"] = exc
    elapsed = time.monotonic() - started
    if elapsed > 1.0:
        print(f"\n[e2e] vLLM venv and tiny model prepared in {elapsed:.1f} s")


@pytest.fixture(scope="session")
def vllm_env(request: pytest.FixtureRequest) -> Iterator[VllmEnv]:
    """The newest build's environment; the oldest build's venv, if a selected test runs on
    it, is built meanwhile in the background (minutes in a fresh clone: beside the newest's
    build and the first modules instead of after them)."""
    wanted = any(f"vllm-{OLDEST}" in item.nodeid for item in request.session.items)
    log = CACHE_DIR / f"vllm-venv-{OLDEST}-prebuild.log"
    prebuild = prebuild_in_background(OLDEST, log) if wanted else None
    try:
        yield _newest_env()
    finally:
        stop_prebuild(prebuild)


def _newest_env() -> VllmEnv:
    prepared = _PREPARED.get("env")
    if prepared is None:  # e.g. a test without the e2e marker asked for it
        try:
            prepared = ensure_vllm_env()
        except VllmEnvError as exc:
            prepared = exc
        _PREPARED["env"] = prepared
    if isinstance(prepared, VllmEnvError):
        pytest.fail(f"vLLM environment unavailable: {prepared}", pytrace=False)
    return prepared


@pytest.fixture(scope="module")
def vllm_version() -> str:
    """The vLLM CPU build a module's servers run; a module overrides this fixture (e.g.
    parametrized over NEWEST and OLDEST) to run its tests on several releases."""
    return NEWEST


@pytest.fixture(scope="module")
def vllm_server_factory(
    vllm_env: VllmEnv, vllm_version: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerFactory]:
    """Start real vLLM servers; all of them are stopped when the module ends."""
    servers: list[VllmServer] = []
    if vllm_version != NEWEST:
        try:
            vllm_env = ensure_vllm_env(vllm_version)
        except VllmEnvError as exc:
            pytest.fail(f"vLLM {vllm_version} environment unavailable: {exc}", pytrace=False)

    def start(
        extra_args: Sequence[str] = (),
        extra_env: Mapping[str, str] | None = None,
        api_key: str | None = None,
    ) -> VllmServer:
        log_dir = tmp_path_factory.mktemp("vllm")
        server = start_server(
            vllm_env,
            log_dir / "server.log",
            extra_args=extra_args,
            extra_env=extra_env,
            api_key=api_key,
        )
        servers.append(server)
        print(f"\n[e2e] vLLM {vllm_version} ready on {server.base_url} in {server.startup_s:.1f} s")
        return server

    try:
        yield start
    finally:
        for server in servers:
            stop_server(server)


@pytest.fixture(scope="module")
def vllm_server(request: pytest.FixtureRequest, vllm_server_factory: ServerFactory) -> VllmServer:
    """One real vLLM server per test module (see the module docstring for tuning)."""
    extra_args: Sequence[str] = getattr(request.module, "VLLM_EXTRA_ARGS", ())
    extra_env: Mapping[str, str] | None = getattr(request.module, "VLLM_EXTRA_ENV", None)
    return vllm_server_factory(extra_args=extra_args, extra_env=extra_env)


@dataclass(frozen=True)
class LlamaKit:
    """What the real-llama.cpp tests start servers from."""

    binary: Path
    version: str
    model: Path
    shim: Path
    workdir: Path


@pytest.fixture(scope="session")
def llama_kit(tmp_path_factory: pytest.TempPathFactory) -> LlamaKit:
    """llama-server (built once per machine: tests/tools/llama_server_build.py; make test
    starts it in the background, this waits on its lock), the tiny GGUF (written per session,
    half a second) and the stall shim (compiled per session)."""
    try:
        built = ensure_llama_server()
    except VllmEnvError as exc:
        pytest.fail(f"llama-server unavailable: {exc}", pytrace=False)
    from tests.tools.make_tiny_gguf import write_tiny_gguf  # gguf and numpy: these tests only

    workdir = tmp_path_factory.mktemp("llamacpp")
    model = write_tiny_gguf(workdir / "tiny.gguf")
    try:
        shim = build_shim(workdir)
    except (LlamaServerError, OSError) as exc:
        pytest.fail(f"stall shim unavailable: {exc}", pytrace=False)
    return LlamaKit(built.binary, built.version, model, shim, workdir)


def start_llama(kit: LlamaKit, name: str, trigger: Path) -> LlamaServer:
    """A server with the stall shim preloaded: while ``trigger`` exists, its inference thread
    waits inside a decode (tests/data/llamacpp/stall_shim.c)."""
    env = server_env(kit.shim, trigger)
    server = launch(kit.binary, kit.model, kit.workdir / f"{name}.log", env)
    try:
        wait_ready(server)
    except BaseException:
        stop(server)
        raise
    return server


@pytest.fixture(scope="module")
def llama_server(llama_kit: LlamaKit) -> Iterator[tuple[LlamaServer, Path]]:
    """One llama-server per module and its stall trigger (absent); stopped after (its group,
    SIGCONT first), whatever happened."""
    trigger = llama_kit.workdir / "stall.trigger"
    trigger.unlink(missing_ok=True)
    server = start_llama(llama_kit, "module", trigger)
    try:
        yield server, trigger
    finally:
        trigger.unlink(missing_ok=True)
        stop(server)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        for server in LIVE_SERVERS:
            report.sections.append((f"vLLM server log tail ({server.log_path})", server.log_tail()))
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The recovery measurements of test_recovery.py (times from the fault), if it ran."""
    from tests.tools.llama_server import REPORT_LINES as LLAMA_LINES
    from tests.tools.recovery_harness import REPORT_LINES

    if REPORT_LINES:
        terminalreporter.section("recovery on a real vLLM (seconds from the fault)")
        for line in REPORT_LINES:
            terminalreporter.write_line(line)
    if LLAMA_LINES:
        terminalreporter.section("llama-server: what each probe showed under each fault")
        for line in LLAMA_LINES:
            terminalreporter.write_line(line)
