"""Every port docs/*.md and README.md name is one the rendered objects (or the CLI defaults, or
the Prometheus example) really use, and no page claims a guard port where the default
renderings have none (the kustomize default overlay and the chart's defaults run no guard)."""

from __future__ import annotations

import re
from functools import cache

import yaml

from tests.deploy import manifests as m
from tests.deploy import pod_checks as checks
from tests.deploy.tools import KUBERNETES_DIR, PROMETHEUS_DIR, REPO

Obj = m.Obj
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PROMETHEUS_OWN = 9090  # Prometheus' own listen port (federation example), not ours to render
# Where a number is a port: host:port, ":port" alone, "port ... N" (port, --port, guard port, ...),
# and the YAML keys that hold one.
PORT_PATTERNS = (
    # (a file:line such as torch/cuda/__init__.py:1162 is not one, nor a step of
    # benchmarks/scale.py such as freeze:1536:3 or direct:4096x100)
    re.compile(
        r"(?:127\.0\.0\.1|0\.0\.0\.0|localhost|\b[a-z][a-z0-9.-]*)"
        r"(?<!\.py)(?<!\.md)(?<!freeze)(?<!direct):(\d{2,5})\b"
    ),
    re.compile(r"(?:^|[\s(`])[:](\d{4,5})\b"),
    re.compile(r"\bport\b[^\n.;|]{0,25}?\b(\d{4,5})\b", re.I),
    re.compile(r"\b(?:containerPort|number|targetPort): *(\d{2,5})\b"),
)
CLAIMS_A_DEFAULT_GUARD = re.compile(
    r"always listens[^.]{0,40}guard|listening but idle|guard port[^.]{0,40}by default", re.I
)


def _port(workload: Obj, container: str, name: str) -> int | None:
    ports = checks.container(workload, container).get("ports", [])
    found = [int(p["containerPort"]) for p in ports if p.get("name") == name]
    return found[0] if found else None


def _host_port(value: str) -> int:
    return int(value.rstrip("/").rsplit(":", 1)[1])


@cache
def rendered_ports() -> dict[int, str]:
    """Port -> what it is, read from the kustomize overlays and the chart, default and guard."""
    roles: dict[int, str] = {}
    default_k = m.render_kustomize(KUBERNETES_DIR / "overlays" / "default")
    guard_k = m.render_kustomize(KUBERNETES_DIR / "overlays" / "guard")
    default_h = m.render_chart(m.CHART, {})
    guard_h = m.render_chart(m.CHART, {"guard": {"enabled": True}})
    for objs in (default_k, default_h):
        (w,) = checks.workloads(objs)
        config = checks.configmap(objs, w)
        assert _port(w, checks.SIDECAR, "guard") is None  # no guard by default
        assert "ENGINE_WATCHDOG_GUARD_LISTEN" not in config
        engine = _port(w, checks.ENGINE, "http")
        watchdog = _port(w, checks.SIDECAR, "watchdog")
        assert engine == _host_port(config["ENGINE_WATCHDOG_URL"])
        assert watchdog == _host_port(config["ENGINE_WATCHDOG_LISTEN"])
        roles[int(engine)] = "the engine (vLLM --port)"
        roles[int(watchdog)] = "the watchdog's /metrics /livez /status"
    for objs in (guard_k, guard_h):
        (w,) = checks.workloads(objs)
        guard = _port(w, checks.SIDECAR, "guard")
        assert guard == _host_port(checks.configmap(objs, w)["ENGINE_WATCHDOG_GUARD_LISTEN"])
        roles[int(guard)] = "the guard (guard overlay, guard.enabled)"
    roles.update(lws_peer_ports(m.render_chart(m.CHART, {"lws": {"enabled": True}})))
    roles.update(lws_peer_ports(m.render_kustomize(KUBERNETES_DIR / "overlays" / "lws")))
    return roles


def lws_peer_ports(objs: list[Obj]) -> dict[int, str]:
    """The sidecars' peer port in a LeaderWorkerSet rendering (leader and workers)."""
    ports: dict[int, str] = {}
    for lws in (o for o in objs if o["kind"] == "LeaderWorkerSet"):
        for template in lws["spec"]["leaderWorkerTemplate"].values():
            if not isinstance(template, dict) or "spec" not in template:
                continue
            for c in template["spec"]["containers"]:
                for p in c.get("ports", []):
                    if c["name"] == checks.SIDECAR and p.get("name") == "peer":
                        ports[int(p["containerPort"])] = "the sidecars' peer port (LWS)"
    assert ports, "no peer port in the LeaderWorkerSet rendering"
    return ports


def example_ports() -> dict[int, str]:
    """Ports of deploy/prometheus/prometheus.yml (Alertmanager's) and Prometheus' own."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    roles = {PROMETHEUS_OWN: "Prometheus"}
    for alerting in config["alerting"]["alertmanagers"]:
        for static in alerting["static_configs"]:
            roles.update({_host_port(t): "Alertmanager" for t in static["targets"]})
    return roles


def doc_ports(text: str) -> list[tuple[int, int]]:
    """(line number, port) of every port a page names."""
    found: list[tuple[int, int]] = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern in PORT_PATTERNS:
            found.extend((number, int(p)) for p in pattern.findall(line))
    return found


def test_every_port_in_the_docs_is_one_the_rendered_objects_use() -> None:
    known = {**example_ports(), **rendered_ports()}
    from engine_watchdog.core.settings import ProcessSettings

    assert _host_port(str(ProcessSettings().listen)) in known  # the CLI's --listen default
    wrong = [
        f"{page.relative_to(REPO)}:{line}: port {port}"
        for page in PAGES
        for line, port in doc_ports(page.read_text())
        if port not in known
    ]
    assert not wrong, f"ports no rendering uses ({sorted(known)} do): {wrong}"


def test_no_page_claims_a_guard_the_default_renderings_lack() -> None:
    claims = [
        f"{page.relative_to(REPO)}:{n}: {line.strip()}"
        for page in PAGES
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if CLAIMS_A_DEFAULT_GUARD.search(line)
    ]
    rendered_ports()  # asserts the default renderings have no guard port
    assert not claims, claims


def test_the_port_finder_has_teeth() -> None:
    text = "the sidecar listens on 0.0.0.0:8002; its guard port, 8003, and `:8004`\n"
    assert sorted(p for _, p in doc_ports(text)) == [8002, 8003, 8004]
    assert not doc_ports("torch/cuda/__init__.py:1162 and docs/guard.md:250")
    assert not doc_ports("--steps 1536x25,freeze:1536:3,direct:4096x100")
    assert doc_ports("curl http://freezer:1536/metrics") == [(1, 1536)]
    assert CLAIMS_A_DEFAULT_GUARD.search("has the guard port, 8001, listening but idle")
