"""The sidecar image, for real: deploy/Dockerfile built with podman, then run as the sidecar
with the manifests' own security context, capturing a deadlocked engine through it.

The engine is the simulator from the same image (``engine-watchdog sim --fault deadlock``),
in its own container; the sidecar joins its PID namespace (``--pid=container:ENGINE``, what
``shareProcessNamespace`` gives a pod) with a read-only root, ``no-new-privileges``
(allowPrivilegeEscalation: false), every capability dropped but the variant's, the engine's
UID, and writable /tmp and incident volumes (the pod's emptyDirs). Three variants:

- ptrace (deploy/kubernetes/overlays/default, chart podSecurity=ptrace): UID 0, SYS_PTRACE only;
- baseline (overlays/baseline, podSecurity=baseline): a non-root engine UID, no capability;
- refused: no capability and ANOTHER UID than the engine's, the way ptrace is refused in a
  Baseline pod on a node whose kernel.yama.ptrace_scope is above 0: the bundle and `doctor`
  must say so plainly.

Skips only where podman cannot run (not root, ``podman info`` failing), saying why.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engine_watchdog.sim.launcher import free_port
from tests.deploy import podman as pm

pytestmark = pytest.mark.timeout(2400)  # one worker for the module: tests/conftest.py
INCIDENTS = "/var/lib/engine-watchdog/incidents"
PREFIX = "ew-test-"  # + this process's PID: stale ones are recognised and removed


@dataclass(frozen=True)
class Variant:
    name: str
    engine_uid: int
    sidecar_uid: int
    caps: tuple[str, ...]
    stacks: bool  # py-spy gets the engine's stacks


VARIANTS = (
    Variant("ptrace", 0, 0, ("SYS_PTRACE",), stacks=True),
    Variant("baseline", 1000, 1000, (), stacks=True),
    Variant("refused", 1000, 1001, (), stacks=False),
)


@pytest.fixture(scope="module")
def image() -> Iterator[pm.Podman]:
    podman = pm.podman_or_skip()
    podman.remove_stale(PREFIX)
    started = time.monotonic()
    base, how = pm.ensure_base(podman)
    base_s = time.monotonic() - started
    build_s = pm.build_image(podman, base)
    print(
        f"\n[image] base {how} in {base_s:.1f} s, build {build_s:.1f} s; "
        f"kernel.yama.ptrace_scope: {pm.ptrace_scope()}"
    )
    yield podman


def test_image_runs_as_non_root_without_pip_or_build_secret(image: pm.Podman) -> None:
    out = image.oneshot(
        f"{PREFIX}{os.getpid()}-shell", "--entrypoint", "sh", pm.IMAGE_TAG, "-c",
        "id -u; engine-watchdog --version; py-spy --version; "
        "test ! -e /opt/engine-watchdog/bin/pip && echo no-pip; "
        "test ! -e /run/secrets/ca && echo no-secret",
    )  # fmt: skip
    lines = out.split()
    assert lines[0] == "1000", out  # the image's own default user
    assert "0.1.0" in out and "py-spy" in out and "no-pip" in lines and "no-secret" in lines


def _sidecar_args(v: Variant, engine: str, incidents: Path | None) -> list[str]:
    args = [
        f"--pid=container:{engine}", "--network=host",
        f"--user={v.sidecar_uid}:{v.sidecar_uid}", "--read-only", "--cap-drop=ALL",
        *(f"--cap-add={c}" for c in v.caps), "--security-opt=no-new-privileges",
        "--tmpfs=/tmp",
    ]  # fmt: skip
    if incidents is not None:
        args.append(f"--volume={incidents}:{INCIDENTS}")
    return [*args, pm.IMAGE_TAG]


def _wait_health(url: str, within_s: float = 30) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    raise TimeoutError(f"{url}/health not ready within {within_s} s")


def _deadlock(podman: pm.Podman, engine: str, url: str, within_s: float = 20) -> None:
    """One request makes the engine step, and the armed deadlock fires in that step."""
    body = json.dumps({"model": "sim-model", "prompt": "hi", "max_tokens": 8}).encode()
    request = urllib.request.Request(
        f"{url}/v1/completions", body, {"Content-Type": "application/json"}
    )
    with contextlib.suppress(urllib.error.URLError, OSError):  # no answer comes: the hang
        urllib.request.urlopen(request, timeout=1).close()
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if "fault deadlock fires" in podman.run("logs", engine, timeout=30):
            return
        time.sleep(0.2)
    pytest.fail(f"the simulator's deadlock did not fire within {within_s} s")


@pytest.fixture
def engine(image: pm.Podman, request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    v: Variant = request.param
    port = free_port()
    name = f"{PREFIX}{os.getpid()}-engine-{v.name}"
    engine_args = (
        "--network=host", f"--user={v.engine_uid}:{v.engine_uid}", "--entrypoint",
        "engine-watchdog", pm.IMAGE_TAG, "sim", "--port", str(port), "--fault", "deadlock",
    )  # fmt: skip
    with image.container(name, *engine_args):
        url = f"http://127.0.0.1:{port}"
        _wait_health(url)
        _deadlock(image, name, url)
        yield name, url


def _capture(podman: pm.Podman, v: Variant, engine: str, url: str, tmp: Path) -> dict[str, Any]:
    incidents = tmp / "incidents"
    incidents.mkdir()
    incidents.chmod(0o777)  # an emptyDir: writable by the pod's UID, whichever it is
    args = _sidecar_args(v, engine, incidents)
    out = podman.oneshot(
        f"{engine}-capture", *args, "capture", "--url", url, "--incident-dir", INCIDENTS, "--json"
    )
    result: dict[str, Any] = json.loads(out)
    bundle = incidents / Path(result["path"]).name
    result["summary"] = (bundle / "summary.md").read_text()
    result["steps_by_name"] = {s["name"]: s for s in result["steps"]}
    return result


@pytest.mark.parametrize("engine", VARIANTS, indirect=True, ids=[v.name for v in VARIANTS])
def test_sidecar_image_captures_a_deadlocked_engine(
    image: pm.Podman, engine: tuple[str, str], request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    v: Variant = request.node.callspec.params["engine"]
    name, url = engine
    result = _capture(image, v, name, url, tmp_path)
    pyspy, summary = result["steps_by_name"]["py-spy"], result["summary"]
    doctor = image.oneshot(
        f"{name}-doctor",
        *_sidecar_args(v, name, None),
        "doctor",
        "--pid",
        "1",
        "--json",
        check=False,
    )
    (ptrace,) = [c for c in json.loads(doctor)["checks"] if c["name"] == "ptrace"]
    print(f"\n[image] {v.name}: py-spy {pyspy['status']}; doctor ptrace: {ptrace}")
    if v.stacks:
        assert pyspy["status"] == "ok", pyspy
        assert "EngineCore main thread blocked acquiring a lock in _step_with_lock" in summary
        assert ptrace["status"] == "ok", ptrace
    else:
        # The plain statement, in the bundle and in doctor: refused, and what would fix it.
        assert pyspy["status"] == "permission-denied", pyspy
        assert "ptrace refused" in pyspy["detail"] and "ptrace_scope" in pyspy["detail"]
        assert "No stacks were captured" in summary
        assert ptrace["status"] == "missing" and "ptrace_scope" in ptrace["fix"], ptrace
