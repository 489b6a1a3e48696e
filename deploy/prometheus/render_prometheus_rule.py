"""Render rules.yml as a prometheus-operator PrometheusRule (prometheus-rule.yaml).

    python deploy/prometheus/render_prometheus_rule.py          # rewrite prometheus-rule.yaml
    python deploy/prometheus/render_prometheus_rule.py --check  # exit 1 if it is out of date

rules.yml is the source: promtool tests it; this file only wraps its groups unchanged.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "rules.yml"
TARGET = HERE / "prometheus-rule.yaml"
HEADER = (
    "# GENERATED from rules.yml by render_prometheus_rule.py: edit rules.yml, then run\n"
    "#   python deploy/prometheus/render_prometheus_rule.py\n"
    "# prometheus-operator loads it when its ruleSelector matches these labels (with\n"
    "# kube-prometheus-stack add `release: <your helm release>`): see docs/prometheus.md.\n"
)


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings, so the rendered PromQL reads like the source."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render(rules_text: str) -> str:
    rules: dict[str, Any] = yaml.safe_load(rules_text)
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "engine-watchdog",
            "labels": {
                "app.kubernetes.io/name": "engine-watchdog",
                "app.kubernetes.io/component": "alert-rules",
            },
        },
        "spec": {"groups": rules["groups"]},
    }
    body = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=1000, allow_unicode=True)
    return HEADER + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the file is stale")
    args = parser.parse_args(argv)
    expected = render(SOURCE.read_text())
    if args.check:
        if not TARGET.exists() or TARGET.read_text() != expected:
            print(f"{TARGET} is stale: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(expected)
    return 0


if __name__ == "__main__":
    sys.exit(main())
