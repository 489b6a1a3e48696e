"""A ``helm template`` for deploy/helm/post-renderer's script, where no helm CLI can be installed.

Only the command line is this file's: ``--set`` and ``--set-file`` go through Helm's own strvals
parser, and the chart through Helm's own engine (helm-python-sdk binds Helm's Go SDK). Used as
``HELM_BIN`` when the post-renderer script runs in tests/deploy/test_helm.py::

    python -m tests.deploy.helm_cli template RELEASE CHART [-f FILE] [--set K=V] [--set-file K=F]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml


def merge(into: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of user values: maps merge key by key, anything else replaces."""
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value
    return into


def values_from(argv: list[str]) -> dict[str, Any]:
    import helm_python as helm

    values: dict[str, Any] = {}
    args = iter(argv)
    for flag in args:
        name, _, inline = flag.partition("=")
        arg = inline or next(args)
        if name in ("-f", "--values"):
            merge(values, yaml.safe_load(Path(arg).read_text()) or {})
        elif name == "--set":
            merge(values, helm.parse_set_string(arg))
        elif name == "--set-file":
            merge(values, helm.parse_set_file(arg))
        else:
            raise SystemExit(f"helm_cli: unsupported flag {name}")
    return values


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "template":
        print("usage: helm_cli template RELEASE CHART [flags]", file=sys.stderr)
        return 64
    import helm_python as helm

    release, chart = argv[1], argv[2]
    try:
        with helm.Chart.load(chart) as loaded:
            manifests = loaded.render(values_from(argv[3:]), name=release, namespace="default")
    except helm.HelmError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    for path, text in sorted(manifests.items()):
        if text.strip() and not path.endswith("NOTES.txt"):
            print(f"---\n# Source: {path}\n{text.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
