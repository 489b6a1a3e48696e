"""The LeaderWorkerSet renderings (multi-node vLLM): the Helm chart with ``lws.enabled`` and the
kustomize overlay ``lws``, and the LWS CRD's own schema to validate them against.

The CRD is github.com/kubernetes-sigs/lws's
config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml, vendored verbatim under
tests/data/vendor/lws/ at the commit its SOURCE.md names (tests/data/vendor/refresh.sh).

The shared assertion set (tests/deploy/pod_checks.py) reads Deployments; each template of a
LeaderWorkerSet is handed to it as one, with what LWS gives the pods it makes (its labels) and
what each pod uses of the rest: the leader everything, a worker the Secrets (its sidecar,
``engine-watchdog peer``, has no ConfigMap).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

import yaml

from tests.deploy.manifests import (
    CHART,
    VENDOR,
    Expect,
    Obj,
    Rendering,
    render_chart,
    render_kustomize,
)
from tests.deploy.tools import KUBERNETES_DIR

CRD = VENDOR / "lws" / "config" / "crd" / "bases" / "leaderworkerset.x-k8s.io_leaderworkersets.yaml"
KIND = "LeaderWorkerSet"
PEER_PORT = 9401
PEER_SECRET_FILE = "/var/run/engine-watchdog/peer/secret"
PEER_FLAGS = [f"--peer-port={PEER_PORT}", f"--peer-secret-file={PEER_SECRET_FILE}"]
"""Every sidecar's; no --peers list: on LWS the group comes from LWS's env."""
SIDECAR_ARGS = {"leader": ["watch", *PEER_FLAGS], "worker": ["peer", "--engine=vllm", *PEER_FLAGS]}
# What LWS puts on the pods it makes (api/leaderworkerset/v1/leaderworkerset_types.go).
SET_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"


# ---- the CRD ----------------------------------------------------------------------------
@cache
def crd_schema() -> Obj:
    """The LeaderWorkerSet CRD's openAPIV3Schema (its storage version), made strict."""
    crd = yaml.load(
        CRD.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    )  # 18k lines
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    schema: Obj = strict(version["schema"]["openAPIV3Schema"])
    return schema


def strict(schema: Any) -> Any:
    """The schema with unknown fields refused wherever it lists the known ones, as
    `kubectl apply` (field validation Strict, its default since 1.27) refuses them; the API
    server would otherwise drop a misspelt field without a word."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def validate_lws(obj: Obj) -> list[str]:
    """Where ``obj`` breaks the CRD's schema (empty: it validates). CEL rules would not be
    checked; this CRD has none (no x-kubernetes-validations)."""
    import jsonschema

    validator = jsonschema.Draft7Validator(crd_schema())
    return [
        f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
        for e in validator.iter_errors(obj)
    ]


# ---- the LeaderWorkerSet's pods as the shared checks read them ---------------------------
def lws_objects(objs: list[Obj]) -> list[Obj]:
    return [o for o in objs if o["kind"] == KIND]


def as_deployment(lws: Obj, role: str) -> Obj:
    """One template of ``lws`` as a Deployment of its pods, with the labels LWS adds."""
    template = lws["spec"]["leaderWorkerTemplate"][f"{role}Template"]
    labels = {
        **template["metadata"].get("labels", {}),
        SET_NAME_LABEL: lws["metadata"]["name"],
        **({WORKER_INDEX_LABEL: "0"} if role == "leader" else {}),
    }
    pod = {**template, "metadata": {**template["metadata"], "labels": labels}}
    name = f"{lws['metadata']['name']}-{role}"
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": lws["metadata"].get("labels", {})},
        "spec": {"selector": {"matchLabels": labels}, "template": pod},
    }


def split(
    name: str, source: str, objs: list[Obj], leader: Expect, worker: Expect
) -> list[Rendering]:
    """The leader's rendering (every object but the LWS, and the leader as a Deployment) and
    the worker's (the Secrets, and the worker as a Deployment)."""
    (lws,) = lws_objects(objs)
    rest = [o for o in objs if o["kind"] != KIND]
    shared = [o for o in rest if o["kind"] == "Secret"]
    return [
        Rendering(f"{name}-leader", source, [*rest, as_deployment(lws, "leader")], leader),
        Rendering(f"{name}-worker", source, [*shared, as_deployment(lws, "worker")], worker),
    ]


@dataclass(frozen=True)
class LwsCase:
    source: str  # helm | kustomize
    values: Obj  # Helm values; unused for kustomize
    leader: Expect
    worker: Expect


LEADER = Expect(peer_port=PEER_PORT)
WORKER = Expect(readiness=False, peer_port=PEER_PORT, metrics=False, engine_probe=False)
LWS_CASES: dict[str, LwsCase] = {
    "helm-lws": LwsCase("helm", {"lws": {"enabled": True}}, LEADER, WORKER),
    "helm-lws-guard-events-key": LwsCase(
        "helm",
        {
            "lws": {"enabled": True, "peer": {"existingSecret": "my-peer", "key": "token"}},
            "guard": {"enabled": True},
            "events": {"enabled": True},
            "apiKey": {"existingSecret": "vllm-api-key"},
        },
        replace(LEADER, guard=True, events=True, api_key=True),
        WORKER,
    ),
    "helm-lws-baseline-liveness": LwsCase(
        "helm",
        {"lws": {"enabled": True}, "podSecurity": "baseline", "liveness": {"enabled": True}},
        replace(LEADER, ptrace=False, liveness=True),
        replace(WORKER, ptrace=False),
    ),
    "kustomize-lws": LwsCase("kustomize", {}, replace(LEADER, api_key=True), WORKER),
}


@cache
def rendered(case: str) -> tuple[Obj, ...]:
    c = LWS_CASES[case]
    if c.source == "helm":
        return tuple(render_chart(CHART, c.values))
    return tuple(render_kustomize(KUBERNETES_DIR / "overlays" / "lws"))


def renderings(case: str) -> list[Rendering]:
    c = LWS_CASES[case]
    return split(case, c.source, list(rendered(case)), c.leader, c.worker)


_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(arg: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion of a container's args (an unknown one stays as it is)."""
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), arg)


def lws_env(lws: Obj, worker_index: int) -> dict[str, str]:
    """What LWS sets in every container of group 0's pod ``worker_index``."""
    name = lws["metadata"]["name"]
    return {
        "LWS_LEADER_ADDRESS": f"{name}-0.{name}.default",
        "LWS_GROUP_SIZE": str(lws["spec"]["leaderWorkerTemplate"]["size"]),
        "LWS_WORKER_INDEX": str(worker_index),
    }
