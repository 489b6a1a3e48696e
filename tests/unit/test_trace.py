"""The trace format (docs/traces.md): every kind survives encode -> JSON line -> decode, and a
reader ignores what it does not know (kinds, fields) instead of failing."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from engine_watchdog.core.model import (
    CanaryObs,
    Cause,
    GpuInfo,
    GpuObs,
    GuardObs,
    HealthObs,
    Observation,
    ProcInfo,
    ProcsObs,
    QuietStream,
    RestartObs,
)
from engine_watchdog.engines import VLLM
from engine_watchdog.probes.scrape import RawScrape, parse_scrape
from engine_watchdog.runtime.trace.format import decode, encode, encode_scrape, read_trace
from engine_watchdog.runtime.trace.recording import TraceWriter, portable_title

T = 1_796_016_666.25
BODY = (
    'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
    'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0\n'
    'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
    'vllm:generation_tokens_total{engine="0",model_name="m"} 1234.0\n'
    'vllm:iteration_tokens_total_count{engine="0",model_name="m"} 99.0\n'
    'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 1.0\n'
)
OBSERVATIONS: dict[str, HealthObs | CanaryObs | GpuObs | ProcsObs | RestartObs | GuardObs] = {
    "health-200": HealthObs(T, 200),
    "health-timeout": HealthObs(T, None, error=Cause.TIMEOUT),
    "canary-ok": CanaryObs(T, ok=True, latency_s=0.25, sent_t=T - 0.25),
    "canary-timeout": CanaryObs(T, ok=False, error=Cause.TIMEOUT, sent_t=T - 8.0),
    "canary-500": CanaryObs(T, ok=False, error="http-500", sent_t=T - 0.1),
    "canary-unusable": CanaryObs(T, ok=False, error="unusable: http-404", sent_t=T - 0.1),
    "gpu": GpuObs(
        T,
        (
            GpuInfo(0, 100.0, 136.7, sm_pct=100.0, tensor_pct=0.0, dram_pct=0.0, pids=(441,)),
            GpuInfo(1, 0.0, 80.0),
        ),
    ),
    "procs": ProcsObs(
        T,
        (
            ProcInfo(13725, 13700, "engine-core", "VLLM::EngineCore", "stopped", 12.3),
            ProcInfo(13790, 13725, "worker", "VLLM::Worker", "sleeping", 1.5, ns_pid=41),
        ),
    ),
    "restart": RestartObs(T, "SIGKILL sent to engine core [13725]"),
    "restart-replaced": RestartObs(T, "engine restarted (pid 13801)", replaced=True),
    "guard": GuardObs(
        T,
        3,
        1,
        4,
        1,
        T - 0.5,
        (0, 2, 2) + (0,) * 12,
        (QuietStream("g1", T - 9, T - 8, T - 3, 40, T - 3, "client-7"),),
        awaiting=2,
        awaiting_since=T - 2.5,
    ),
}
SCRAPES = {
    "ok": RawScrape(T, status=200, body=BODY, elapsed_s=0.004),
    "timeout": RawScrape(
        T, error=Cause.TIMEOUT, detail="http://x/metrics: timeout", elapsed_s=10.0
    ),
    "refused": RawScrape(T, error=Cause.REFUSED),
    "http-500": RawScrape(T, status=500, body="oops", elapsed_s=0.01),
    "no-series": RawScrape(T, status=200, body="python_info 1.0\n", elapsed_s=0.01),
}


def kinds() -> list[Any]:
    return [name for name in sorted(OBSERVATIONS)]


def through_json(rec: dict[str, Any]) -> dict[str, Any]:
    """What a reader gets back: the record as TraceWriter serialises it."""
    loaded: dict[str, Any] = json.loads(json.dumps(rec, separators=(",", ":")))
    return loaded


@pytest.mark.parametrize("name", kinds())
def test_every_kind_round_trips(name: str) -> None:
    obs = OBSERVATIONS[name]
    assert decode(through_json(encode(obs)), VLLM) == obs


@pytest.mark.parametrize("name", sorted(SCRAPES))
def test_scrapes_round_trip_to_the_same_parse(name: str) -> None:
    raw = SCRAPES[name]
    assert decode(through_json(encode_scrape(raw)), VLLM) == parse_scrape(raw, VLLM)


def test_a_failed_canary_keeps_when_it_was_sent() -> None:
    """The detector reads ``sent`` (canary_failed_since, the wedged-idle check, canary_due).

    A failed canary has no latency, so without ``sent_t`` a reader can only assume it was sent
    when it ended: a timeout canary then looks 8 s younger in replay than it was live.
    """
    obs = OBSERVATIONS["canary-timeout"]
    assert isinstance(obs, CanaryObs)
    rec = through_json(encode(obs))
    assert rec["sent_t"] == T - 8.0  # the writer has it
    back = decode(rec, VLLM)
    assert isinstance(back, CanaryObs)
    assert back.sent == obs.sent


@pytest.mark.parametrize("name", sorted(OBSERVATIONS))
def test_unknown_fields_are_ignored(name: str) -> None:
    obs = OBSERVATIONS[name]
    rec = through_json(encode(obs))
    rec["future_field"] = {"nested": [1, 2]}
    for key in ("gpus", "procs"):
        for item in rec.get(key, []):
            item["future_field"] = "x"
    assert decode(rec, VLLM) == decode(through_json(encode(obs)), VLLM)


def test_unknown_fields_in_a_scrape_are_ignored() -> None:
    rec = through_json(encode_scrape(SCRAPES["ok"]))
    rec["encoding"] = "identity"
    assert decode(rec, VLLM) == parse_scrape(SCRAPES["ok"], VLLM)


def test_unknown_kinds_are_ignored_without_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    lines = [
        json.dumps({"v": 1, "t": T, "kind": "mark", "label": "fault injected"}),
        json.dumps({"v": 2, "t": T + 1, "kind": "nvlink", "links": [1, 2]}),
        json.dumps(encode(OBSERVATIONS["health-200"])),
    ]
    with caplog.at_level(logging.WARNING, logger="engine_watchdog.runtime.trace.format"):
        got = list(read_trace(lines, VLLM))
    assert got == [OBSERVATIONS["health-200"]]
    assert not caplog.records


def test_any_kind_may_be_absent_and_t_may_use_any_epoch() -> None:
    lines = [json.dumps({"t": 0.5, "kind": "health", "status": 200})]
    assert list(read_trace(lines, VLLM)) == [HealthObs(0.5, 200)]


def test_writer_and_reader_agree_on_a_file(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    writer = TraceWriter(path)
    expected: list[Observation] = []
    for i, raw in enumerate(SCRAPES.values()):
        writer.write(encode_scrape(RawScrape(**{**raw.__dict__, "t": T + i})))
        expected.append(parse_scrape(RawScrape(**{**raw.__dict__, "t": T + i}), VLLM))
    for name, obs in OBSERVATIONS.items():
        if not name.startswith("canary"):  # canaries: see the round-trip tests above
            writer.write(encode(obs))
            expected.append(obs)
    writer.close()
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(expected)  # one observation per line
    assert all(json.loads(line)["v"] == 1 for line in lines)
    # Read back in time order, as the format promises (equal times keep their line order).
    assert list(read_trace(lines, VLLM)) == sorted(expected, key=lambda o: o.t)


@pytest.mark.parametrize(
    ("title", "written"),
    [
        (
            "/srv/app/.venv/bin/python -m vllm.entrypoints.openai.api_server "
            "--model /data/models/Llama-3.1-8B --port 8000",
            "<dir>/python -m vllm.entrypoints.openai.api_server --model <dir>/Llama-3.1-8B "
            "--port 8000",
        ),
        ("python x --model=/d/m PATH=/a/b:/c/d", "python x --model=<dir>/m PATH=<dir>/b:<dir>/d"),
        ('sh -c "/usr/bin/env vllm serve"', 'sh -c "<dir>/env vllm serve"'),
        (
            "vllm serve m --url http://127.0.0.1:8000/v1",
            "vllm serve m --url http://127.0.0.1:8000/v1",
        ),
        ("VLLM::EngineCore", "VLLM::EngineCore"),
        ("python rel/dir/x.py /tmp", "python rel/dir/x.py /tmp"),
    ],
)
def test_a_trace_keeps_no_directory_of_a_title_s_absolute_paths(
    title: str, written: str, tmp_path: Path
) -> None:
    """They name a machine and its user, and replay reads roles and states, never paths; what
    the watcher keeps live (the bundles' timeline) is left whole."""
    assert portable_title(title) == written
    live = encode(ProcsObs(T, (ProcInfo(7, 1, "api-server", title, "sleeping", 1.0),)))
    writer = TraceWriter(tmp_path / "trace.jsonl")
    writer.write(live)
    writer.close()
    (line,) = (tmp_path / "trace.jsonl").read_text().splitlines()
    assert json.loads(line)["procs"][0]["title"] == written
    assert live["procs"][0]["title"] == title


def test_writer_appends(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    for status in (200, 503):
        writer = TraceWriter(path)
        writer.write(encode(HealthObs(T, status)))
        writer.close()
    got = list(read_trace(path.read_text().splitlines(), VLLM))
    assert got == [HealthObs(T, 200), HealthObs(T, 503)]


@pytest.mark.parametrize(
    "line",
    [
        "not json",
        "[1, 2]",
        "42",
        "null",
        '"a string"',
        '{"kind": "health", "status": 200}',
        '{"t": "yesterday", "kind": "health", "status": 200}',
        '{"t": 1, "kind": "gpu"}',
        '{"t": 1, "kind": "procs", "procs": [{"state": "running"}]}',
        '{"t": 1, "kind": "canary"}',
        '{"t": 1, "kind": "gpu", "gpus": 5}',
    ],
)
def test_a_broken_line_is_skipped_with_a_warning(
    line: str, caplog: pytest.LogCaptureFixture
) -> None:
    good = json.dumps(encode(OBSERVATIONS["health-200"]))
    with caplog.at_level(logging.WARNING, logger="engine_watchdog.runtime.trace.format"):
        got = list(read_trace([good, line, good], VLLM))
    assert got == [OBSERVATIONS["health-200"]] * 2
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["trace line 2 skipped"]


@pytest.mark.parametrize("t", ["NaN", "Infinity", "-Infinity"])
def test_a_time_that_is_not_a_finite_number_is_skipped(
    t: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Python's json reads NaN and Infinity; an observation at such a time poisons every
    later verdict's arithmetic (and makes ``replay --json`` print invalid JSON)."""
    line = '{"v":1,"t":' + t + ',"kind":"health","status":200}'
    with caplog.at_level(logging.WARNING, logger="engine_watchdog.runtime.trace.format"):
        got = list(read_trace([line], VLLM))
    assert got == []
    assert caplog.records
