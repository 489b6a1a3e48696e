"""In CI a skip fails the run unless its reason names a missing GPU (tests/tools/ci_skips.py):
the rule, and a real inner pytest run with the suite's conftest hook, in CI and outside it."""

from __future__ import annotations

import pytest

from tests.tools.ci_skips import allowed_in_ci, in_ci, reason_of

pytest_plugins = ["pytester"]

INNER = """
import pytest

def test_runs():
    pass

def test_needs_a_gpu():
    pytest.skip("needs a GPU: NVML and CUDA")

@pytest.mark.skipif(True, reason="needs two GPUs (NCCL between them)")
def test_needs_two_gpus():
    pass

def test_no_tool():
    pytest.skip("py-spy not installed")

@pytest.mark.skipif(True, reason="needs root to drop privileges")
def test_not_root():
    pass
"""
CONFTEST = "from tests.conftest import pytest_configure  # noqa: F401\n"


@pytest.mark.parametrize(
    ("reason", "allowed"),
    [
        ("needs a GPU: NVML and CUDA", True),
        ("needs two GPUs (NCCL between them)", True),
        ("needs 8 GPUs", True),
        ("Needs an NVIDIA GPU", True),
        ("py-spy not installed", False),
        ("no production-stack git directory at /somewhere", False),
        ("podman cannot run here: debootstrap and rootful podman need root", False),
        ("the GPU probe is off", False),  # names a GPU, not the lack of one
        ("", False),
    ],
)
def test_only_a_missing_gpu_may_skip_in_ci(reason: str, allowed: bool) -> None:
    assert allowed_in_ci(reason) is allowed


def test_ci_is_any_value_but_empty_0_or_false() -> None:
    assert in_ci({"CI": "true"}) and in_ci({"CI": "1"}) and in_ci({"CI": "yes"})
    assert not in_ci({}) and not in_ci({"CI": ""}) and not in_ci({"CI": "false"})
    assert not in_ci({"CI": "0"})


def test_the_reason_comes_out_of_a_skip_report() -> None:
    assert reason_of(("x.py", 3, "Skipped: py-spy not installed")) == "py-spy not installed"
    assert reason_of("Skipped: whole module") == "whole module"


def test_in_ci_a_run_with_other_skips_fails_naming_each(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_inner=INNER,
        test_whole_module='import pytest\n\npytest.importorskip("no_such_module_here")\n',
    )
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # the inner run needs none
    monkeypatch.setenv("CI", "true")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, skipped=5)
    lines = sorted(line for line in result.outlines if line.startswith("CI: "))
    assert len(lines) == 3, result.outlines
    assert "test_no_tool skipped (py-spy not installed)" in lines[0]
    assert "test_not_root skipped (needs root to drop privileges)" in lines[1]
    assert "test_whole_module.py skipped (could not import 'no_such_module_here'" in lines[2]


def test_outside_ci_skips_pass_and_in_ci_gpu_skips_pass(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_inner=INNER)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("CI", raising=False)
    assert pytester.runpytest("-p", "no:cacheprovider").ret == pytest.ExitCode.OK
    monkeypatch.setenv("CI", "true")
    gpu_only = pytester.runpytest("-p", "no:cacheprovider", "-k", "gpu or runs")
    assert gpu_only.ret == pytest.ExitCode.OK, gpu_only.outlines
    gpu_only.assert_outcomes(passed=1, skipped=2, deselected=2)
