"""Every rendering of the watched pod keeps the same promises: the kustomize overlays, the Helm
chart (rendered and linted by Helm's own Go SDK), and the Helm post-renderer over vLLM
production-stack's chart. One assertion set (tests/deploy/pod_checks.py) for all of them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.deploy import manifests as m
from tests.deploy.pod_checks import ALL_CHECKS

RENDERINGS = (
    [("kustomize", name) for name in m.KUSTOMIZE_EXPECT]
    + [("helm", name) for name in m.HELM_VALUES]
    + [("post-renderer", name) for name in m.POST_RENDER_VALUES]
)


@pytest.fixture(scope="module")
def stack_chart() -> Path:
    return m.PRODUCTION_STACK_CHART


@pytest.fixture(scope="module")
def renderings(request: pytest.FixtureRequest) -> dict[tuple[str, str], m.Rendering]:
    found = {(r.source, r.name): r for r in (*m.kustomize_renderings(), *m.helm_renderings())}
    return found


@pytest.fixture(scope="module")
def post_renderings(stack_chart: Path) -> dict[tuple[str, str], m.Rendering]:
    return {(r.source, r.name): r for r in m.post_renderings(stack_chart)}


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
@pytest.mark.parametrize(("source", "name"), RENDERINGS, ids=lambda v: str(v))
def test_promise(
    request: pytest.FixtureRequest,
    source: str,
    name: str,
    check: Callable[[m.Rendering], None],
) -> None:
    fixture = "post_renderings" if source == "post-renderer" else "renderings"
    rendering = request.getfixturevalue(fixture)[(source, name)]
    check(rendering)
