"""deploy/kubernetes: what only the kustomize tree has. The promises every rendering keeps
(schemas, SYS_PTRACE only where meant, Baseline-clean, same UID, ...) are in
test_manifests.py, shared with the Helm chart."""

from __future__ import annotations

import shutil
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.deploy.manifests import Expect, Obj, Rendering, kustomize_renderings, render_kustomize
from tests.deploy.pod_checks import (
    ALL_CHECKS,
    ENGINE,
    SIDECAR,
    check_capabilities,
    container,
    workloads,
)
from tests.deploy.tools import KUBERNETES_DIR, KUBERNETES_VERSION, PROMETHEUS_DIR


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Obj]]:
    return {r.name: r.objs for r in kustomize_renderings()}


def test_validator_rejects_a_misspelt_field(rendered: dict[str, list[Obj]]) -> None:
    """The schema check has teeth: an unknown field fails in strict mode."""
    (dep,) = workloads(rendered["default"])
    bad = yaml.safe_load(yaml.safe_dump(dep))
    bad["spec"]["template"]["spec"]["shareProcessNamespaces"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def test_baseline_adds_nothing_to_the_engine(rendered: dict[str, list[Obj]]) -> None:
    """The Baseline fallback leaves the engine container exactly as the default variant has it
    (an argument vLLM does not know becomes its model name, as the old Baseline component's did)."""
    (default,), (baseline,) = workloads(rendered["default"]), workloads(rendered["baseline"])
    assert container(baseline, ENGINE) == container(default, ENGINE)


def test_baseline_fallback_wins_over_ptrace(tmp_path: Path) -> None:
    """Composed after ../ptrace, the baseline-fallback component still leaves the sidecar with
    no capability: a namespace enforcing Baseline admits the pod."""
    tree = tmp_path / "kubernetes"
    shutil.copytree(KUBERNETES_DIR, tree)
    overlay = tree / "overlays" / "both"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": ["../../base"],
                "components": [
                    "../../components/watchdog-sidecar",
                    "../../components/ptrace",
                    "../../components/baseline-fallback",
                ],
            }
        )
    )
    objs = render_kustomize(overlay)
    (dep,) = workloads(objs)
    assert container(dep, SIDECAR)["securityContext"]["capabilities"].get("add") == []
    check_capabilities(Rendering("both", "kustomize", objs, Expect(ptrace=False)))


def test_podmonitors_select_the_sidecar_and_vllm(rendered: dict[str, list[Obj]]) -> None:
    objs = render_kustomize(PROMETHEUS_DIR)
    monitors = {o["metadata"]["name"]: o for o in objs if o["kind"] == "PodMonitor"}
    assert {o["kind"] for o in objs} == {"PodMonitor", "PrometheusRule"}
    (dep,) = workloads(rendered["default"])
    labels = dep["spec"]["template"]["metadata"]["labels"]
    ports = {p["name"] for c in dep["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
    jobs = {}
    for name, monitor in monitors.items():
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert endpoint["port"] in ports, name
        (relabel,) = endpoint["relabelings"]
        jobs[endpoint["port"]] = relabel["replacement"]
    assert jobs == {"watchdog": "engine-watchdog", "http": "vllm"}


DEFAULT_COMPONENTS = ("watchdog-sidecar", "ptrace", "service-account", "readiness-gate")
"""The default overlay's components (overlays/default)."""


def default_with(tmp_path: Path, name: str, *more: str) -> list[Obj]:
    """The default overlay's objects with ``more`` components, as a user's overlay renders."""
    tree = tmp_path / "kubernetes"
    shutil.copytree(KUBERNETES_DIR, tree)
    overlay = tree / "overlays" / name
    overlay.mkdir()
    doc = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["../../base"],
        "components": [f"../../components/{c}" for c in (*DEFAULT_COMPONENTS, *more)],
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    return render_kustomize(overlay)


def test_the_incidents_pvc_component_puts_the_incident_dir_on_a_claim(tmp_path: Path) -> None:
    """Bundles that outlive the pod with kustomize: the claim replaces the emptyDir (one source
    per volume), and every pod promise of the default variant still holds."""
    objs = default_with(tmp_path, "persistent", "incidents-pvc")
    (claim,) = [o for o in objs if o["kind"] == "PersistentVolumeClaim"]
    (dep,) = workloads(objs)
    volumes = dep["spec"]["template"]["spec"]["volumes"]
    (incidents,) = [v for v in volumes if v["name"] == "engine-watchdog-incidents"]
    name = claim["metadata"]["name"]
    assert incidents == {
        "name": "engine-watchdog-incidents",
        "persistentVolumeClaim": {"claimName": name},
    }
    for check in ALL_CHECKS:
        check(Rendering("persistent", "kustomize", objs, Expect(api_key=True)))


def test_the_pod_log_component_grants_get_on_pods_log_only(tmp_path: Path) -> None:
    """The engine container's log in bundles: the sidecar is told which container (the name
    the engine container really has), and its ServiceAccount may get pods/log and nothing
    more; every pod promise of the default variant still holds."""
    from tests.deploy.pod_checks import SIDECAR, configmap

    objs = default_with(tmp_path, "with-log", "pod-log")
    (dep,) = workloads(objs)
    names = {c["name"] for c in dep["spec"]["template"]["spec"]["containers"]}
    assert configmap(objs, dep)["ENGINE_WATCHDOG_POD_LOG"] in names - {SIDECAR}
    (role,) = [o for o in objs if o["kind"] == "Role" and o["metadata"]["name"].endswith("pod-log")]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}]
    (binding,) = [
        o for o in objs if o["kind"] == "RoleBinding" and "pod-log" in o["metadata"]["name"]
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert [s["name"] for s in binding["subjects"]] == ["engine-watchdog"]
    for check in ALL_CHECKS:
        check(Rendering("with-log", "kustomize", objs, Expect(api_key=True)))


DEFAULTS_SENTENCE = "The default on Kubernetes: answer + capture + readiness, restarts opt-in"


def test_the_default_actions_agree_in_kustomize_helm_and_docs(
    rendered: dict[str, list[Obj]],
) -> None:
    """One production default, said by the default overlay, the chart's defaults and both
    pages: answer + capture, the readiness gate on, no rung that ends the engine."""
    from tests.deploy import manifests as m
    from tests.deploy.pod_checks import configmap, pod
    from tests.deploy.tools import DEPLOY

    chart_objs = m.render_chart(m.CHART, {})
    for source, objs in (("kustomize", rendered["default"]), ("helm", chart_objs)):
        (dep,) = workloads(objs)
        config = configmap(objs, dep)
        assert config["ENGINE_WATCHDOG_ACTION"] == "answer,capture", source
        assert config["ENGINE_WATCHDOG_READINESS_GATE"] == "true", source
        gates = pod(dep)["readinessGates"]
        assert gates == [{"conditionType": "engine-watchdog.io/progressing"}], source
    docs = DEPLOY.parent / "docs"
    kubernetes_md = (docs / "kubernetes.md").read_text()
    helm_md = (docs / "helm.md").read_text()
    for page, text in (("kubernetes.md", kubernetes_md), ("helm.md", helm_md)):
        assert DEFAULTS_SENTENCE in " ".join(text.replace("*", "").split()), page
    assert "`ENGINE_WATCHDOG_ACTION=answer,capture`" in kubernetes_md
    assert "| `readinessGate.enabled` | `true` |" in helm_md
    assert "`config.action: answer,capture`" in helm_md
