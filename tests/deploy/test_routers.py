"""The guard behind a router: the port each router sends to is the guard's, in rendered objects.

vLLM production-stack's router finds engine pods by label and calls them by pod IP on
``--k8s-port`` (default 8000), past every Service: ``routerSpec.extraArgs`` must name the guard
port. llm-d's endpoint picker sends to the InferencePool's target port; KServe's Service to the
first port kserve-container declares. docs/guard.md#behind-a-router says the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import manifests as m
from tests.deploy import pod_checks as checks
from tests.deploy.tools import DEPLOY

Obj = dict[str, Any]
EXAMPLES = DEPLOY / "helm" / "examples"
GUARD_ARGS = ["--k8s-port", "8001"]  # docs/guard.md#behind-a-router, production-stack values


@pytest.fixture(scope="module")
def stack_chart() -> Path:
    return m.PRODUCTION_STACK_CHART


def stack_with_guard(stack_chart: Path, router_args: list[str]) -> list[Obj]:
    """production-stack (secure example) with ``router_args``, post-rendered with the
    documented example values (guard on)."""
    values = yaml.safe_load(yaml.safe_dump(m.PRODUCTION_STACK_VALUES["secure"]))
    values["routerSpec"]["extraArgs"] = router_args
    stack = m.render_chart_text(stack_chart, values, "vllm")
    ours = yaml.safe_load(m.EXAMPLE_VALUES.read_text())
    return m.render_chart(
        m.CHART, {**ours, "engine": {"enabled": False}, "inject": {"manifests": stack}}
    )


def router_targets(objs: list[Obj]) -> tuple[int, list[Obj]]:
    """The port production-stack's router calls engines on, and the workloads it selects."""
    (router,) = [o for o in objs if o["kind"] == "Deployment" and "router" in o["metadata"]["name"]]
    args: list[str] = router["spec"]["template"]["spec"]["containers"][0]["args"]
    flags = dict(zip(args[::2], args[1::2], strict=False))  # flag value pairs; the last wins
    port = int(flags.get("--k8s-port", "8000"))  # the router's own default (its parser.py)
    selector = dict(kv.split("=", 1) for kv in flags["--k8s-label-selector"].split(","))
    chosen = [
        o
        for o in objs
        if o["kind"] == "Deployment"
        and selector.items() <= o["spec"]["template"]["metadata"].get("labels", {}).items()
    ]
    return port, chosen


def guard_port(workload: Obj) -> int:
    ports = {
        p["name"]: p["containerPort"] for p in checks.container(workload, checks.SIDECAR)["ports"]
    }
    return int(ports["guard"])


def test_production_stack_router_calls_the_guard_port(stack_chart: Path) -> None:
    objs = stack_with_guard(stack_chart, GUARD_ARGS)
    port, chosen = router_targets(objs)
    assert chosen and chosen == checks.workloads(objs)  # every engine it routes to is guarded
    for w in chosen:
        assert port == guard_port(w) == 8001
        assert checks.configmap(objs, w)["ENGINE_WATCHDOG_GUARD_LISTEN"] == f"0.0.0.0:{port}"


def test_production_stack_router_bypasses_the_guard_without_k8s_port(stack_chart: Path) -> None:
    """Why the value is needed: the router's default port is vLLM's, not the guard's."""
    port, chosen = router_targets(stack_with_guard(stack_chart, []))
    engine_ports = {
        p["containerPort"] for w in chosen for p in checks.container(w, "vllm")["ports"]
    }
    assert port == 8000 and port in engine_ports and port != guard_port(chosen[0])


def test_llm_d_inference_pool_targets_the_guard_port() -> None:
    (pool,) = yaml.safe_load_all(EXAMPLES.joinpath("llm-d-inferencepool.yaml").read_text())
    objs = m.render_chart(m.CHART, {"guard": {"enabled": True}})
    (w,) = checks.workloads(objs)
    labels = w["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert [t["number"] for t in pool["spec"]["targetPorts"]] == [guard_port(w)]


def test_kserve_container_declares_the_guard_port_and_vllm_listens_behind_it() -> None:
    (isvc,) = yaml.safe_load_all(EXAMPLES.joinpath("kserve-inferenceservice.yaml").read_text())
    (engine,) = isvc["spec"]["predictor"]["containers"]
    assert engine["name"] == "kserve-container"
    chart = yaml.safe_load(m.CHART.joinpath("values.yaml").read_text())
    assert engine["ports"][0]["containerPort"] == chart["guard"]["port"]  # KServe's targetPort
    vllm_port = next(a.split("=", 1)[1] for a in engine["args"] if a.startswith("--port="))
    assert chart["config"]["url"] == f"http://127.0.0.1:{vllm_port}"  # where the guard sends
