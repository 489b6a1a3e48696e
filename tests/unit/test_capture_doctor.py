"""doctor's checks and the capture/doctor CLI's input errors."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from engine_watchdog.capture.doctor import (
    DoctorReport,
    has_cap,
    nvml_check,
    procs_check,
    ptrace_check,
    render_json,
    render_text,
    run_doctor,
)
from engine_watchdog.cli.exits import EXIT_USAGE
from engine_watchdog.core.model import ProcInfo
from tests.tools.cli import run_cli_sync


@pytest.mark.parametrize(
    ("scope", "cap", "uids", "status", "words"),
    [
        (None, False, [0], "ok", "same UID"),
        (0, False, [1000], "missing", "another user's process"),
        (None, False, [1000], "missing", "another user's process"),
        (1, False, [1000], "missing", "another user's process"),
        (1, False, [0], "missing", "descendants"),
        (2, False, [0], "missing", "needs CAP_SYS_PTRACE"),
        (2, True, [1000], "ok", "CAP_SYS_PTRACE held"),
        (3, True, [0], "missing", "disabled until reboot"),
    ],
)
def test_ptrace_matrix(
    scope: int | None, cap: bool, uids: list[int], status: str, words: str
) -> None:
    check = ptrace_check(scope, cap, 0, uids)
    assert check.status == status and words in check.detail
    if status == "missing" and scope != 3:
        assert "SYS_PTRACE" in check.fix and "ptrace_scope" in check.fix


def test_has_cap() -> None:
    assert has_cap("000001fffeffffff", 19)
    assert not has_cap("00000000a80425fb", 19)  # Docker's default set: no SYS_PTRACE
    assert not has_cap(None, 19)


def fake_nvml(**fail: Exception) -> Any:
    def call(name: str, value: Any) -> Any:
        def fn() -> Any:
            if name in fail:
                raise fail[name]
            return value

        return fn

    return SimpleNamespace(
        nvmlInit=call("init", None),
        nvmlShutdown=call("shutdown", None),
        nvmlDeviceGetCount=call("count", 2),
        nvmlSystemGetDriverVersion=call("driver", "580.1"),
    )


def test_nvml_check() -> None:
    assert nvml_check(lambda: fake_nvml()).detail == "2 GPU(s), driver 580.1"
    check = nvml_check(lambda: fake_nvml(init=RuntimeError("NVML Shared Library Not Found")))
    assert check.status == "optional" and "Not Found" in check.detail and "toolkit" in check.fix

    def no_module() -> Any:
        raise ImportError("no pynvml")

    assert "nvidia-ml-py" in nvml_check(no_module).fix


def test_procs_check() -> None:
    core = ProcInfo(
        pid=2, ppid=1, role="engine-core", title="VLLM::EngineCore", state="sleeping", cpu_s=0
    )
    api = ProcInfo(pid=1, ppid=0, role="api-server", title="vllm", state="sleeping", cpu_s=0)
    assert procs_check(None, (), ()).status == "skipped"
    assert procs_check("http://h:1", (), ()).fix.startswith("run the watchdog in the engine's PID")
    assert "no engine core" in procs_check("http://h:1", (), (api,)).detail
    assert procs_check("http://h:1", (), (api, core)).status == "ok"


async def test_doctor_here_without_pyspy_or_gpu() -> None:
    report = await run_doctor(tools={}, nvml_load=lambda: fake_nvml(init=RuntimeError("no GPU")))
    by_name = {c.name: c for c in report.checks}
    assert by_name["py-spy"].status == "missing" and "pip install py-spy" in by_name["py-spy"].fix
    assert by_name["nvml"].status == "optional"
    assert by_name["engine processes"].status == "skipped"
    assert not report.ok
    text = render_text(report)
    assert "MISSING  py-spy" in text and "fix: py-spy is not installed" in text
    assert json.loads(render_json(report))["ok"] is False


def test_report_ok_ignores_optional() -> None:
    assert DoctorReport(()).ok


@contextlib.contextmanager
def port_nobody_listens_on() -> Iterator[int]:
    """A port nothing listens on at 127.0.0.1, held bound so no other test's server takes it,
    while this process listens on the same port at 127.0.0.2: not the URL's server, so the
    capture must not take it for the engine (nor take another test's vLLM by its title)."""
    for _ in range(50):  # the port may be in use at 127.0.0.1 already: take another
        with socket.socket() as elsewhere, socket.socket() as held:
            elsewhere.bind(("127.0.0.2", 0))
            elsewhere.listen()
            port = elsewhere.getsockname()[1]
            try:
                held.bind(("127.0.0.1", port))
            except OSError:
                continue
            yield port
            return
    raise AssertionError("no port free at both 127.0.0.1 and 127.0.0.2 in 50 tries")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "say which engine: --url"),
        (["--url", "localhost:8000"], "is not an http(s) URL: use e.g. http://127.0.0.1:8000"),
        (["--url", "http://127.0.0.1:1", "--pid", "1"], "not both"),
        (["--pid", "-4"], "positive process ID"),
        (["--pid", "abc"], "is not a valid integer"),
        (["--pid", "1", "--timeout", "0"], "--timeout"),
        (["--pid", "1", "--engine-log", "/nonexistent/log"], "not a readable file"),
        (["--pid", "2147483646"], "no process with PID 2147483646"),
        (["--url", "http://127.0.0.1:{port}"], "at the URL's address): check --url"),
    ],
)
def test_capture_bad_input_exits_64_with_the_fix(
    tmp_path: Path, args: list[str], message: str
) -> None:
    with port_nobody_listens_on() as port:
        args = [a.format(port=port) for a in args]
        ran = run_cli_sync("capture", *args, "--incident-dir", str(tmp_path), "--py-spy", NO_PY_SPY)
    assert ran.code == EXIT_USAGE, ran
    assert message in ran.err and len(ran.err.strip().splitlines()) == 1
    assert "Traceback" not in ran.err + ran.out
    assert list(tmp_path.iterdir()) == []


NO_PY_SPY = "/nonexistent/py-spy"


def test_doctor_cli_bad_url_and_json() -> None:
    ran = run_cli_sync("doctor", "--url", "nonsense")
    assert ran.code == EXIT_USAGE and "http(s) URL" in ran.err
    ran = run_cli_sync("doctor", "--json", "--py-spy", NO_PY_SPY)
    assert ran.code == 1, ran  # py-spy missing: the operator's path is not there
    assert json.loads(ran.out)["checks"][1]["name"] == "py-spy"


async def test_eu_stack_is_reported_and_optional() -> None:
    """Native stacks (llama-server) need eu-stack: found, it is listed; missing, it is
    optional with the package to install."""
    no_gpu = lambda: fake_nvml(init=RuntimeError("no GPU"))  # noqa: E731
    found = await run_doctor(tools={"eu-stack": "/usr/bin/eu-stack"}, nvml_load=no_gpu)
    missing = await run_doctor(tools={}, nvml_load=no_gpu)
    by_found = {c.name: c for c in found.checks}
    by_missing = {c.name: c for c in missing.checks}
    assert (by_found["eu-stack"].status, by_found["eu-stack"].detail) == ("ok", "/usr/bin/eu-stack")
    assert by_missing["eu-stack"].status == "optional"
    assert "elfutils" in by_missing["eu-stack"].fix
