"""Parse cost of one scrape: our filtered parse against a full prometheus_client parse.

Run: .venv/bin/python -m benchmarks.parse   (prints a table; ratios are what to compare, since
these machines are noisy and both sides run in the same process, interleaved).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

from prometheus_client.parser import text_string_to_metric_families

from engine_watchdog.engines import VLLM
from engine_watchdog.probes.scrape import RawScrape, parse_scrape


def synthetic_exposition(target_bytes: int, engines: int = 2) -> str:
    """A vLLM-shaped exposition padded with histogram buckets, as busy servers serve them."""
    lines = []
    for e in range(engines):
        lab = f'engine="{e}",model_name="meta-llama/Llama-3.1-70B-Instruct"'
        lines += [
            f"vllm:num_requests_running{{{lab}}} 12.0",
            f"vllm:num_requests_waiting{{{lab}}} 3.0",
            f"vllm:kv_cache_usage_perc{{{lab}}} 0.43",
            f"vllm:generation_tokens_total{{{lab}}} 123456.0",
            f"vllm:prompt_tokens_total{{{lab}}} 654321.0",
            f"vllm:iteration_tokens_total_count{{{lab}}} 9876.0",
            f'vllm:request_success_total{{{lab},finished_reason="stop"}} 321.0',
        ]
    n = 0
    while sum(len(line) + 1 for line in lines) < target_bytes:
        for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds"):
            lines.append(f"# TYPE vllm:{name}_{n} histogram")
            for le in (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, "+Inf"):
                lab = f'engine="0",le="{le}",model_name="meta-llama/Llama-3.1-70B-Instruct"'
                lines.append(f"vllm:{name}_{n}_bucket{{{lab}}} {n * 7}.0")
        n += 1
    return "\n".join(lines) + "\n"


def full_parse(body: str) -> list[object]:
    return [list(f.samples) for f in text_string_to_metric_families(body)]


def best_of(fn: Callable[[], object], repeat: int = 15) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    print(f"{'body':>8} {'ours ms':>9} {'prometheus_client ms':>21} {'ratio':>7}")
    for size in (30_000, 300_000, 1_300_000):
        body = synthetic_exposition(size)
        raw = RawScrape(0.0, status=200, body=body)
        ours = best_of(partial(parse_scrape, raw, VLLM))
        full = best_of(partial(full_parse, body))
        print(
            f"{len(body) // 1000:>6}KB {ours * 1e3:>9.2f} {full * 1e3:>21.2f} {full / ours:>6.1f}x"
        )


if __name__ == "__main__":
    main()
