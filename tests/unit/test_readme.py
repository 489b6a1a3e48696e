"""What the README promises a newcomer stays what the code does: which rungs act by default
(its opening said the tool restarts the engine; neither `watch` nor the Kubernetes default
does), and its "try it on your own vLLM" recipe starts vLLM as the suite does."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click

from engine_watchdog.cli.main import guard, run, watch
from tests.tools.vllm_env import VllmEnv
from tests.tools.vllm_server import server_argv

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _default_actions(command: click.Command) -> str:
    (opt,) = [p for p in command.params if p.name == "action"]
    return ",".join(opt.default)  # type: ignore[arg-type]


def test_the_opening_says_which_rungs_act_by_default() -> None:
    said = " ".join(README.split("## Quick start")[0].split())
    assert "`watch`, `guard` and the Kubernetes default act with `--action answer,capture`" in said
    assert "`run`, which starts the engine itself, adds `abort,restart`" in said
    assert _default_actions(watch) == _default_actions(guard) == "answer,capture"
    assert _default_actions(run) == "answer,capture,abort,restart"
    sidecar = ROOT / "deploy/kubernetes/components/watchdog-sidecar/kustomization.yaml"
    assert "ENGINE_WATCHDOG_ACTION=answer,capture " in sidecar.read_text()
    values = (ROOT / "deploy/helm/engine-watchdog/values.yaml").read_text()
    assert re.search(r"^  action: answer,capture\b", values, re.M)


def test_the_recipe_starts_vllm_as_the_suite_does() -> None:
    recipe = README.split("### Try it on your own vLLM")[1].split("```")[1]
    command = recipe.split("&")[0].replace("\\\n", " ")
    words = shlex.split(command)
    start = words.index("-m")
    env = VllmEnv(
        Path(".cache/vllm-venv"), Path(".cache/vllm-venv/bin/python"), Path(".cache/tiny-llama")
    )
    suite = server_argv(env, 8000)
    assert words[start - 1 :] == [*suite[:-4], "--port", "8000"], (words, suite)
