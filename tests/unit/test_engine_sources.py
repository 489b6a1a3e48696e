"""The engine profiles against expositions written from each engine's own source
(tests/data/engines, README there names the files and commits) and, for llama.cpp, recorded from
the real llama-server built here (tests/data/llamacpp).

Each body is parsed with its profile: every series the profile reads for work and progress is
there with the type the profile assumes (gauges for the work, counters for progress but where
the profile says a gauge carries it), and a sample comes out.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine_watchdog.engines import LLAMACPP, SGLANG, TRTLLM
from engine_watchdog.engines.detect import detect_profile
from engine_watchdog.probes.scrape import RawScrape, parse_scrape

DATA = Path(__file__).resolve().parents[1] / "data"
CASES = {
    "sglang": (SGLANG, DATA / "engines" / "sglang-metrics.txt"),
    "trtllm": (TRTLLM, DATA / "engines" / "trtllm-metrics.txt"),
    "llamacpp-idle": (LLAMACPP, DATA / "llamacpp" / "metrics-idle.txt"),
    "llamacpp-load": (LLAMACPP, DATA / "llamacpp" / "metrics-load.txt"),
}


def types_of(body: str) -> dict[str, str]:
    """Sample name -> its family's type, as Prometheus reads the text."""
    return {
        s.name: f.type
        for f in text_string_to_metric_families(body)
        for s in f.samples
        if not s.name.endswith("_created")
    }


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_every_series_the_profile_reads_is_declared_with_its_type(case: str) -> None:
    profile, path = CASES[case]
    body = path.read_text()
    types = types_of(body)
    for name in (*profile.running[:1], *profile.waiting[:1]):
        assert types.get(name) == "gauge", (name, types.get(name))
    for key, series in profile.progress.items():
        present = [s for s in series if s in types]
        if not present:
            continue  # a finish-only or optional series the body does not carry (asserted below)
        want = {"gauge"} if key in profile.gauge_progress else {"counter", "histogram"}
        assert {types[s] for s in present} <= want, (key, {s: types[s] for s in present})
    read = profile.wanted_series() & set(types)
    assert len(read) >= 4, sorted(read)


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_the_body_detects_as_its_engine_and_parses(case: str) -> None:
    profile, path = CASES[case]
    body = path.read_text()
    assert detect_profile(body).engine == profile.name
    obs = parse_scrape(RawScrape(1.0, status=200, body=body), profile)
    assert obs.error is None, obs.detail
    assert obs.engines and all(e.running is not None for e in obs.engines)
    assert all(e.progress for e in obs.engines)


def test_trtllm_progress_is_carried_by_what_its_collector_writes() -> None:
    (engine,) = parse_scrape(
        RawScrape(1.0, status=200, body=CASES["trtllm"][1].read_text()), TRTLLM
    ).engines
    assert engine.progress["finished_requests"] == 7.0
    assert engine.progress["completed_requests"] == 7.0
    assert engine.progress["~iteration_latency"] == 0.021
