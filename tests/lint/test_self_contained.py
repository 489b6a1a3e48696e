"""A reader who clones the repository can follow every citation, and nothing in it is a path of
one machine: no tracked file points at a file outside it (a notes file the project's authors
kept, a sibling checkout), nor holds an absolute path of the machines the project was built on
(a checkout, a mirror, a fresh clone, pytest's temporary folders, a user's home or its pyenv).

Recorded data is scrubbed where it is recorded: traces keep titles without directories
(runtime/trace/recording.py); the bundles, stacks and logs under tests/data name the checkout /src
(the image's build folder, deploy/Dockerfile), the interpreter /usr/local (the python image's)
and a third party's build folder /build. The product's own paths (/proc, /dev/shm, /var/run/...)
are no machine's."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = ("FACTS" + ".md", "../" + "shared")  # split so this file does not match itself
MACHINE = re.compile(
    "|".join(
        (
            "/" + "work/",  # the checkouts and mirrors of the machines the project is built on
            "/tmp/" + "fresh",  # fresh clones
            "/tmp/" + "pytest-of-",  # pytest's temporary folders
            "/root/" + r"\.pyenv",  # an interpreter of one machine
            "/" + r"home/[^/\s]+/",
            "/" + r"Users/[^/\s]+/",
        )
    )
)


def tracked() -> list[tuple[str, str]]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
    ).stdout.decode()
    files = []
    for name in filter(None, listed.split("\0")):
        path = ROOT / name
        if not path.is_file() or path.is_symlink():
            continue
        try:
            files.append((name, path.read_text(errors="ignore")))
        except OSError:
            continue
    return files


def machine_paths(text: str) -> list[str]:
    """The absolute paths of a machine in ``text``: the patterns above, this checkout's own
    path and the user's home (unless it is / or /root, every container's)."""
    here = [str(ROOT)]
    home = os.path.expanduser("~")
    if home not in ("/", "/root"):
        here.append(home)
    return [m.group(0) for m in MACHINE.finditer(text)] + [h for h in here if h in text]


def test_no_tracked_file_cites_a_file_outside_the_repo() -> None:
    hits = [f"{name}: {word}" for name, text in tracked() for word in OUTSIDE if word in text]
    assert hits == []


def test_no_tracked_file_holds_a_path_of_one_machine() -> None:
    hits = [f"{name}: {p}" for name, text in tracked() for p in machine_paths(text)]
    assert hits == [], hits[:20]


def test_the_finder_tells_a_machine_s_path_from_the_product_s() -> None:
    assert machine_paths("git clone " + "/work" + "/main x") == ["/" + "work/"]
    assert machine_paths("Python (" + "/root" + "/.pyenv/versions/3.11.7/bin/python3)")
    assert machine_paths("/home" + "/alice/venv/bin/python -m vllm")
    assert machine_paths(f"cd {ROOT} && make")
    product = "/proc/PID/root /proc/1/cwd /dev/shm/nccl-x /var/run/engine-watchdog/peer/secret"
    assert machine_paths(product + " /root/.cache/vllm /usr/local/lib/python3.11 /src/x.py") == []
