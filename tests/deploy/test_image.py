"""deploy/Dockerfile and its hash-pinned install.

The Dockerfile's own install script (deploy/install-locked.sh) into a clean venv, and the
Dockerfile's shape. test_image_podman.py builds the image itself and runs it as the sidecar.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.deploy.tools import DEPLOY, REPO, run

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DOCKERFILE = DEPLOY / "Dockerfile"
LOCK = DEPLOY / "requirements.lock"
BUILD_LOCK = DEPLOY / "build-requirements.lock"
_PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s\\;]+)")


def _locked(path: Path) -> dict[str, tuple[Version, int]]:
    """name -> (version, number of sha256 hashes) from a pip-compile --generate-hashes file."""
    pins: dict[str, tuple[Version, int]] = {}
    current = None
    for line in path.read_text().splitlines():
        match = _PIN.match(line)
        if match:
            current = canonicalize_name(match.group(1))
            pins[current] = (Version(match.group(2)), 0)
        elif current and line.strip().startswith("--hash=sha256:"):
            version, hashes = pins[current]
            pins[current] = (version, hashes + 1)
        elif line and not line.startswith((" ", "#")):
            raise AssertionError(f"unexpected line in {path.name}: {line!r}")
    return pins


def test_lock_pins_every_runtime_dependency_with_hashes() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    pins = _locked(LOCK)
    assert all(hashes > 0 for _, hashes in pins.values()), "every pin needs a hash"
    for spec in project["project"]["dependencies"]:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} missing from {LOCK.name}: run deploy/lock.sh"
        assert req.specifier.contains(pins[name][0], prereleases=True), (
            f"{LOCK.name} pins {name}=={pins[name][0]}, pyproject wants {req.specifier}"
        )
    build = project["build-system"]["requires"]
    build_pins = _locked(BUILD_LOCK)
    for spec in build:
        req = Requirement(spec)
        assert req.specifier.contains(build_pins[canonicalize_name(req.name)][0])


def test_dockerfile_shape() -> None:
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, flags=re.MULTILINE)
    assert len(stages) == 2 and stages[0][1] == "builder", "builder stage + final stage"
    assert "slim" in re.search(r"ARG PYTHON_IMAGE=(\S+)", text).group(1)  # type: ignore[union-attr]
    final = text.split("\nFROM ${PYTHON_IMAGE}\n", 1)[1]
    assert re.search(r"^USER 1000:1000$", final, flags=re.MULTILINE), "non-root user"
    assert "COPY --from=builder /opt/engine-watchdog /opt/engine-watchdog" in final
    for tool in ("apt-get", "gcc", "build-essential", "install-locked.sh", "pip install"):
        assert tool not in final, f"final stage must not run {tool}"
    assert "install-locked.sh deps" in text and "install-locked.sh app" in text
    # A proxy's CA comes in as a build secret for the downloading step, never as a file.
    assert "RUN --mount=type=secret,id=ca,required=false" in text
    assert not re.search(r"^(COPY|ADD)\s.*\.(crt|pem)\b", text, flags=re.MULTILINE | re.IGNORECASE)


def test_locked_install_into_a_clean_venv(tmp_path: Path) -> None:
    """The Dockerfile's two install steps, then the image's two smoke commands."""
    prefix, build = tmp_path / "venv", tmp_path / "build"
    env_cmd = ["env", f"BUILD_VENV={build}", f"PYTHON={sys.executable}", "bash"]
    started = time.monotonic()
    run([*env_cmd, str(DEPLOY / "install-locked.sh"), "deps", str(prefix)], timeout=240)
    run([*env_cmd, str(DEPLOY / "install-locked.sh"), "app", str(prefix)], timeout=120)
    took = time.monotonic() - started
    assert not (prefix / "bin" / "pip").exists(), "the runtime venv has no pip"
    version = run([str(prefix / "bin" / "engine-watchdog"), "--version"])
    assert "0.1.0" in version
    assert run([str(prefix / "bin" / "py-spy"), "--version"]).startswith("py-spy ")
    listed = subprocess.run(
        [str(prefix / "bin" / "python"), "-c", "import aiohttp, prometheus_client, pynvml"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    print(f"locked install took {took:.1f} s")
