"""``make sanitize``: the guard's C built twice, with AddressSanitizer + UndefinedBehaviorSanitizer
and with ThreadSanitizer, and the tests that reach it run under each (docs/guard.md, "How the C
is proved").

    .venv/bin/python -m tests.tools.sanitize [asan] [tsan] [--fuzz-seconds 10]

Each build is the extension's own sources (guard/_relay.c, relay_thread.c, sse.c and the
vendored llhttp) at -O1 with ``-Wall -Wextra -Werror``, into a copy of the package under
``build/sanitize/<kind>/`` that the runs import first (PYTHONPATH: the subprocesses the tests
start, the installed console script's guard among them, import it too). The interpreter is not
instrumented: the sanitizer's runtime is preloaded. Every process writes its reports to
``build/sanitize/<kind>/report.<pid>``; any report, like any failed test, fails the target.

Under each: the unit tests of the scan and the relay thread (fork included), the differential
fuzz of the scan against its Python twin, the guard's integration tests that reach the C (the
relay thread, the data path), and the stress of the relay (hundreds of streams, clients that
leave, engines that reset, full clients, a SIGTERM mid-stream, descriptors run out).
Three are left out (LEFT_OUT says which and why).
Before each run, a planted heap overflow and a planted data race (sanitize_canary.c) must be
reported in the same setup: a clean run counts only if the sanitizer can see. First of all,
where Debian's debug interpreter is, a reference-leak run (tests/tools/refleak.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GUARD = REPO / "engine_watchdog" / "guard"
SOURCES = [
    GUARD / "_relay.c",
    GUARD / "relay_thread.c",
    GUARD / "sse.c",
    *(GUARD / "vendor" / f"llhttp_{n}.c" for n in ("api", "http", "llhttp")),
]
WARNINGS = ["-Wall", "-Wextra", "-Werror"]
KINDS: dict[str, tuple[list[str], str, str]] = {
    # flags, the runtime to preload, its options variable
    "asan": (
        ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"],
        "libasan.so",
        "ASAN_OPTIONS",
    ),
    "tsan": (["-fsanitize=thread"], "libtsan.so", "TSAN_OPTIONS"),
}
TESTS = [
    "tests/unit/test_relay.py",
    "tests/unit/test_scan_diff.py",
    "tests/unit/test_guard_tokens.py",
    "tests/integration/test_guard_lanes.py",
    "tests/integration/test_guard_fast.py",
    "tests/integration/test_guard_stress.py",
]
LEFT_OUT = (
    "not test_a_slow_reader_pauses_its_engine_connection and not out_of_descriptors"
    " and not test_sigterm_mid_stream"
)
"""The production build's bounds of memory and time (64 MiB through a paused reader), which a
sanitizer's shadow memory and slowdown exceed by design; and the two stress runs of the
installed guard as a process of its own (each a minute and more under a sanitizer: what they
reach of the C, the drain with streams on the thread and a stream the thread cannot take, the
in-process tests reach too)."""
FUZZ_ENV = "ENGINE_WATCHDOG_FUZZ_SECONDS"
"""How long the differential fuzz runs (tests/unit/test_scan_diff.py)."""
SANITIZED_ENV = "ENGINE_WATCHDOG_SANITIZED"
"""Set to the sanitizer's name in its runs (the stress test scales its load by it)."""


def compiler() -> str:
    return os.environ.get("CC", "gcc")


def build(kind: str, out: Path) -> Path:
    """A copy of the package with the extension built for ``kind``, under ``out``."""
    flags, _, _ = KINDS[kind]
    if out.exists():
        shutil.rmtree(out)
    pkg = out / "engine_watchdog"
    shutil.copytree(
        REPO / "engine_watchdog",
        pkg,
        ignore=shutil.ignore_patterns("*.so", "__pycache__", "vendor", "*.c", "*.h"),
    )
    target = pkg / "guard" / "_relay.abi3.so"
    command = [
        compiler(), "-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer", *WARNINGS,
        *flags, f"-I{sysconfig.get_paths()['include']}", f"-I{GUARD}",
        f"-I{GUARD / 'vendor' / 'llhttp' / 'include'}", *map(str, SOURCES), "-o", str(target),
        "-lpthread",
    ]  # fmt: skip
    subprocess.run(command, check=True, timeout=300)
    return target


def runtime(kind: str) -> str:
    name = KINDS[kind][1]
    path = subprocess.run(
        [compiler(), f"-print-file-name={name}"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not os.path.isabs(path):
        sys.exit(f"sanitize: {compiler()} has no {name} (install gcc's sanitizer runtimes)")
    return path


def environment(kind: str, out: Path, fuzz_s: float) -> dict[str, str]:
    report = f"log_path={out / 'report'}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(out), os.environ.get("PYTHONPATH")])),
        "LD_PRELOAD": runtime(kind),
        FUZZ_ENV: str(fuzz_s),
        SANITIZED_ENV: kind,
        "PYTHONMALLOC": "malloc",  # every allocation through the sanitizer's allocator
    }
    if kind == "asan":
        env["ASAN_OPTIONS"] = f"detect_leaks=0:halt_on_error=1:{report}"
        env["UBSAN_OPTIONS"] = f"halt_on_error=1:print_stacktrace=1:{report}"
    else:
        env["TSAN_OPTIONS"] = f"halt_on_error=1:second_deadlock_stack=1:{report}"
    return env


CANARY = Path(__file__).with_name("sanitize_canary.c")
PLANTED = {"asan": "overflow(16)", "tsan": "race()"}


def sees(kind: str, out: Path, env: dict[str, str]) -> bool:
    """Whether the sanitizer reports the bug planted for it, in this very setup (a shared object
    loaded by Python, the runtime preloaded): a clean run means something only if it does."""
    lib = out / "canary.so"
    subprocess.run(
        [compiler(), "-shared", "-fPIC", "-O1", "-g", *KINDS[kind][0], str(CANARY), "-o",
         str(lib), "-lpthread"],
        check=True, timeout=120,
    )  # fmt: skip
    probe = out / "canary"
    probe.mkdir()
    options = KINDS[kind][2]
    env = {**env, options: env[options].replace(str(out / "report"), str(probe / "report"))}
    code = f"import ctypes; ctypes.CDLL({str(lib)!r}).{PLANTED[kind]}"
    subprocess.run([sys.executable, "-c", code], env=env, timeout=120, check=False)
    return any(probe.glob("report.*"))


def run(kind: str, fuzz_s: float, workers: int) -> bool:
    out = REPO / "build" / "sanitize" / kind
    started = time.monotonic()
    build(kind, out)
    built = time.monotonic() - started
    env = environment(kind, out, fuzz_s)
    if not sees(kind, out, env):
        print(f"sanitize {kind}: FAILED: the planted bug went unreported: this setup sees nothing")
        return False
    xdist = ["-n", str(workers)] if workers > 1 else ["-n", "0"]
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *xdist,
         "-k", LEFT_OUT, "--durations=15", *TESTS],
        cwd=REPO, env=env, timeout=900, check=False,
    )  # fmt: skip
    reports = sorted(out.glob("report.*"))
    for report in reports:
        print(f"--- {report.name} ---\n{report.read_text(errors='replace')[:20000]}")
    took = time.monotonic() - started
    ok = ran.returncode == 0 and not reports
    verdict = "clean" if ok else f"FAILED (pytest {ran.returncode}, {len(reports)} reports)"
    print(f"sanitize {kind}: {verdict} in {took:.0f} s (build {built:.0f} s)", flush=True)
    return ok


DEBUG_PYTHON = "python3.11d"
"""Debian's debug interpreter (package python3.11-dbg; deploy/ensure-tools.sh installs it)."""


def refleak() -> bool:
    """The C built for the debug interpreter, then tests/tools/refleak.py under it: no
    reference or block gained per round of every entry point. Where there is no debug
    interpreter, says so and passes (the sanitizers' runs stand alone)."""
    python = shutil.which(DEBUG_PYTHON)
    if python is None:
        print(f"sanitize refleak: not run ({DEBUG_PYTHON} missing: apt-get install python3.11-dbg)")
        return True
    out = REPO / "build" / "sanitize" / "refleak"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    includes = subprocess.run(
        [f"{python}-config", "--includes"], capture_output=True, text=True, check=True
    ).stdout.split()
    suffix = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    subprocess.run(
        [compiler(), "-shared", "-fPIC", "-O0", "-g", *WARNINGS, *includes, f"-I{GUARD}",
         f"-I{GUARD / 'vendor' / 'llhttp' / 'include'}", *map(str, SOURCES),
         "-o", str(out / f"_relay{suffix}"), "-lpthread"],
        check=True, timeout=300,
    )  # fmt: skip
    ran = subprocess.run(
        [python, str(Path(__file__).with_name("refleak.py")), str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    said = (ran.stdout + ran.stderr).strip().splitlines()
    print(f"sanitize {said[-1] if said else 'refleak: no output'}", flush=True)
    return ran.returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description="The guard's C under sanitizers.")
    # Checked here, not by choices=: Python 3.11's argparse checks an empty positional "*"
    # against choices as one value, and refused every run without arguments (`make sanitize`).
    kinds_help = f"any of {', '.join(KINDS)} (default: all)"
    parser.add_argument("kinds", nargs="*", metavar="KIND", help=kinds_help)
    parser.add_argument("--fuzz-seconds", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    if unknown := sorted(set(args.kinds) - set(KINDS)):
        parser.error(f"unknown kind(s) {', '.join(unknown)}: choose from {', '.join(KINDS)}")
    kinds = args.kinds or list(KINDS)
    results = [refleak(), *(run(kind, args.fuzz_seconds, args.workers) for kind in kinds)]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
