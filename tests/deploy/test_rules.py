"""deploy/prometheus: promtool checks and unit tests, the PrometheusRule copy, runbook links."""

from __future__ import annotations

import re
import sys
from typing import Any

import yaml

from tests.deploy.tools import PROMETHEUS_DIR, REPO, known_series, metric_names, run, tool

RULES = PROMETHEUS_DIR / "rules.yml"
RUNBOOK = REPO / "docs" / "runbook.md"
RUNBOOK_URL = "https://github.com/engine-watchdog/engine-watchdog/blob/main/docs/runbook.md"
EXPECTED_ALERTS = {
    "EngineStalled",
    "EngineRestartLimitReached",
    "WatchdogDown",
    "WatchdogCannotProbe",
    "RepeatedIncidents",
    "EngineResemblesKnownHang",
    "WatchdogHistoryUnwritable",
    "VLLMNoProgressWithRequestsRunning",
    "VLLMAdmissionStall",
    "VLLMKVCacheSaturatedPreemptionStorm",
}
WINDOWED = {"RepeatedIncidents", "EngineResemblesKnownHang"}
"""Alerts on counted events: the increase() window is their debounce, they need no `for`."""


def _alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_promtool_check_rules() -> None:
    out = run([tool("promtool"), "check", "rules", str(RULES)])
    assert f"SUCCESS: {len(_alerts())} rules found" in out


def test_promtool_unit_tests_pass() -> None:
    out = run([tool("promtool"), "test", "rules", "rules_test.yml"], cwd=PROMETHEUS_DIR)
    assert "SUCCESS" in out


def test_every_alert_has_firing_and_quiet_unit_tests() -> None:
    tests = yaml.safe_load((PROMETHEUS_DIR / "rules_test.yml").read_text())["tests"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in tests:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {a["alert"] for a in _alerts()}
    assert names == EXPECTED_ALERTS
    assert names - firing == set(), "alerts without a firing test"
    assert names - quiet == set(), "alerts without a not-firing test"


def test_example_prometheus_config_is_valid() -> None:
    run([tool("promtool"), "check", "config", str(PROMETHEUS_DIR / "prometheus.yml")])


def test_alerts_are_documented() -> None:
    headings = set(re.findall(r"^## (\S+)\s*$", RUNBOOK.read_text(), flags=re.MULTILINE))
    for alert in _alerts():
        name = alert["alert"]
        assert alert["labels"]["severity"] in ("critical", "warning"), name
        assert alert.get("for") or name in WINDOWED, f"{name} has no `for`"
        notes = alert["annotations"]
        assert notes["summary"].strip() and notes["description"].strip(), name
        assert notes["runbook_url"] == f"{RUNBOOK_URL}#{name.lower()}"
        assert name in headings, f"docs/runbook.md has no '## {name}' section"


def test_rules_only_use_metrics_that_exist() -> None:
    known = known_series()
    for alert in _alerts():
        used = metric_names(alert["expr"])
        assert used, alert["alert"]
        assert used <= known, f"{alert['alert']} uses unknown series {used - known}"


def test_prometheus_rule_is_rendered_from_rules_yml() -> None:
    run([sys.executable, str(PROMETHEUS_DIR / "render_prometheus_rule.py"), "--check"])
    rendered = yaml.safe_load((PROMETHEUS_DIR / "prometheus-rule.yaml").read_text())
    assert rendered["apiVersion"] == "monitoring.coreos.com/v1"
    assert rendered["kind"] == "PrometheusRule"
    assert rendered["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def test_prometheus_rule_groups_pass_promtool(tmp_path: Any) -> None:
    """What the operator loads is what promtool checked: re-check the CRD's own groups."""
    rendered = yaml.safe_load((PROMETHEUS_DIR / "prometheus-rule.yaml").read_text())
    extracted = tmp_path / "from-crd.yml"
    extracted.write_text(yaml.safe_dump({"groups": rendered["spec"]["groups"]}))
    run([tool("promtool"), "check", "rules", str(extracted)])
