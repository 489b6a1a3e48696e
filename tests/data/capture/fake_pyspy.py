"""A stand-in for py-spy where the real one cannot show a behaviour here (we run as root).

Tests copy this file next to a ``fake_pyspy.json`` that says, per mode (native, plain,
nonblocking), what to print, how long to sleep and which exit status to return, e.g.
``{"native": {"sleep": 60}, "plain": {"rc": 1, "stderr": "Permission Denied: ..."}}``;
a key ``"<mode>:<pid>"`` overrides the mode's entry for one target PID.
Every call is appended to ``calls.log`` (mode and PID of this fake) beside it. An optional
``"write_stat": [path, text]`` rewrites a fake /proc stat file before sleeping.
"""

import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    args = sys.argv[1:]
    if args == ["--version"]:
        print("py-spy 0.0.0-fake")
        return 0
    mode = "native" if "--native" in args else "nonblocking" if "--nonblocking" in args else "plain"
    with (HERE / "calls.log").open("a") as log:
        log.write(f"{mode} {os.getpid()}\n")
    pid = args[args.index("--pid") + 1] if "--pid" in args else ""
    specs = json.loads((HERE / "fake_pyspy.json").read_text())
    spec = specs.get(f"{mode}:{pid}", specs.get(mode, {}))
    if "write_stat" in spec:
        Path(spec["write_stat"][0]).write_text(spec["write_stat"][1])
    time.sleep(float(spec.get("sleep", 0)))
    sys.stdout.write(spec.get("stdout", "[]"))
    sys.stderr.write(spec.get("stderr", ""))
    return int(spec.get("rc", 0))


if __name__ == "__main__":
    sys.exit(main())
