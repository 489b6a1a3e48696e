"""deploy/helm in GitOps mode, built the way Argo CD and Flux build it: no Helm post-renderer,
the other chart's ``helm template`` output as a kustomize resource, and this chart's
``helm template --output-dir`` as a kustomize Component over it (``kubectl kustomize``). The
result keeps every pod promise of tests/deploy/pod_checks.py; a wrong engine container name
fails the build with a message naming it instead of rendering a bogus second container."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import manifests as m
from tests.deploy import pod_checks as checks
from tests.deploy.tools import tool

Obj = dict[str, Any]
SIDECAR = checks.SIDECAR
STACK_ENGINE = "vllm-opt125m-deployment-vllm"  # production-stack's engine Deployment (secure)


def write_component(into: Path, values: Obj) -> Path:
    """What ``helm template engine-watchdog CHART --output-dir INTO`` writes: one file per
    non-empty template, under INTO/engine-watchdog/templates (Helm's own engine renders)."""
    helm = m._helm()
    merged = {**values, "engine": {"enabled": False}}
    with helm.Chart.load(str(m.CHART)) as chart:
        chart.validate_schema(merged)
        manifests: dict[str, str] = chart.render(merged, name="engine-watchdog")
    for path, text in manifests.items():
        if text.strip() and not path.endswith("NOTES.txt"):
            (into / path).parent.mkdir(parents=True, exist_ok=True)
            (into / path).write_text(text)
    return into / "engine-watchdog" / "templates"


def kustomize_over(tmp: Path, rendered: str, values: Obj) -> subprocess.CompletedProcess[str]:
    """The GitOps repository's kustomization: the other chart's render plus our Component."""
    (tmp / "rendered.yaml").write_text(rendered)
    component = write_component(tmp / "watchdog", values)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["rendered.yaml"],
        "components": [str(component.relative_to(tmp))],
    }
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return subprocess.run(
        [tool("kubectl"), "kustomize", str(tmp)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def built(done: subprocess.CompletedProcess[str]) -> list[Obj]:
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def gitops_values(name: str, **more: Any) -> Obj:
    return {"gitops": {"enabled": True, "workload": {"kind": "Deployment", "name": name}}, **more}


@pytest.fixture(scope="module")
def stack_rendered() -> str:
    return m.render_chart_text(
        m.PRODUCTION_STACK_CHART, m.PRODUCTION_STACK_VALUES["secure"], "vllm"
    )


GITOPS_CASES: dict[str, tuple[Obj, m.Expect]] = {
    "default": (
        {"apiKey": {"existingSecret": "vllm-secrets", "key": "vllmApiKey"}},
        m.Expect(api_key=True, own_liveness_ok=True),
    ),
    "baseline-liveness-events": (
        {"podSecurity": "baseline", "liveness": {"enabled": True}, "events": {"enabled": True}},
        m.Expect(ptrace=False, liveness=True, events=True, own_liveness_ok=True),
    ),
}


@pytest.mark.parametrize("case", list(GITOPS_CASES))
def test_gitops_component_over_production_stack_keeps_every_promise(
    case: str, stack_rendered: str, tmp_path: Path
) -> None:
    values, expect = GITOPS_CASES[case]
    objs = built(kustomize_over(tmp_path, stack_rendered, gitops_values(STACK_ENGINE, **values)))
    (watched,) = checks.workloads(objs)
    assert watched["metadata"]["name"] == STACK_ENGINE
    names = [c["name"] for c in checks.pod(watched)["containers"]]
    assert names == ["vllm", "engine-watchdog"]
    # the engine keeps its own securityContext; the pod gets engineUser (both run as it)
    assert checks.container(watched, "vllm")["securityContext"] == {"runAsNonRoot": False}
    assert checks.pod(watched)["securityContext"] == {"runAsUser": 0, "runAsGroup": 0}
    rendering = m.Rendering(case, "gitops", objs, expect)
    for check in checks.ALL_CHECKS:
        check(rendering)


IMAGE = "vllm/vllm-openai:v0.33.0"
PROBE = {"httpGet": {"path": "/health", "port": 8000}}


def _workload(container: str) -> str:
    doc = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llm"},
        "spec": {
            "selector": {"matchLabels": {"app": "llm"}},
            "template": {
                "metadata": {"labels": {"app": "llm"}},
                "spec": {
                    "containers": [{"name": container, "image": IMAGE, "startupProbe": PROBE}]
                },
            },
        },
    }
    return yaml.safe_dump(doc)


def test_the_engine_container_name_is_a_value(tmp_path: Path) -> None:
    values = gitops_values("llm", inject={"containerName": "server"})
    objs = built(kustomize_over(tmp_path, _workload("server"), values))
    (watched,) = checks.workloads(objs)
    (engine, sidecar) = checks.pod(watched)["containers"]
    assert (engine["name"], engine["image"], sidecar["name"]) == ("server", IMAGE, SIDECAR)
    assert set(checks.env(engine)) >= checks.CUDA_ENV
    annotations = watched["spec"]["template"]["metadata"]["annotations"]
    assert annotations["kubectl.kubernetes.io/default-container"] == "server"


def test_a_wrong_engine_container_name_fails_the_build_naming_it(tmp_path: Path) -> None:
    """A strategic merge on a missing container name would append one (no image, the engine's
    env): the build fails instead, exit 1, and the message names the container it looked for."""
    done = kustomize_over(tmp_path, _workload("server"), gitops_values("llm"))
    assert done.returncode == 1, done.stdout
    assert "fieldPath `spec.template.spec.containers.[name=vllm].image` is missing" in done.stderr
    assert "apps/llm" in done.stderr and not done.stdout


def test_a_wrong_workload_name_fails_the_build_naming_it(tmp_path: Path) -> None:
    done = kustomize_over(tmp_path, _workload("vllm"), gitops_values("vllm-engine"))
    assert done.returncode == 1, done.stdout
    assert "no matches for Id Deployment.v1.apps/vllm-engine" in done.stderr


def test_helm_lint_is_clean_in_gitops_mode() -> None:
    report = m.lint_chart(m.CHART, {**gitops_values("llm"), "engine": {"enabled": False}})
    assert report["errors"] == [], report
    assert [msg for msg in report["messages"] if msg["severity"] >= 2] == []


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"gitops": {"enabled": True}},
            "gitops.enabled needs gitops.workload.name",
        ),
        (
            {"gitops": {"enabled": True, "workload": {"kind": "Pod", "name": "x"}}},
            'gitops.workload.kind must be Deployment or StatefulSet, not "Pod"',
        ),
        (
            {**gitops_values("x"), "guard": {"enabled": True}},
            "gitops with guard.enabled needs gitops.workload.selector",
        ),
        (
            {**gitops_values("x"), "lws": {"enabled": True}},
            "lws.enabled renders the chart's own LeaderWorkerSet",  # the chart's own check
        ),
    ],
    ids=["no-name", "kind", "guard-selector", "lws"],
)
def test_gitops_values_that_cannot_work_are_refused(values: Obj, message: str) -> None:
    import helm_python as helm

    with pytest.raises(helm.HelmRenderError, match=message):
        m.render_chart(m.CHART, {**values, "engine": {"enabled": False}})


def test_gitops_with_the_guard_adds_a_guard_service_for_the_workload(tmp_path: Path) -> None:
    values = gitops_values("llm", guard={"enabled": True})
    values["gitops"]["workload"]["selector"] = {"app": "llm"}
    objs = built(kustomize_over(tmp_path, _workload("vllm"), values))
    (service,) = [o for o in objs if o["kind"] == "Service"]
    assert service["spec"]["selector"] == {"app": "llm"}
    assert service["spec"]["ports"] == [{"name": "guard", "port": 8001, "targetPort": "guard"}]
    rendering = m.Rendering("guard", "gitops", objs, m.Expect(guard=True))
    for check in checks.ALL_CHECKS:
        check(rendering)
