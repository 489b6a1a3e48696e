"""``engine-watchdog`` as installed, with each probe round's judging timed (benchmarks/scale.py):
the guard's snapshot of its streams (runtime/watch/probing.py ``Prober._guard``: guard/proxy.py
``snapshot`` and its trace record) and the round's judging (runtime/watch/judge.py ``Judge.judge``:
the detector fed, the per-request judge, core/requests.py, among it). Both run on the guard's
event loop, so each round's time is also a pause of its data path there.

    ENGINE_WATCHDOG_BENCH_ROUNDS=FILE python -m benchmarks.guard_rounds guard URL ...

One line per round to FILE: ``unix_time snapshot_ms judge_ms open_streams quiet_streams``.
Wrapping adds two clock readings per round, nothing per event.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from engine_watchdog.cli.main import main
from engine_watchdog.core.model import GuardObs
from engine_watchdog.runtime.watch import judge as judging
from engine_watchdog.runtime.watch import probing

ENV = "ENGINE_WATCHDOG_BENCH_ROUNDS"
_last: list[Any] = [0.0, 0, 0]
"""The round's snapshot: its ms, open and quiet streams (read by the judge's wrapper)."""


def install(out: Any) -> bool:
    """The two wrapped; False (and the guard runs untimed) where either is gone."""
    guard = getattr(probing.Prober, "_guard", None)
    judge = getattr(judging.Judge, "judge", None)
    if guard is None or judge is None:
        print(
            "guard_rounds: Prober._guard or Judge.judge is gone: rounds not timed", file=sys.stderr
        )
        return False

    async def timed_guard(self: probing.Prober, wire: probing.WireSource) -> Any:
        t0 = time.perf_counter()
        obs = await guard(self, wire)  # no await inside: this is its synchronous work
        ms = (time.perf_counter() - t0) * 1e3
        if isinstance(obs, GuardObs):
            _last[:] = [ms, obs.open, len(obs.quiet)]
        return obs

    def timed_judge(self: judging.Judge, probed: Any) -> Any:
        t0 = time.perf_counter()
        changes = judge(self, probed)
        ms = (time.perf_counter() - t0) * 1e3
        out.write(f"{time.time():.3f} {_last[0]:.3f} {ms:.3f} {_last[1]} {_last[2]}\n")
        _last[:] = [0.0, 0, 0]
        return changes

    probing.Prober._guard = timed_guard  # type: ignore[method-assign]
    judging.Judge.judge = timed_judge  # type: ignore[method-assign]
    return True


if __name__ == "__main__":
    install(open(os.environ[ENV], "a", buffering=1))  # noqa: SIM115 (open for the process)
    sys.argv[0] = "engine-watchdog"
    main()  # exits with the guard's own code
