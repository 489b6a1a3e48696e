"""deploy/grafana: the dashboard's queries parse (promtool) and select only series that exist:
every metric name a panel's expression names is one the code exports (tests/deploy/tools.py
collects them from the watchdog's registry and the guard's collector)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.tools import DEPLOY, known_series, metric_names, run, tool

DASHBOARD = DEPLOY / "grafana" / "engine-watchdog.json"
# Every panel the dashboard promises, by the series it must show.
REQUIRED = {
    "engine_watchdog_engine_state",
    "engine_watchdog_seconds_without_progress",
    "engine_watchdog_stall_verdicts_total",
    "engine_watchdog_actions_total",
    "engine_watchdog_probe_errors_total",
    "engine_watchdog_scrape_duration_seconds_bucket",
    "vllm:generation_tokens_total",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    # the guard's (engine_watchdog/guard/stats.py) and the readiness gate's
    "engine_watchdog_guard_in_flight",
    "engine_watchdog_guard_requests_total",
    "engine_watchdog_guard_time_to_first_event_seconds_bucket",
    "engine_watchdog_guard_refusing",
    "engine_watchdog_readiness_flips_total",
}


def _panels(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for panel in items:
        out.append(panel)
        out.extend(_panels(panel.get("panels", [])))
    return out


def _queries() -> list[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"])
        for panel in _panels(board["panels"])
        for target in panel.get("targets", [])
    ]


def _as_promql(expr: str) -> str:
    """Grafana variables -> plain PromQL that promtool can parse."""
    text = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")
    return re.sub(r"\$\{?\w+\}?", ".*", text)


def test_dashboard_queries_only_existing_series() -> None:
    known = known_series()
    used: set[str] = set()
    for title, expr in _queries():
        names = metric_names(_as_promql(expr))
        assert names, f"panel {title!r} selects no series: {expr}"
        assert names <= known, f"panel {title!r} uses unknown series {names - known}"
        used |= names
    assert used >= REQUIRED, f"no panel for {REQUIRED - used}"


def test_dashboard_label_values_are_ones_the_code_writes() -> None:
    """A matcher on a label value that is never written shows an empty panel, not an error."""
    from engine_watchdog.guard.stats import OUTCOMES

    for title, expr in _queries():
        for value in re.findall(r'outcome="([^"]+)"', expr):
            assert value in OUTCOMES, (title, value)
        for value in re.findall(r'status="([^"]+)"', expr):
            assert value in ("True", "False"), (title, value)


def test_dashboard_queries_parse(tmp_path: Path) -> None:
    rules = [
        {"record": f"dashboard:query_{i}", "expr": _as_promql(expr)}
        for i, (_, expr) in enumerate(_queries())
    ]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = run([tool("promtool"), "check", "rules", str(path)])
    assert f"SUCCESS: {len(rules)} rules found" in out


def test_dashboard_shape() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] == "engine-watchdog"
    ids = [p["id"] for p in _panels(board["panels"])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "pod"} <= variables
    for panel in _panels(board["panels"]):
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
