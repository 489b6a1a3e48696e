"""One rank of a torch gloo group (tests/tools/gloo_group.py starts it, under the CPU vLLM
venv's Python: the watchdog's own venv has no torch).

It joins the group over TCP (``init_method=tcp://<rank 0's address>``), then loops
``all_reduce`` on a small tensor, writing ``heartbeat.json`` (atomically) after each loop:
``step`` counts the collectives completed, ``beat`` the loops (a rank that stays out of the
collective keeps beating). Before joining it makes the shared-memory segments a real engine
leaves behind when killed (named as NCCL, torch and vLLM name theirs), in ``EW_SHM_ROOT``.

Faults, read from flag files in its own folder at each loop (the test writes them):

- ``skip``: stay out of the collective while the file exists (the others wait in theirs). A
  rank that skips exactly one all_reduce and goes on does not hang anyone: gloo pairs
  collectives by their sequence number, so the next call fills the gap, off by one.
- ``exit``: leave at once with status 3, as a crashed rank does.

SIGSTOP comes from outside. Environment: EW_RANK, EW_WORLD, EW_MASTER (address:port),
EW_DIR (its folder), EW_SHM_ROOT, EW_TIMEOUT_S (the group's collective timeout), and two
optional ones:

- EW_TITLE: the process title (setproctitle, as vLLM titles its ranks ``VLLM::Worker_TP1``),
  so a sidecar finds the rank by title as it finds vLLM's;
- EW_METRICS_PORT (rank 0): serve a vLLM-shaped ``/metrics`` and ``/health`` on
  0.0.0.0:PORT from a thread, as vLLM's API server answers for a group whose ranks hang:
  ``vllm:num_requests_running`` 1 (one request always in flight), ``vllm:num_requests_waiting``
  0 and ``vllm:generation_tokens_total`` one token per completed all_reduce. The thread runs
  while the main thread waits in the collective (gloo releases the GIL), so a hung collective
  is a frozen counter with work present: what the leader's watchdog judges stalled.
"""

from __future__ import annotations

import datetime
import json
import mmap
import os
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch
import torch.distributed as dist

SEGMENT_BYTES = 4096
SKIP_POLL_S = 0.05
LOOP_PAUSE_S = 0.02
"""Between collectives: a heartbeat file per loop, not a busy spin on 2 shared cores."""


def make_segments(root: Path, rank: int) -> list[str]:
    """Files as NCCL (``nccl-XXXXXX``, src/misc/shmutils.cc), torch (``torch_<pid>_...``,
    its shared-memory manager) and vLLM (Python's ``psm_<hex>``, shm_broadcast.py's
    MessageQueue) create in /dev/shm; mapped, as theirs are, and never unlinked."""
    made = []
    for prefix in ("nccl-", f"torch_{os.getpid()}_{rank}_", "psm_"):
        fd, path = tempfile.mkstemp(prefix=prefix, dir=root)
        os.ftruncate(fd, SEGMENT_BYTES)
        MAPS.append(mmap.mmap(fd, SEGMENT_BYTES))
        os.close(fd)
        made.append(path)
    return made


MAPS: list[mmap.mmap] = []


def write_beat(folder: Path, doc: dict[str, object]) -> None:
    part = folder / "heartbeat.json.part"
    part.write_text(json.dumps(doc))
    os.replace(part, folder / "heartbeat.json")


def skipped_collective(folder: Path, beat: dict[str, object]) -> None:
    """The rank stays out of the collective its peers wait in, alive and beating."""
    while (folder / "skip").exists():
        beat["beat"] = int(str(beat["beat"])) + 1
        beat["t"] = time.time()
        write_beat(folder, beat)
        time.sleep(SKIP_POLL_S)


STEPS = [0]
"""Collectives completed, read by the metrics thread (one int: no lock needed)."""


class MetricsHandler(BaseHTTPRequestHandler):
    """vLLM's /metrics series the watchdog judges by, and /health (empty 200, as vLLM's)."""

    def do_GET(self) -> None:  # http.server calls it by this name
        if self.path == "/health":
            self._answer(b"", "text/plain")
        elif self.path == "/metrics":
            body = (
                "# TYPE vllm:num_requests_running gauge\n"
                'vllm:num_requests_running{engine="0",model_name="gloo"} 1.0\n'
                "# TYPE vllm:num_requests_waiting gauge\n"
                'vllm:num_requests_waiting{engine="0",model_name="gloo"} 0.0\n'
                "# TYPE vllm:generation_tokens_total counter\n"
                f'vllm:generation_tokens_total{{engine="0",model_name="gloo"}} {STEPS[0]}.0\n'
            )
            self._answer(body.encode(), "text/plain; version=0.0.4")
        else:
            self.send_error(404)

    def _answer(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # http.server names it so
        """Quiet: a request line per probe round would flood the container's log."""


def serve_metrics(port: int) -> None:
    server = ThreadingHTTPServer(("0.0.0.0", port), MetricsHandler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()


def main() -> int:
    if os.environ.get("EW_TITLE"):
        import setproctitle  # vLLM's venv has it: vLLM titles its processes with it

        setproctitle.setproctitle(os.environ["EW_TITLE"])
    if os.environ.get("EW_METRICS_PORT"):
        serve_metrics(int(os.environ["EW_METRICS_PORT"]))
    rank, world = int(os.environ["EW_RANK"]), int(os.environ["EW_WORLD"])
    folder = Path(os.environ["EW_DIR"])
    segments = make_segments(Path(os.environ["EW_SHM_ROOT"]), rank)
    timeout = datetime.timedelta(seconds=float(os.environ.get("EW_TIMEOUT_S", "300")))
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{os.environ['EW_MASTER']}",
        rank=rank,
        world_size=world,
        timeout=timeout,
    )
    beat: dict[str, object] = {"rank": rank, "pid": os.getpid(), "segments": segments}
    beat.update(step=0, beat=0, t=time.time())
    tensor = torch.ones(4)
    while True:
        if (folder / "exit").exists():
            os._exit(3)
        skipped_collective(folder, beat)
        try:
            dist.all_reduce(tensor)
        except RuntimeError as exc:  # a peer gone: gloo says so, the rank ends as vLLM's do
            beat["error"] = str(exc).splitlines()[0][:300]
            write_beat(folder, beat)
            return 4
        tensor.fill_(1.0)
        STEPS[0] += 1
        beat.update(step=int(str(beat["step"])) + 1, beat=int(str(beat["beat"])) + 1)
        beat["t"] = time.time()
        write_beat(folder, beat)
        time.sleep(LOOP_PAUSE_S)


if __name__ == "__main__":
    sys.exit(main())
