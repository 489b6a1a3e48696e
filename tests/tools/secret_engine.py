"""An engine whose command line holds secrets, for the secret-leak tests.

``python tests/tools/secret_engine.py SIM-OPTIONS -- SECRET-ARGS`` runs the simulator in this
very process, so its ``/proc/PID/cmdline`` keeps everything, secrets included (the simulator's
own CLI takes no unknown option). Like an engine that logs its arguments and environment at
start-up, it prints them first: supervise mode copies that output to its log. With
``SECRET_ENGINE_TEE=PATH`` the same lines go to PATH too, as the engine's own log file that a
watchdog in watch mode is given with --engine-log.
"""

from __future__ import annotations

import os
import sys

from engine_watchdog.sim.cli import sim_command


def startup_lines(secret_args: list[str]) -> str:
    env = {k: os.environ[k] for k in ("HF_TOKEN", "VLLM_API_KEY") if k in os.environ}
    return f"engine arguments: {' '.join(secret_args)}\nengine environment: {env}\n"


def main() -> None:
    args = sys.argv[1:]
    cut = args.index("--") if "--" in args else len(args)
    text = startup_lines(args[cut + 1 :])
    sys.stdout.write(text)
    sys.stdout.flush()
    tee = os.environ.get("SECRET_ENGINE_TEE")
    if tee:
        with open(tee, "a", encoding="utf-8") as f:
            f.write(text)
    sim_command.main(args=args[:cut], prog_name="secret-engine")


if __name__ == "__main__":
    main()
