"""benchmarks/guard.py --baseline cannot rot: the guard of another checkout's code (here this
checkout itself) runs beside the installed guard in one tiny round, and its row has events
and no errors."""

from __future__ import annotations

from tests.tools.bench import ROOT, guard_round


def test_baseline_guard_runs_beside_the_guard() -> None:
    by_proxy, out = guard_round("--streams", "4", "--baseline", str(ROOT))
    assert set(by_proxy) == {"guard", "guard-baseline"}, out
    for cells in by_proxy.values():
        assert float(cells[4]) > 0, out  # proxied events/s
        assert cells[11].strip() == "0", out  # errors
