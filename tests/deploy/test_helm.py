"""deploy/helm: what only the chart and its post-renderer do. Its renderings keep every pod
promise in test_manifests.py; here: Helm's lint, values that must be refused, the post-renderer
script's contract, what it leaves alone, and that the shared assertion set has teeth."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import manifests as m
from tests.deploy import pod_checks as checks
from tests.deploy.tools import REPO

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def stack_chart() -> Path:
    return m.PRODUCTION_STACK_CHART


@pytest.mark.parametrize("name", list(m.HELM_VALUES))
def test_helm_lint_is_clean_in_strict_mode(name: str) -> None:
    report = m.lint_chart(m.CHART, m.HELM_VALUES[name][0])
    assert report["errors"] == [], report
    worse_than_info = [msg for msg in report["messages"] if msg["severity"] >= 2]
    assert worse_than_info == [], worse_than_info


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"podSecurity": "privileged"}, 'podSecurity must be ptrace or baseline, not "privileged"'),
        (
            {"liveness": {"enabled": True, "failureThreshold": 2}},
            "periodSeconds x failureThreshold must be >= 30 s",
        ),
        ({"engine": {"container": {"name": "engine"}}}, 'engine.container.name must be "vllm"'),
        ({"inject": {"manifests": "kind: ConfigMap"}}, "set engine.enabled=false with it"),
        (
            {"guard": {"enabled": True, "drainSeconds": 55}},
            "terminationGracePeriodSeconds must be >= guard.drainSeconds \\+ 10",
        ),
        (
            {"persistence": {"enabled": True}, "engine": {"replicas": 2}},
            "persistence.enabled with engine.replicas > 1",
        ),
    ],
    ids=[
        "podSecurity",
        "liveness-too-eager",
        "engine-name",
        "inject-and-engine",
        "grace",
        "persistence-replicas",
    ],
)
def test_values_that_would_break_the_pod_are_refused(values: Obj, message: str) -> None:
    import helm_python as helm

    with pytest.raises(helm.HelmRenderError, match=message):
        m.render_chart(m.CHART, values)


def test_a_settings_change_rolls_the_pod() -> None:
    """kustomize renames the ConfigMap by its hash; the chart annotates the pod with one."""

    def checksum(values: Obj) -> str:
        (dep,) = checks.workloads(m.render_chart(m.CHART, values))
        return str(
            dep["spec"]["template"]["metadata"]["annotations"]["engine-watchdog/config-checksum"]
        )

    assert checksum({}) == checksum({})
    assert checksum({}) != checksum({"config": {"stall-seconds": 60}})


def test_post_renderer_leaves_everything_else_alone(stack_chart: Path) -> None:
    stack = m.render_chart(stack_chart, m.PRODUCTION_STACK_VALUES["secure"], "vllm")
    out = m.post_render(stack_chart, "secure", {})

    def key(o: Obj) -> tuple[str, str]:
        return str(o["kind"]), str(o["metadata"]["name"])

    before, after = {key(o): o for o in stack}, {key(o): o for o in out}
    (watched,) = checks.workloads(out)
    added = {key(o) for o in out if checks.OURS.items() <= o["metadata"].get("labels", {}).items()}
    # Ours: the settings, and the readiness gate's identity and Role (on by default).
    assert (
        set(after) - set(before)
        == added
        == {
            ("ConfigMap", "engine-watchdog"),
            ("ServiceAccount", "engine-watchdog"),
            ("Role", "engine-watchdog-readiness"),
            ("RoleBinding", "engine-watchdog-readiness"),
        }
    )
    for k, obj in before.items():
        if k != key(watched):
            assert after[k] == obj, k  # the router, its Service, the Secret, ...: untouched
    engine_before = checks.container(before[key(watched)], checks.ENGINE)
    engine_after = checks.container(watched, checks.ENGINE)
    assert engine_after["command"] == engine_before["command"]
    assert engine_after.get("args") == engine_before.get("args")


def test_post_renderer_refuses_manifests_without_an_engine(stack_chart: Path) -> None:
    import helm_python as helm

    with pytest.raises(
        helm.HelmRenderError, match='no Deployment or StatefulSet with a container named "llm"'
    ):
        m.render_chart(
            m.CHART,
            {
                "engine": {"enabled": False},
                "inject": {"manifests": "kind: ConfigMap\n", "containerName": "llm"},
            },
        )


def _post_render_script(tmp: Path, stdin: str, *args: str) -> subprocess.CompletedProcess[str]:
    helm = tmp / "helm"
    helm.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m tests.deploy.helm_cli "$@"\n')
    helm.chmod(0o755)
    env = {**os.environ, "HELM_BIN": str(helm), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [str(m.POST_RENDERER), *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
        check=False,
    )


def test_post_renderer_script_is_a_helm_post_renderer(stack_chart: Path, tmp_path: Path) -> None:
    """The script as Helm runs it: manifests on stdin, the arguments of --post-renderer-args
    (a values file, --set), the manifests with the sidecar on stdout; non-zero when it cannot."""
    stack = m.render_chart_text(stack_chart, m.PRODUCTION_STACK_VALUES["secure"], "vllm")
    values = tmp_path / "watchdog-values.yaml"
    values.write_text(yaml.safe_dump({"podSecurity": "baseline"}))
    done = _post_render_script(
        tmp_path, stack, "-f", str(values), "--set", "config.stall-seconds=45"
    )
    assert done.returncode == 0, done.stderr
    objs = [d for d in yaml.safe_load_all(done.stdout) if d]
    (watched,) = checks.workloads(objs)
    assert checks.configmap(objs, watched)["ENGINE_WATCHDOG_STALL_SECONDS"] == "45"
    assert (
        checks.container(watched, checks.SIDECAR)["securityContext"]["capabilities"].get("add")
        is None
    )
    refused = _post_render_script(tmp_path, "kind: ConfigMap\nmetadata: {name: x}\n")
    assert refused.returncode != 0 and "no Deployment or StatefulSet" in refused.stderr


TEETH: dict[str, tuple[Callable[[m.Rendering], None], dict[str, Any]]] = {
    "ptrace-where-baseline-promised": (checks.check_capabilities, {"ptrace": False}),
    "no-liveness-where-promised": (checks.check_liveness, {"liveness": True}),
    "no-events-where-promised": (checks.check_events, {"events": True}),
    "a-readiness-gate-where-none-promised": (checks.check_readiness, {"readiness": False}),
    "no-guard-where-promised": (checks.check_guard, {"guard": True}),
    "no-key-where-promised": (checks.check_api_key_and_alerts, {"api_key": True}),
    "two-workloads-promised": (checks.check_sidecar_shape, {"workloads": 2}),
}


@pytest.mark.parametrize("case", list(TEETH))
def test_the_shared_assertion_set_has_teeth(case: str) -> None:
    """Each check fails on the default rendering held to a promise it does not keep."""
    (rendering,) = [r for r in m.helm_renderings() if r.name == "default"]
    check, promise = TEETH[case]
    with pytest.raises(AssertionError):
        check(replace(rendering, expect=replace(rendering.expect, **promise)))


def test_the_shape_check_catches_a_sidecar_of_another_user() -> None:
    (rendering,) = [r for r in m.helm_renderings() if r.name == "default"]
    objs = yaml.safe_load(yaml.safe_dump(rendering.objs))
    (dep,) = checks.workloads(objs)
    checks.container(dep, checks.SIDECAR)["securityContext"]["runAsUser"] = 1000
    with pytest.raises(AssertionError):
        checks.check_sidecar_shape(replace(rendering, objs=objs))


def test_fullname_override_keeps_two_post_rendered_releases_apart(stack_chart: Path) -> None:
    """Two stacks post-rendered into one namespace: each sidecar reads its own ConfigMap."""
    names = set()
    for name in ("stack-a", "stack-b"):
        objs = m.post_render(stack_chart, "secure", {"fullnameOverride": f"{name}-watchdog"})
        (watched,) = checks.workloads(objs)
        (ref,) = checks.container(watched, checks.SIDECAR)["envFrom"]
        names.add(ref["configMapRef"]["name"])
        assert checks.configmap(objs, watched)  # the named ConfigMap is in the same rendering
    assert names == {"stack-a-watchdog", "stack-b-watchdog"}


def _workload(kind: str, name: str, labels: dict[str, str]) -> Obj:
    """A minimal vLLM workload as another chart might render it."""
    spec: Obj = {
        "selector": {"matchLabels": {"app": name}},
        "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {
                "containers": [
                    {
                        "name": "vllm",
                        "image": "vllm/vllm-openai:v0.33.0",
                        "args": ["--model=m"],
                        "startupProbe": {"httpGet": {"path": "/health", "port": 8000}},
                    }
                ]
            },
        },
    }
    if kind == "StatefulSet":
        spec["serviceName"] = name
    meta = {"name": name, "labels": labels}
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": meta, "spec": spec}


def test_post_renderer_takes_statefulsets_and_honours_match_labels() -> None:
    docs = [
        _workload("StatefulSet", "llm-a", {"watch": "yes"}),
        _workload("Deployment", "llm-b", {"watch": "no"}),
    ]
    inject: Obj = {"manifests": "---\n".join(yaml.safe_dump(d) for d in docs)}
    values: Obj = {"engine": {"enabled": False}, "inject": inject}
    every = checks.workloads(m.render_chart(m.CHART, values))
    assert sorted((w["kind"], w["metadata"]["name"]) for w in every) == [
        ("Deployment", "llm-b"),
        ("StatefulSet", "llm-a"),
    ]
    inject["matchLabels"] = {"watch": "yes"}
    objs = m.render_chart(m.CHART, values)
    (only,) = checks.workloads(objs)
    assert (only["kind"], only["metadata"]["name"]) == ("StatefulSet", "llm-a")
    rendering = m.Rendering("statefulset", "post-renderer", objs, m.Expect())
    for check in checks.ALL_CHECKS:
        check(rendering)


def test_the_readiness_gate_keeps_a_workload_s_own_gates_and_service_account() -> None:
    """Post-rendered over a workload that has readinessGates and a ServiceAccount of its own:
    ours is added beside its gates, and the Role is bound to its ServiceAccount."""
    doc = _workload("Deployment", "llm", {})
    spec = doc["spec"]["template"]["spec"]
    spec["readinessGates"] = [{"conditionType": "example.com/warm"}]
    spec["serviceAccountName"] = "llm-sa"
    values: Obj = {
        "engine": {"enabled": False},
        "inject": {"manifests": yaml.safe_dump(doc)},
        "readinessGate": {"enabled": True},
    }
    objs = m.render_chart(m.CHART, values)
    (watched,) = checks.workloads(objs)
    assert checks.pod(watched)["readinessGates"] == [
        {"conditionType": "example.com/warm"},
        {"conditionType": "engine-watchdog.io/progressing"},
    ]
    (binding,) = [o for o in objs if o["kind"] == "RoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "llm-sa"}]
    assert not [o for o in objs if o["kind"] == "ServiceAccount"]  # the workload's own


def test_the_grace_period_covers_the_guard_s_drain() -> None:
    """The drain budget reaches the sidecar, and the pod's grace covers it."""
    objs = m.render_chart(m.CHART, {"guard": {"enabled": True, "drainSeconds": 25}})
    config = [o for o in objs if o["kind"] == "ConfigMap" and "data" in o]
    drains = [c["data"].get("ENGINE_WATCHDOG_GUARD_DRAIN_SECONDS") for c in config]
    assert "25" in drains, drains
    pods = [o["spec"]["template"]["spec"] for o in objs if o["kind"] == "Deployment"]
    assert pods and all(p["terminationGracePeriodSeconds"] >= 25 + 10 for p in pods)


def _incidents_volume(objs: list[Obj]) -> Obj:
    (pod,) = [o["spec"]["template"]["spec"] for o in objs if o["kind"] == "Deployment"]
    volumes: list[Obj] = pod["volumes"]
    (volume,) = [v for v in volumes if v["name"] == "engine-watchdog-incidents"]
    sidecar = next(c for c in pod["containers"] if c["name"] == "engine-watchdog")
    (mount,) = [v for v in sidecar["volumeMounts"] if v["name"] == "engine-watchdog-incidents"]
    assert mount["mountPath"] == "/var/lib/engine-watchdog/incidents"  # config.incident-dir
    return volume


def _claims(objs: list[Obj]) -> list[Obj]:
    return [o for o in objs if o["kind"] == "PersistentVolumeClaim"]


def test_persistence_gives_the_incident_dir_a_claim_kept_on_uninstall() -> None:
    values = {"persistence": {"enabled": True, "size": "50Gi", "storageClass": "fast-ssd"}}
    objs = m.render_chart(m.CHART, values)
    (claim,) = _claims(objs)
    assert claim["metadata"]["name"] == "engine-watchdog-incidents"
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert claim["spec"]["resources"]["requests"]["storage"] == "50Gi"
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    volume = _incidents_volume(objs)
    assert volume == {
        "name": "engine-watchdog-incidents",
        "persistentVolumeClaim": {"claimName": "engine-watchdog-incidents"},
    }
    for check in checks.ALL_CHECKS:  # every pod promise still holds with the claim
        check(m.Rendering("persistence", "helm", objs, m.Expect()))


@pytest.mark.parametrize(
    ("values", "claim_name", "made"),
    [
        ({"persistence": {"enabled": True, "existingClaim": "evidence"}}, "evidence", False),
        ({"incidents": {"persistentVolumeClaim": "older"}}, "older", False),
        (
            {"persistence": {"enabled": True, "storageClass": "-"}},
            "engine-watchdog-incidents",
            True,
        ),
        ({}, None, False),
    ],
    ids=["existing-claim", "older-value", "no-class", "off"],
)
def test_the_incident_dir_s_volume_follows_the_values(
    values: Obj, claim_name: str | None, made: bool
) -> None:
    objs = m.render_chart(m.CHART, values)
    volume = _incidents_volume(objs)
    if claim_name is None:
        assert "emptyDir" in volume and not _claims(objs)
        return
    assert volume["persistentVolumeClaim"] == {"claimName": claim_name}
    assert len(_claims(objs)) == int(made)
    if made:
        assert _claims(objs)[0]["spec"]["storageClassName"] == ""


def test_pod_log_reads_the_engine_container_with_a_role_of_get_pods_log_only() -> None:
    """podLog.enabled: the sidecar is told the engine container's real name, and its
    ServiceAccount, projected into the sidecar only, may get pods/log and nothing more."""
    objs = m.render_chart(m.CHART, {"podLog": {"enabled": True}})
    (watched,) = checks.workloads(objs)
    names = {c["name"] for c in checks.pod(watched)["containers"]}
    assert checks.configmap(objs, watched)["ENGINE_WATCHDOG_POD_LOG"] in names - {checks.SIDECAR}
    (role,) = [o for o in objs if o["kind"] == "Role" and o["metadata"]["name"].endswith("pod-log")]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}]
    bindings = [o for o in objs if o["kind"] == "RoleBinding"]
    (binding,) = [b for b in bindings if b["roleRef"]["name"] == role["metadata"]["name"]]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": checks.pod(watched)["serviceAccountName"]}
    ]
    off = m.render_chart(m.CHART, {})
    assert not [o for o in off if o["metadata"]["name"].endswith("pod-log")]
    assert "ENGINE_WATCHDOG_POD_LOG" not in checks.configmap(off, checks.workloads(off)[0])
