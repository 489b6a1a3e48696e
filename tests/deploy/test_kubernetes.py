"""deploy/kubernetes: every overlay renders, validates against pinned schemas, and keeps its
security promises (SYS_PTRACE only where meant, Baseline-clean where meant)."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.tools import (
    KUBERNETES_DIR,
    KUBERNETES_VERSION,
    OVERLAYS,
    PROMETHEUS_DIR,
    run,
    tool,
)

Obj = dict[str, Any]
# Pod Security Standards, Baseline: the only capabilities a container may add (FACTS.md).
BASELINE_CAPS = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip
CUDA_ENV = {
    "CUDA_ENABLE_USER_TRIGGERED_COREDUMP",
    "CUDA_COREDUMP_PIPE",
    "CUDA_COREDUMP_FILE",
    "CUDA_COREDUMP_GENERATION_FLAGS",
}
# Engine env naming files in the dumps volume: CUDA pipes and cores, NCCL flight recorder.
DUMP_PATHS = (
    "CUDA_COREDUMP_PIPE",
    "CUDA_COREDUMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    "TORCH_FR_DUMP_TEMP_FILE",
)
WITH_PTRACE = ("default", "liveness", "events")


def _render(path: str) -> list[Obj]:
    out = run([tool("kubectl"), "kustomize", str(path)], timeout=60)
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Obj]]:
    return {name: _render(str(KUBERNETES_DIR / "overlays" / name)) for name in OVERLAYS}


def _deployment(objs: list[Obj]) -> Obj:
    (dep,) = [o for o in objs if o["kind"] == "Deployment"]
    return dep


def _pod(objs: list[Obj]) -> Obj:
    spec: Obj = _deployment(objs)["spec"]["template"]["spec"]
    return spec


def _container(objs: list[Obj], name: str) -> Obj:
    found: list[Obj] = [c for c in _pod(objs)["containers"] if c["name"] == name]
    assert len(found) == 1, f"{len(found)} containers named {name}"
    return found[0]


def _env(container: Obj) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def _uid(pod: Obj, container: Obj) -> object:
    return container.get("securityContext", {}).get(
        "runAsUser", pod.get("securityContext", {}).get("runAsUser")
    )


def test_every_overlay_validates_against_pinned_schemas(rendered: dict[str, list[Obj]]) -> None:
    for name, objs in rendered.items():
        kinds = sorted(o["kind"] for o in objs)
        assert {"ConfigMap", "Deployment", "Service"} <= set(kinds), name
        for obj in objs:
            try:
                kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                where = ".".join(str(p) for p in exc.path)
                pytest.fail(f"{name}: {obj['kind']}/{obj['metadata']['name']}: {where}: {exc}")


def test_validator_rejects_a_misspelt_field(rendered: dict[str, list[Obj]]) -> None:
    """The schema check has teeth: an unknown field fails in strict mode."""
    dep = _deployment(rendered["default"])
    bad = yaml.safe_load(yaml.safe_dump(dep))
    bad["spec"]["template"]["spec"]["shareProcessNamespaces"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_sidecar_shape(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objs = rendered[overlay]
    pod = _pod(objs)
    engine, sidecar = _container(objs, "vllm"), _container(objs, "engine-watchdog")
    assert [c["name"] for c in pod["containers"]] == ["vllm", "engine-watchdog"]
    assert pod["shareProcessNamespace"] is True
    # the engine's user, explicitly (the images' defaults differ: root vs 1000)
    assert _uid(pod, sidecar) is not None and _uid(pod, sidecar) == _uid(pod, engine)
    ctx = sidecar["securityContext"]
    assert ctx["capabilities"]["drop"] == ["ALL"]
    assert ctx["allowPrivilegeEscalation"] is False and not ctx.get("privileged")
    # NVML without taking a GPU
    env = _env(sidecar)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    for kind in ("requests", "limits"):
        assert "nvidia.com/gpu" not in sidecar["resources"].get(kind, {})
    assert sidecar["resources"]["requests"] and sidecar["resources"]["limits"]["memory"]
    assert "readinessProbe" not in sidecar and "livenessProbe" not in sidecar
    assert {p["name"]: p["containerPort"] for p in sidecar["ports"]} == {"watchdog": 9400}
    assert "startupProbe" in engine


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_sidecar_reads_the_engine_api_key_from_an_optional_secret(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    """The key comes from a Secret (the one the engine reads as VLLM_API_KEY), never from a
    literal or the ConfigMap, and a missing Secret does not stop the pod."""
    sidecar = _container(rendered[overlay], "engine-watchdog")
    (entry,) = [e for e in sidecar["env"] if e["name"] == "ENGINE_WATCHDOG_API_KEY"]
    assert "value" not in entry
    ref = entry["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"], ref["optional"]) == ("vllm-api-key", "api-key", True)
    assert not [k for k in _configmap(rendered[overlay]) if "API_KEY" in k]
    assert not [a for a in sidecar.get("args", []) if "api-key" in a]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_cuda_dumps_and_incidents_volumes(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objs = rendered[overlay]
    engine, sidecar = _container(objs, "vllm"), _container(objs, "engine-watchdog")
    env = _env(engine)
    assert set(env) >= CUDA_ENV
    assert env["CUDA_ENABLE_USER_TRIGGERED_COREDUMP"] == "1"
    engine_mounts = {m["mountPath"]: m["name"] for m in engine["volumeMounts"]}
    sidecar_mounts = {m["mountPath"]: m["name"] for m in sidecar["volumeMounts"]}
    volumes = {v["name"]: v for v in _pod(objs)["volumes"]}
    for var in DUMP_PATHS:
        directory = env[var].rsplit("/", 1)[0]
        assert engine_mounts.get(directory) == sidecar_mounts.get(directory), var
        assert "emptyDir" in volumes[engine_mounts[directory]], var
    config = _configmap(objs)
    incidents = config["ENGINE_WATCHDOG_INCIDENT_DIR"]
    assert incidents in sidecar_mounts and incidents not in engine_mounts


def _configmap(objs: list[Obj]) -> dict[str, str]:
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap"]
    (ref,) = _container(objs, "engine-watchdog")["envFrom"]
    assert ref["configMapRef"]["name"] == cm["metadata"]["name"]
    data: dict[str, str] = cm["data"]
    assert all(key.startswith("ENGINE_WATCHDOG_") for key in data)
    return data


@pytest.mark.parametrize("overlay", WITH_PTRACE)
def test_sidecar_adds_sys_ptrace_and_only_that(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    objs = rendered[overlay]
    assert _container(objs, "engine-watchdog")["securityContext"]["capabilities"]["add"] == [
        "SYS_PTRACE"
    ]
    assert "add" not in _container(objs, "vllm").get("securityContext", {}).get("capabilities", {})


def test_baseline_overlay_meets_pod_security_baseline(rendered: dict[str, list[Obj]]) -> None:
    objs = rendered["baseline"]
    pod = _pod(objs)
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(key), key
    assert all("hostPath" not in v for v in pod.get("volumes", []))
    assert pod.get("securityContext", {}).get("seccompProfile", {}).get("type") != "Unconfined"
    for c in pod["containers"] + pod.get("initContainers", []):
        ctx = c.get("securityContext", {})
        added = set(ctx.get("capabilities", {}).get("add", []))
        assert added <= BASELINE_CAPS, f"{c['name']} adds {added}: Baseline forbids it"
        assert added == set(), f"{c['name']} adds {added}"  # we add none, though Baseline would
        assert not ctx.get("privileged") and ctx.get("procMount", "Default") == "Default"
        assert ctx.get("seccompProfile", {}).get("type") != "Unconfined"
        assert all("hostPort" not in p for p in c.get("ports", []))
    engine_args = _container(objs, "vllm")["args"]
    fallback = [a for a in engine_args if a.startswith("--watchdog-config=")]
    assert len(fallback) == 1 and "/var/run/engine-watchdog/dumps" in fallback[0]


def test_liveness_only_in_the_liveness_overlay(rendered: dict[str, list[Obj]]) -> None:
    for name, objs in rendered.items():
        probe = _container(objs, "vllm").get("livenessProbe")
        if name != "liveness":
            assert probe is None, name
            assert "liveness" not in _configmap(objs)["ENGINE_WATCHDOG_ACTION"].split(",")
            continue
        assert probe is not None
        assert probe["httpGet"] == {"path": "/livez", "port": 9400}
        assert probe["periodSeconds"] * probe["failureThreshold"] >= 30
        assert _configmap(objs)["ENGINE_WATCHDOG_ACTION"].split(",") == ["capture", "liveness"]


def test_events_overlay_grants_events_only(rendered: dict[str, list[Obj]]) -> None:
    objs = rendered["events"]
    (role,) = [o for o in objs if o["kind"] == "Role"]
    assert [r["resources"] for r in role["rules"]] == [["events"]]
    (binding,) = [o for o in objs if o["kind"] == "RoleBinding"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    pod = _pod(objs)
    assert pod["serviceAccountName"] == binding["subjects"][0]["name"]
    assert pod["automountServiceAccountToken"] is False  # the engine gets no token
    mounts = _container(objs, "engine-watchdog")["volumeMounts"]
    assert "/var/run/secrets/kubernetes.io/serviceaccount" in {m["mountPath"] for m in mounts}
    for name in ("default", "baseline", "liveness"):
        assert not [o for o in rendered[name] if o["kind"] in ("Role", "RoleBinding")]


def test_podmonitors_select_the_sidecar_and_vllm(rendered: dict[str, list[Obj]]) -> None:
    objs = _render(str(PROMETHEUS_DIR))
    monitors = {o["metadata"]["name"]: o for o in objs if o["kind"] == "PodMonitor"}
    assert {o["kind"] for o in objs} == {"PodMonitor", "PrometheusRule"}
    labels = _deployment(rendered["default"])["spec"]["template"]["metadata"]["labels"]
    ports = {p["name"] for c in _pod(rendered["default"])["containers"] for p in c.get("ports", [])}
    jobs = {}
    for name, monitor in monitors.items():
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert endpoint["port"] in ports, name
        (relabel,) = endpoint["relabelings"]
        jobs[endpoint["port"]] = relabel["replacement"]
    assert jobs == {"watchdog": "engine-watchdog", "http": "vllm"}
