"""The one assertion set every rendering of the watched pod passes (tests/deploy/manifests.py):
kustomize overlays, the Helm chart, the Helm post-renderer over production-stack.

Each check takes the rendered objects and what the rendering promises (``Expect``) and fails
with the rendering's name and the broken promise.
"""

from __future__ import annotations

from collections.abc import Iterator

import kubernetes_validate
import pytest

from tests.deploy.manifests import Obj, Rendering
from tests.deploy.tools import KUBERNETES_VERSION

SIDECAR = "engine-watchdog"
ENGINE = "vllm"
# Pod Security Standards, Baseline: the only capabilities a container may add
# (kubernetes.io/docs/concepts/security/pod-security-standards).
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
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
OURS = {"app.kubernetes.io/name": "engine-watchdog"}


# ---- lookups -----------------------------------------------------------------------------
def workloads(objs: list[Obj]) -> list[Obj]:
    """Deployments and StatefulSets that carry the sidecar."""
    return [
        o
        for o in objs
        if o["kind"] in ("Deployment", "StatefulSet")
        and SIDECAR in [c["name"] for c in o["spec"]["template"]["spec"]["containers"]]
    ]


def pod(workload: Obj) -> Obj:
    spec: Obj = workload["spec"]["template"]["spec"]
    return spec


def container(workload: Obj, name: str) -> Obj:
    found: list[Obj] = [c for c in pod(workload)["containers"] if c["name"] == name]
    assert len(found) == 1, f"{workload['metadata']['name']}: {len(found)} containers {name}"
    return found[0]


def env(c: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in c.get("env", [])}


def env_values(c: Obj) -> dict[str, str]:
    return {name: e.get("value", "") for name, e in env(c).items()}


def uid(workload: Obj, c: Obj) -> object:
    return c.get("securityContext", {}).get(
        "runAsUser", pod(workload).get("securityContext", {}).get("runAsUser")
    )


def configmap(objs: list[Obj], workload: Obj) -> dict[str, str]:
    """The sidecar's settings: the ConfigMap its envFrom names, all ENGINE_WATCHDOG_*."""
    (ref,) = container(workload, SIDECAR)["envFrom"]
    name = ref["configMapRef"]["name"]
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == name]
    data: dict[str, str] = cm["data"]
    assert all(key.startswith("ENGINE_WATCHDOG_") for key in data), sorted(data)
    return data


def each(r: Rendering) -> Iterator[tuple[str, Obj]]:
    found = workloads(r.objs)
    assert len(found) == r.expect.workloads, f"{r.name}: {len(found)} watched workloads"
    for w in found:
        yield f"{r.source}/{r.name}/{w['metadata']['name']}", w


# ---- the assertion set -------------------------------------------------------------------
def check_schemas(r: Rendering) -> None:
    """Every object validates in strict mode against the pinned Kubernetes schemas; custom
    resources (production-stack's ServiceMonitors, ...) are not the Kubernetes API's to check."""
    for obj in r.objs:
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.utils.SchemaNotFoundError:
            group = obj["apiVersion"].rpartition("/")[0]
            assert "." in group and not group.endswith(".k8s.io"), f"{r.name}: {obj['kind']}"
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{r.name}: {obj['kind']}/{obj['metadata']['name']}: {where}: {exc}")


def check_sidecar_shape(r: Rendering) -> None:
    for where, w in each(r):
        spec, engine, sidecar = pod(w), container(w, ENGINE), container(w, SIDECAR)
        names = [c["name"] for c in spec["containers"]]
        assert names[0] == ENGINE and names[-1] == SIDECAR, (where, names)
        assert spec["shareProcessNamespace"] is True, where
        # the engine's user, explicitly (the images' defaults differ: root vs 1000)
        assert uid(w, sidecar) is not None and uid(w, sidecar) == uid(w, engine), where
        ctx = sidecar["securityContext"]
        assert ctx["capabilities"]["drop"] == ["ALL"], where
        assert ctx["allowPrivilegeEscalation"] is False and not ctx.get("privileged"), where
        assert ctx["readOnlyRootFilesystem"] is True, where
        values = env_values(sidecar)
        assert values["NVIDIA_VISIBLE_DEVICES"] == "all", where  # NVML without taking a GPU
        assert values["NVIDIA_DRIVER_CAPABILITIES"] == "utility", where
        for kind in ("requests", "limits"):
            assert "nvidia.com/gpu" not in sidecar["resources"].get(kind, {}), where
        assert sidecar["resources"]["requests"] and sidecar["resources"]["limits"]["memory"]
        assert "readinessProbe" not in sidecar and "livenessProbe" not in sidecar, where
        ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
        expected = {
            **({"watchdog": 9400} if r.expect.metrics else {}),
            **({"guard": 8001} if r.expect.guard else {}),
            **({"peer": r.expect.peer_port} if r.expect.peer_port else {}),
        }
        assert ports == expected, where
        assert w["spec"]["template"]["metadata"]["labels"]["engine-watchdog"] == "enabled"
        assert ("startupProbe" in engine) == r.expect.engine_probe, where


def check_dumps_and_incidents(r: Rendering) -> None:
    for where, w in each(r):
        engine, sidecar = container(w, ENGINE), container(w, SIDECAR)
        values = env_values(engine)
        assert set(values) >= CUDA_ENV, where
        assert values["CUDA_ENABLE_USER_TRIGGERED_COREDUMP"] == "1", where
        engine_mounts = {m["mountPath"]: m["name"] for m in engine["volumeMounts"]}
        sidecar_mounts = {m["mountPath"]: m["name"] for m in sidecar["volumeMounts"]}
        volumes = {v["name"]: v for v in pod(w)["volumes"]}
        for var in DUMP_PATHS:
            directory = values[var].rsplit("/", 1)[0]
            assert engine_mounts.get(directory) == sidecar_mounts.get(directory), (where, var)
            assert "emptyDir" in volumes[engine_mounts[directory]], (where, var)
        incidents = configmap(r.objs, w)["ENGINE_WATCHDOG_INCIDENT_DIR"]
        assert incidents in sidecar_mounts and incidents not in engine_mounts, where
        assert sidecar_mounts["/tmp"] in volumes, where  # a writable /tmp on a read-only root


def check_capabilities(r: Rendering) -> None:
    """SYS_PTRACE on the sidecar and nothing else where meant; no capability at all in the
    Baseline variants; never one on the engine."""
    for where, w in each(r):
        added = container(w, SIDECAR)["securityContext"]["capabilities"].get("add", [])
        assert added == (["SYS_PTRACE"] if r.expect.ptrace else []), where
        assert "add" not in container(w, ENGINE).get("securityContext", {}).get(
            "capabilities", {}
        ), where
        if not r.expect.ptrace:
            check_pod_security_baseline(where, pod(w))


def check_pod_security_baseline(where: str, spec: Obj) -> None:
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(key), (where, key)
    assert all("hostPath" not in v for v in spec.get("volumes", [])), where
    assert spec.get("securityContext", {}).get("seccompProfile", {}).get("type") != "Unconfined"
    for c in spec["containers"] + spec.get("initContainers", []):
        ctx = c.get("securityContext", {})
        added = set(ctx.get("capabilities", {}).get("add", []))
        assert added <= BASELINE_CAPS, f"{where}: {c['name']} adds {added}: Baseline forbids it"
        assert not ctx.get("privileged") and ctx.get("procMount", "Default") == "Default"
        assert ctx.get("seccompProfile", {}).get("type") != "Unconfined", where
        assert all("hostPort" not in p for p in c.get("ports", [])), where


def check_liveness(r: Rendering) -> None:
    for where, w in each(r):
        probe = container(w, ENGINE).get("livenessProbe")
        actions = configmap(r.objs, w)["ENGINE_WATCHDOG_ACTION"].split(",")
        # The default on Kubernetes: answer + capture (+ the readiness gate); no rung that
        # ends the engine unless asked for (liveness below).
        assert actions[:2] == ["answer", "capture"], where
        assert not {"abort", "restart"} & set(actions), where
        if not r.expect.liveness:
            assert probe is None or r.expect.own_liveness_ok, where
            assert probe is None or probe.get("httpGet", {}).get("port") != 9400, where
            assert "liveness" not in actions, where
            continue
        assert probe is not None, where
        assert probe["httpGet"] == {"path": "/livez", "port": 9400}, where
        assert probe["periodSeconds"] * probe["failureThreshold"] >= 30, where
        assert actions == ["answer", "capture", "liveness"], where


def _ours(objs: list[Obj], kind: str) -> list[Obj]:
    return [
        o
        for o in objs
        if o["kind"] == kind and OURS.items() <= o["metadata"].get("labels", {}).items()
    ]


def _rbac(r: Rendering, resources: list[str]) -> tuple[list[Obj], list[Obj]]:
    """Our Roles whose rules are on ``resources``, and the RoleBindings that name them."""
    roles = [
        o for o in _ours(r.objs, "Role") if [x["resources"] for x in o["rules"]] == [resources]
    ]
    names = {o["metadata"]["name"] for o in roles}
    bindings = [o for o in _ours(r.objs, "RoleBinding") if o["roleRef"]["name"] in names]
    return roles, bindings


def check_events(r: Rendering) -> None:
    roles, bindings = _rbac(r, ["events"])
    if not (r.expect.events or r.expect.readiness):
        assert not _ours(r.objs, "Role") and not _ours(r.objs, "RoleBinding"), r.name
        assert not _ours(r.objs, "ServiceAccount"), r.name
    if not r.expect.events:
        assert not roles and not bindings, r.name
        for where, w in each(r):
            assert "ENGINE_WATCHDOG_K8S_EVENTS" not in configmap(r.objs, w), where
        return
    assert len(roles) == 1 and len(bindings) == 1, (r.name, "one Role and one RoleBinding")
    (role,), (binding,) = roles, bindings
    assert {v for r_ in role["rules"] for v in r_["verbs"]} == {"create", "patch"}, r.name
    _sidecar_token(r, binding)
    for where, w in each(r):
        assert configmap(r.objs, w)["ENGINE_WATCHDOG_K8S_EVENTS"] == "true", where


def check_readiness(r: Rendering) -> None:
    """The readiness gate: the pod gates on the condition, the ConfigMap turns the sidecar's
    PATCH on, and a Role may patch pods/status and nothing else."""
    roles, bindings = _rbac(r, ["pods/status"])
    if not r.expect.readiness:
        assert not roles and not bindings, r.name
        for where, w in each(r):
            assert "readinessGates" not in pod(w), where
            assert "ENGINE_WATCHDOG_READINESS_GATE" not in configmap(r.objs, w), where
        return
    assert len(roles) == 1 and len(bindings) == 1, (r.name, "one Role and one RoleBinding")
    (role,), (binding,) = roles, bindings
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]}
    ], r.name
    _sidecar_token(r, binding)
    for where, w in each(r):
        gates = pod(w)["readinessGates"]
        assert gates == [{"conditionType": "engine-watchdog.io/progressing"}], where
        assert configmap(r.objs, w)["ENGINE_WATCHDOG_READINESS_GATE"] == "true", where


def _sidecar_token(r: Rendering, binding: Obj) -> None:
    """The binding's ServiceAccount is the pod's; its token is the sidecar's alone."""
    subjects = {s["name"] for s in binding["subjects"]}
    for where, w in each(r):
        spec = pod(w)
        assert spec["serviceAccountName"] in subjects, where
        assert spec["automountServiceAccountToken"] is False, where  # the engine gets no token
        mounts = {m["mountPath"] for m in container(w, SIDECAR)["volumeMounts"]}
        assert TOKEN_PATH in mounts, where
        assert TOKEN_PATH not in {m["mountPath"] for m in container(w, ENGINE)["volumeMounts"]}
        assert {"POD_NAME", "POD_NAMESPACE", "POD_UID"} <= set(env(container(w, SIDECAR)))


def check_guard(r: Rendering) -> None:
    services = [
        s
        for s in r.objs
        if s["kind"] == "Service"
        and any(p.get("targetPort") == "guard" for p in s["spec"]["ports"])
    ]
    if not r.expect.guard:
        assert not services, r.name
        for where, w in each(r):
            assert "ENGINE_WATCHDOG_GUARD_LISTEN" not in configmap(r.objs, w), where
        return
    for where, w in each(r):
        labels = w["spec"]["template"]["metadata"]["labels"]
        mine = [s for s in services if s["spec"]["selector"].items() <= labels.items()]
        assert len(mine) == 1, (where, [s["metadata"]["name"] for s in services])
        config = configmap(r.objs, w)
        assert config["ENGINE_WATCHDOG_GUARD_LISTEN"] == "0.0.0.0:8001", where
        # The guard answers every client at a stall: the answer rung is on (issue 15).
        assert config["ENGINE_WATCHDOG_ACTION"].split(",")[0] == "answer", where


def check_api_key_and_alerts(r: Rendering) -> None:
    """One Secret serves both containers: the engine's VLLM_API_KEY and the sidecar's
    ENGINE_WATCHDOG_API_KEY name the same key; never a plain value in the manifests."""
    for where, w in each(r):
        engine, sidecar = env(container(w, ENGINE)), env(container(w, SIDECAR))
        mine = sidecar.get("ENGINE_WATCHDOG_API_KEY")
        if not r.expect.api_key:
            assert mine is None, where
        else:
            assert mine is not None and "value" not in mine, where
            ref = mine["valueFrom"]["secretKeyRef"]
            assert engine["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"] == ref, where
        data = configmap(r.objs, w)
        assert data.get("ENGINE_WATCHDOG_ALERTMANAGER", "") == r.expect.alertmanager, where


ALL_CHECKS = (
    check_schemas,
    check_sidecar_shape,
    check_dumps_and_incidents,
    check_capabilities,
    check_liveness,
    check_events,
    check_readiness,
    check_guard,
    check_api_key_and_alerts,
)
