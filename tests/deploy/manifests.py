"""Every way the deploy/ tree renders a watched pod, and what each rendering must promise.

Three sources render the same sidecar: the kustomize overlays (``kubectl kustomize``), the Helm
chart in workload mode, and the Helm chart as a post-renderer over vLLM production-stack's own
chart. Helm is the real one: helm-python-sdk binds Helm's Go SDK (v4.2.3), whose
``engine.Render`` and ``action.Lint`` are what ``helm template`` and ``helm lint`` run.
tests/deploy/pod_checks.py holds the one assertion set all of them pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.tools import DEPLOY, KUBERNETES_DIR, OVERLAYS, run, tool

Obj = dict[str, Any]
CHART = DEPLOY / "helm" / "engine-watchdog"
POST_RENDERER = DEPLOY / "helm" / "post-renderer" / "engine-watchdog-post-render"
VENDOR = Path(__file__).resolve().parents[1] / "data" / "vendor"
PRODUCTION_STACK_CHART = VENDOR / "production-stack" / "helm"
"""vLLM production-stack's chart (github.com/vllm-project/production-stack, helm/), vendored at
the commit its SOURCE.md names: what `helm template` reads of it (tests/data/vendor/refresh.sh)."""
_MODEL: Obj = {
    "name": "opt125m", "repository": "vllm/vllm-openai", "tag": "latest",
    "modelURL": "facebook/opt-125m", "replicaCount": 1, "requestCPU": 6,
    "requestMemory": "16Gi", "requestGPU": 1,
}  # fmt: skip
PRODUCTION_STACK_VALUES: dict[str, Obj] = {
    # tests/assets/values-05-secure-vllm.yaml of production-stack, router left out
    "secure": {
        "servingEngineSpec": {
            "runtimeClassName": "",
            "vllmApiKey": "abc123XYZ987",
            "modelSpec": [_MODEL],
        },
        "routerSpec": {"repository": "git-act-router", "tag": "ci", "enableRouter": True},
    },
    # two models, one with its own vLLM flags and a container-level UID
    "two-models": {
        "servingEngineSpec": {
            "runtimeClassName": "",
            "containerSecurityContext": {"runAsUser": 1000, "runAsGroup": 1000},
            "modelSpec": [
                _MODEL,
                {**_MODEL, "name": "llama", "modelURL": "meta-llama/Llama-3.2-1B-Instruct",
                 "vllmConfig": {"maxModelLen": 4096, "dtype": "bfloat16",
                                "gpuMemoryUtilization": 0.8,
                                "extraArgs": ["--max-num-batched-tokens", "8192"]}},
            ],
        },
    },
}  # fmt: skip


@dataclass(frozen=True)
class Expect:
    """What one rendering promises (the assertion set reads it)."""

    ptrace: bool = True
    liveness: bool = False
    events: bool = False
    readiness: bool = True  # the readiness gate (the default): readinessGates, pods/status Role
    guard: bool = False
    api_key: bool = False  # engine and sidecar read the key from one Secret
    alertmanager: str = ""
    workloads: int = 1  # watched workloads in the rendering
    own_liveness_ok: bool = False  # the engine has a liveness probe of its own chart
    peer_port: int = 0  # a LeaderWorkerSet pod's sidecar: its `peer` port (tests/deploy/lws.py)
    metrics: bool = True  # the sidecar's `watchdog` port (not a worker's `peer` command)
    engine_probe: bool = True  # the engine has a startupProbe (not a headless worker's)


@dataclass(frozen=True)
class Rendering:
    name: str
    source: str  # kustomize | helm | post-renderer
    objs: list[Obj] = field(repr=False)
    expect: Expect


# ---- kustomize ---------------------------------------------------------------------------
KUSTOMIZE_EXPECT = {  # the base engine and the sidecar read the optional Secret vllm-api-key
    "default": Expect(api_key=True),
    "baseline": Expect(ptrace=False, api_key=True),
    "liveness": Expect(liveness=True, api_key=True),
    "events": Expect(events=True, api_key=True),
    "guard": Expect(guard=True, api_key=True),
}


def render_kustomize(path: Path) -> list[Obj]:
    out = run([tool("kubectl"), "kustomize", str(path)], timeout=60)
    return [doc for doc in yaml.safe_load_all(out) if doc]


# ---- Helm --------------------------------------------------------------------------------
def _helm() -> Any:
    try:
        import helm_python
    except ImportError:
        pytest.fail("helm-python-sdk is missing: `make install` (it is a dev dependency)")
    return helm_python


def render_chart(chart: Path, values: Obj, release: str = "engine-watchdog") -> list[Obj]:
    """``helm template RELEASE CHART`` with ``values``: Helm's own engine, offline."""
    helm = _helm()
    with helm.Chart.load(str(chart)) as loaded:
        loaded.validate_schema(values)
        manifests: dict[str, str] = loaded.render(values, name=release, namespace="default")
    docs: list[Obj] = []
    for path, text in sorted(manifests.items()):
        if not path.endswith("NOTES.txt"):
            docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def render_chart_text(chart: Path, values: Obj, release: str) -> str:
    return "\n---\n".join(yaml.safe_dump(d) for d in render_chart(chart, values, release))


def lint_chart(chart: Path, values: Obj) -> dict[str, Any]:
    report: dict[str, Any] = _helm().lint(str(chart), values, strict=True)
    return report


HELM_VALUES: dict[str, tuple[Obj, Expect]] = {
    "default": ({}, Expect()),
    "baseline": ({"podSecurity": "baseline"}, Expect(ptrace=False)),
    "liveness": ({"liveness": {"enabled": True}}, Expect(liveness=True)),
    "events": ({"events": {"enabled": True}}, Expect(events=True)),
    "no-readiness": ({"readinessGate": {"enabled": False}}, Expect(readiness=False)),
    "guard-key-alerts": (
        {
            "guard": {"enabled": True},
            "apiKey": {"existingSecret": "vllm-api-key"},
            "alertmanager": {"url": "http://alertmanager.monitoring:9093"},
        },
        Expect(guard=True, api_key=True, alertmanager="http://alertmanager.monitoring:9093"),
    ),
}


# ---- production-stack through the post-renderer ------------------------------------------
EXAMPLE_VALUES = DEPLOY / "helm" / "examples" / "production-stack.yaml"
POST_RENDER_VALUES: dict[str, tuple[str, Obj, Expect]] = {
    # the documented example values file, over production-stack's secure example
    "example-values": (
        "secure",
        yaml.safe_load(EXAMPLE_VALUES.read_text()),
        Expect(
            events=True,
            guard=True,
            api_key=True,
            alertmanager="http://alertmanager-operated.monitoring:9093",
            own_liveness_ok=True,
        ),
    ),
    "two-models-baseline-liveness": (
        "two-models",
        {"podSecurity": "baseline", "liveness": {"enabled": True}},
        Expect(ptrace=False, liveness=True, workloads=2),
    ),
}


def post_render(stack_chart: Path, stack: str, ours: Obj) -> list[Obj]:
    """What ``helm install --post-renderer engine-watchdog-post-render`` installs: the stack's
    manifests through this chart in post-renderer mode (the script's own `helm template`)."""
    manifests = render_chart_text(stack_chart, PRODUCTION_STACK_VALUES[stack], "vllm")
    values = {**ours, "engine": {"enabled": False}, "inject": {"manifests": manifests}}
    return render_chart(CHART, values)


@cache
def kustomize_renderings() -> tuple[Rendering, ...]:
    return tuple(
        Rendering(name, "kustomize", render_kustomize(KUBERNETES_DIR / "overlays" / name), exp)
        for name, exp in KUSTOMIZE_EXPECT.items()
        if name in OVERLAYS
    )


@cache
def helm_renderings() -> tuple[Rendering, ...]:
    return tuple(
        Rendering(name, "helm", render_chart(CHART, values), exp)
        for name, (values, exp) in HELM_VALUES.items()
    )


def post_renderings(stack_chart: Path) -> tuple[Rendering, ...]:
    return tuple(
        Rendering(name, "post-renderer", post_render(stack_chart, stack, ours), exp)
        for name, (stack, ours, exp) in POST_RENDER_VALUES.items()
    )
