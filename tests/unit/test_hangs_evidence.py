"""The matcher on the evidence real incidents have: stacks or environment missing,
GPUs without GPM, every multi-node launcher, the culprit kernel's own native frames, negated
rules, and a log line an idle engine writes too. Each bundle here is written by hand with only
the files the case needs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from engine_watchdog.capture.known_hangs import known_hangs
from engine_watchdog.cli.hangscmd import explain_command
from engine_watchdog.hangs import (
    load_signatures,
    match_bundle,
    parse_signatures,
    read_bundle,
    render_report,
    section_markdown,
    top_signature_id,
)

SHIPPED = load_signatures()
SHM = (
    "(EngineCore_DP0 pid=77352) INFO 10-22 09:43:49 [shm_broadcast.py:466] No available shared "
    "memory broadcast block found in 60 seconds. This typically happens when some processes "
    "are hanging or doing some time-consuming work (e.g. compilation)."
)


def sig_doc(*rules: dict[str, Any], engine: str = "vllm") -> dict[str, Any]:
    """A one-signature file (id ``case-sig``) with these rules."""
    return {
        "format": "engine-watchdog/hang-signatures",
        "format_version": 1,
        "revision": "test",
        "signatures": [
            {
                "id": "case-sig",
                "title": "A test hang",
                "engine": engine,
                "summary": "s",
                "seen_in": [],
                "fixed_in": "not fixed",
                "workaround": "none",
                "links": [
                    {"ref": "o/r#1", "url": "https://github.com/o/r/issues/1", "shows": "it"}
                ],
                "rules": [{"why": "the report shows it", **r} for r in rules],
            }
        ],
    }


def sigs(*rules: dict[str, Any]) -> Any:
    return parse_signatures(json.dumps(sig_doc(*rules)), "test.json")


def bundle(
    root: Path,
    *,
    engine: str = "vllm",
    procs: list[dict[str, Any]] | None = None,
    stacks: dict[int, list[dict[str, Any]]] | None = None,
    log: list[str] | None = None,
    gpus: list[dict[str, Any]] | None = None,
    timeline: list[dict[str, Any]] | None = None,
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "manifest.json").write_text(json.dumps({"name": root.name, "engine": engine}))
    if procs is not None:
        (root / "processes.json").write_text(json.dumps(procs))
    for pid, threads in (stacks or {}).items():
        (root / "pyspy").mkdir(exist_ok=True)
        (root / "pyspy" / f"{pid}.json").write_text(json.dumps(threads))
    if log is not None:
        (root / "engine.log").write_text("\n".join(log) + "\n")
    if gpus is not None:
        (root / "gpu.json").write_text(json.dumps({"available": True, "gpus": gpus}))
    if timeline is not None:
        (root / "timeline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in timeline))
    return root


def proc(pid: int, role: str, cmdline: list[str], environ: dict[str, str] | None = None) -> Any:
    return {"pid": pid, "role": role, "cmdline": cmdline, "environ": environ or {}}


def frame(name: str, file: str, line: int = 1, native: bool = False) -> dict[str, Any]:
    return {
        "name": name,
        "filename": file,
        "short_filename": file.rsplit("/", 1)[-1],
        "line": 0 if native else line,
        "module": file if native else None,
    }


def thread(*frames: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"thread_name": "MainThread", "os_thread_id": 7, "frames": list(frames)}]


def only(matches: list[Any]) -> Any:
    return next(m for m in matches if m.signature.id == "case-sig")


# 1. Missing evidence weighs nothing; a contradiction still excludes.

WAIT_SIG = (
    {"kind": "frame", "role": "engine-core", "any_frames": ["acquire_read"], "weight": 3,
     "required": True},
    {"kind": "log", "any_of": ["RPC call to sample_tokens timed out"], "weight": 2},
    {"kind": "flag", "names": ["--tensor-parallel-size"], "min_value": 2, "weight": 1},
)  # fmt: skip
SERVE = ["vllm", "serve", "m", "--tensor-parallel-size", "2"]
TIMEOUT = "TimeoutError: RPC call to sample_tokens timed out."


def test_a_bundle_without_stacks_is_a_possible_match_that_says_the_stacks_decide_it(
    tmp_path: Path,
) -> None:
    """py-spy refused (no SYS_PTRACE): the log line and the flag fit; the stacks decide it."""
    s = sigs(*WAIT_SIG)
    b = bundle(tmp_path / "b", procs=[proc(1, "api-server", SERVE)], log=[TIMEOUT])
    m = only(match_bundle(read_bundle(b), s))
    assert (m.kind, m.confidence, m.seen) == ("possible", 1.0, 0.5)
    assert m.headline() == (
        "possible match: case-sig, 1.00 of what was seen; the stacks were not captured, "
        "and they decide it"
    )
    assert top_signature_id([m]) == "possible:case-sig"


def test_stacks_that_contradict_a_required_rule_still_exclude(tmp_path: Path) -> None:
    s = sigs(*WAIT_SIG)
    stacks = {2: thread(frame("step", "vllm/v1/engine/core.py"))}
    procs = [proc(1, "api-server", SERVE), proc(2, "engine-core", ["VLLM::EngineCore"])]
    b = bundle(tmp_path / "b", procs=procs, stacks=stacks, log=[TIMEOUT])
    m = only(match_bundle(read_bundle(b), s))
    assert (m.kind, m.confidence) == ("none", 0.0) and m.gate.startswith("required: frames")


def test_the_same_bundle_with_the_stacks_is_a_match(tmp_path: Path) -> None:
    s = sigs(*WAIT_SIG)
    stacks = {2: thread(frame("acquire_read", "vllm/distributed/shm_broadcast.py"))}
    procs = [proc(1, "api-server", SERVE), proc(2, "engine-core", ["VLLM::EngineCore"])]
    b = bundle(tmp_path / "b", procs=procs, stacks=stacks, log=[TIMEOUT])
    m = only(match_bundle(read_bundle(b), s))
    assert (m.kind, m.confidence, m.seen) == ("match", 1.0, 1.0)
    assert top_signature_id([m]) == "case-sig"


def test_a_bundle_without_the_environment_is_judged_on_the_rest(tmp_path: Path) -> None:
    """A user's own log and command line, no environment: the env rule weighs nothing."""
    s = sigs(
        {"kind": "env", "name": "NCCL_P2P_LEVEL", "weight": 2},
        {"kind": "log", "any_of": ["RPC call to sample_tokens timed out"], "weight": 3},
    )
    b = bundle(tmp_path / "b", procs=[proc(1, "api-server", SERVE)], log=[TIMEOUT])
    m = only(match_bundle(read_bundle(b), s))
    assert (m.kind, m.confidence) == ("match", 1.0)
    assert [r.status for r in m.results] == ["unknown", "matched"]


def test_a_configuration_alone_is_never_named(tmp_path: Path) -> None:
    """The set-up fits (the command line), nothing of the hang itself was seen."""
    s = sigs(*WAIT_SIG)
    b = bundle(tmp_path / "b", procs=[proc(1, "api-server", SERVE)])
    m = only(match_bundle(read_bundle(b), s))
    assert m.kind == "none" and "nothing of the hang itself" in m.why_not


def test_explain_summary_report_and_label_keep_a_possible_match_apart(tmp_path: Path) -> None:
    s = sigs(*WAIT_SIG)
    file = tmp_path / "sigs.json"
    file.write_text(json.dumps(sig_doc(*WAIT_SIG)))
    b = bundle(tmp_path / "b", procs=[proc(1, "api-server", SERVE)], log=[TIMEOUT])
    section = section_markdown(match_bundle(read_bundle(b), s), s)
    assert "**Possible matches** (not confirmed" in section
    assert (
        "possible match, 1.00 of what was seen (0.50 of its evidence could be checked); "
        "the stacks were not captured, and they decide it"
    ) in section
    assert "not checked: frames in engine-core stacks: acquire_read" in section
    out = CliRunner().invoke(explain_command, [str(b), "--signatures", str(file)])
    assert out.exit_code == 0 and "**Possible matches**" in out.output
    listed = CliRunner().invoke(explain_command, [str(b), "--json", "--signatures", str(file)])
    got = json.loads(listed.output)["known_hangs"][0]
    assert got["match"] == "possible" and got["missing"][0]["rule"].startswith("frames")
    view = read_bundle(b)
    assert "**Possible matches**" in render_report(view, match_bundle(view, s), s)
    hangs = known_hangs(b, {"name": "b", "engine": "vllm"}, file)
    assert hangs.top == "possible:case-sig" and "**Possible matches**" in hangs.section
    assert hangs.listed[0]["match"] == "possible"


# 2. A spinning GPU without GPM.

SPIN_SIG = (
    {"kind": "gpu", "state": "spinning", "scope": "all", "weight": 4, "required": True},
    {"kind": "log", "any_of": ["RPC call to sample_tokens timed out"], "weight": 2},
)


def nvml_only(name: str, util: float, memory: float | None, power: float = 120.0) -> Any:
    """A GPU entry as the capture writes it where GPM is absent: no classification."""
    return {
        "index": 0,
        "name": name,
        "classification": "unknown",
        "utilization_pct": {"gpu": util, "memory": memory},
        "power_w": power,
        "power_limit_w": 300.0,
        "sm_clock_mhz": 1800,
        "gpm_pct": None,
    }


def test_a_spin_on_an_rtx_a6000_is_read_from_nvml_at_half_weight(tmp_path: Path) -> None:
    s = sigs(*SPIN_SIG)
    b = bundle(tmp_path / "b", gpus=[nvml_only("NVIDIA RTX A6000", 100.0, 0.0)], log=[TIMEOUT])
    m = only(match_bundle(read_bundle(b), s))
    gpu = m.results[0]
    assert (gpu.status, gpu.credit) == ("matched", 0.5)
    assert "spinning (NVML only, no GPM, no DRAM traffic: util 100 %, memory 0 %" in (
        gpu.evidence[0].detail
    )
    assert (m.kind, m.confidence) == ("match", round((4 * 0.5 + 2) / 6, 2))


def test_real_work_on_a_gpu_without_gpm_is_not_a_spin(tmp_path: Path) -> None:
    s = sigs(*SPIN_SIG)
    b = bundle(tmp_path / "b", gpus=[nvml_only("NVIDIA RTX 6000 Ada Generation", 100.0, 45.0)])
    m = only(match_bundle(read_bundle(b), s))
    assert m.results[0].status == "not-matched" and m.kind == "none"


# 3. Several nodes, whatever the launcher.


def _nodes(tmp_path: Path, name: str, cmdline: list[str], env: dict[str, str]) -> str:
    s = sigs(
        {"kind": "multi_node", "weight": 3, "required": True},
        {"kind": "log", "any_of": ["RPC call to sample_tokens timed out"], "weight": 2},
    )
    b = bundle(tmp_path / name, procs=[proc(1, "api-server", cmdline, env)], log=[TIMEOUT])
    m = only(match_bundle(read_bundle(b), s))
    return f"{m.kind}: " + "; ".join(e.detail for e in m.results[0].evidence)


def test_every_launchers_multi_node_sign_is_read(tmp_path: Path) -> None:
    serve = ["vllm", "serve", "m"]
    cases = {
        "nnodes": ([*serve, "--nnodes", "2"], {}),
        "dp-address": ([*serve, "--data-parallel-address", "10.0.0.2"], {}),
        "headless": ([*serve, "--headless"], {}),
        "dp-local": ([*serve, "--data-parallel-size", "4", "--data-parallel-size-local", "2"], {}),
        "lws": (serve, {"LWS_GROUP_SIZE": "2", "LWS_LEADER_ADDRESS": "leader.ns"}),
        "torchrun": (serve, {"MASTER_ADDR": "10.1.2.3", "WORLD_SIZE": "16"}),
        "ray": ([*serve, "--distributed-executor-backend", "ray"], {"RAY_ADDRESS": "10.0.0.5"}),
        "sglang": (["python3", "-m", "sglang.launch_server", "--dist-init-addr", "10.0.0.9"], {}),
    }  # fmt: skip
    for name, (cmdline, env) in cases.items():
        got = _nodes(tmp_path, name, cmdline, env)
        assert got.startswith("match: PID 1"), (name, got)
    one = _nodes(tmp_path, "one", [*serve, "--data-parallel-address", "127.0.0.1"], {})
    assert one.startswith("none"), one


def test_the_catalogs_multi_node_signatures_read_more_than_nnodes(tmp_path: Path) -> None:
    """The cross-node NCCL signature on a DP deployment whose address names another host."""
    cmd = ["vllm", "serve", "m", "--data-parallel-address", "10.0.0.1", "--headless"]
    b = bundle(
        tmp_path / "b",
        procs=[proc(1, "api-server", cmd)],
        log=["INFO vLLM is using nccl==2.28.9", TIMEOUT],
    )
    matches = match_bundle(read_bundle(b), SHIPPED)
    assert top_signature_id(matches) == "nccl-2289-cross-node-cudagraph-deadlock"


# 4. The culprit kernel's own native frames.

NATIVE_TOPK = thread(  # vllm#43885: py-spy --native under CUDA_LAUNCH_BLOCKING=1
    frame("cuLaunchKernel", "/usr/lib/x86_64-linux-gnu/libcuda.so.1.1", native=True),
    frame("cudaLaunchKernel", "/site/libcudart.so.13", native=True),
    frame("flashinfer::sampling::RadixTopKMaskLogitsMultiCTA<float, int>", "/fi/sampling.so",
          native=True),
    frame("top_k_mask_logits", "/fi/sampling.so", native=True),
    frame("__tvm_ffi_top_k_mask_logits", "/fi/sampling.so", native=True),
)  # fmt: skip


def test_a_native_frame_is_matched_by_the_kernels_own_name(tmp_path: Path) -> None:
    s = sigs(
        {"kind": "frame", "any_frames": ["RadixTopKMaskLogitsMultiCTA"], "weight": 3,
         "required": True},
    )  # fmt: skip
    b = bundle(
        tmp_path / "b",
        procs=[proc(2, "engine-core", ["VLLM::EngineCore"])],
        stacks={2: NATIVE_TOPK},
    )
    m = only(match_bundle(read_bundle(b), s))
    assert m.kind == "match", m.headline()
    assert "RadixTopKMaskLogitsMultiCTA<float, int>" in m.results[0].evidence[0].detail


def test_the_sampler_kernel_names_the_sm12x_hang_only_on_that_gpu_family(tmp_path: Path) -> None:
    """The same kernel hangs at warm-up on low-SM GPUs for another reason (flashinfer#4544):
    the GPU family stays a rule."""

    def top(gpu: str) -> str:
        b = bundle(
            tmp_path / gpu.replace(" ", "-"),
            procs=[proc(2, "engine-core", ["VLLM::EngineCore"])],
            stacks={2: NATIVE_TOPK},
            gpus=[nvml_only(gpu, 96.0, 0.0, 30.0)],
        )
        return top_signature_id(match_bundle(read_bundle(b), SHIPPED))

    assert top("NVIDIA GeForce RTX 5090") == "vllm-sm12x-flashinfer-topk-sampler-hang"
    assert top("NVIDIA A2") == "none"


# 5. Negated rules add no weight of their own.


def test_a_workaround_that_is_absent_adds_nothing(tmp_path: Path) -> None:
    """ "No --enforce-eager" is true of almost every engine: it must not carry a bundle over the
    threshold. Here the one symptom (2) matches and the one flag (3) does not: 2 of 5."""
    s = sigs(
        {"kind": "log", "any_of": ["RPC call to sample_tokens timed out"], "weight": 2},
        {"kind": "flag", "names": ["--pipeline-parallel-size"], "min_value": 2, "weight": 3},
        {"kind": "flag", "names": ["--enforce-eager"], "negate": True, "weight": 3},
    )
    b = bundle(tmp_path / "b", procs=[proc(1, "api-server", SERVE)], log=[TIMEOUT])
    matches = match_bundle(read_bundle(b), s)
    assert top_signature_id(matches) == "none"
    assert only(matches).confidence == 0.4
    present = bundle(
        tmp_path / "c", procs=[proc(1, "api-server", [*SERVE, "--enforce-eager"])], log=[TIMEOUT]
    )
    assert only(match_bundle(read_bundle(present), s)).confidence == 0.25  # it counts against


# 6. A line an idle engine logs too.

SHM_SIG = (
    {"kind": "log", "any_of": ["No available shared memory broadcast block found"],
     "only_with_requests": True, "weight": 3, "required": True},
    {"kind": "flag", "names": ["--tensor-parallel-size"], "min_value": 2, "weight": 1},
)  # fmt: skip
STATS_IDLE = (
    "(APIServer pid=1) INFO 10-22 09:42:00 [loggers.py:271] Engine 000: Avg prompt throughput: "
    "0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs"
)
STATS_BUSY = STATS_IDLE.replace("Running: 0 reqs", "Running: 3 reqs")


def test_the_shm_broadcast_line_of_an_idle_engine_is_no_evidence(tmp_path: Path) -> None:
    s = sigs(*SHM_SIG)

    def judge(name: str, log: list[str], timeline: list[dict[str, Any]] | None = None) -> Any:
        b = bundle(
            tmp_path / name, procs=[proc(1, "api-server", SERVE)], log=log, timeline=timeline
        )
        return only(match_bundle(read_bundle(b), s))

    idle = judge("idle", [STATS_IDLE, SHM, SHM])
    assert idle.kind == "none" and "required: log line" in idle.gate
    assert judge("busy", [STATS_BUSY, SHM]).kind == "match"
    unknown = judge("silent", [SHM])  # --disable-log-stats: nothing says either way
    assert unknown.kind == "none" and unknown.results[0].status == "unknown"
    guard = [{"t": 5.0, "kind": "guard", "open": 4, "decoding": 0}]
    assert judge("guarded", [STATS_IDLE, SHM], guard).kind == "match"


def test_an_engine_signature_needs_the_bundle_to_name_its_engine(tmp_path: Path) -> None:
    """A spinning GPU in a folder that names no engine is no vLLM hang; the command line names
    the engine when the manifest does not."""
    s = sigs({"kind": "gpu", "state": "busy", "scope": "all", "weight": 3, "required": True})
    b = tmp_path / "b"
    b.mkdir()
    (b / "gpu.json").write_text(json.dumps({"available": True, "gpus": [nvml_only("X", 100, 0)]}))
    m = only(match_bundle(read_bundle(b), s))
    assert m.kind == "none" and "names no engine" in m.gate
    (b / "processes.json").write_text(json.dumps([proc(1, "other", SERVE)]))
    assert only(match_bundle(read_bundle(b), s)).kind == "match"
