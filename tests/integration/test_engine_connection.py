"""One engine connection: the URL's ``user:password@`` and an API key
together made every canary fail (aiohttp refuses Basic credentials in the URL plus an
Authorization header), so a healthy idle engine was ``wedged-idle`` at +5 s.

One value (net/connection.py) decides which credential goes where: the key as Bearer on the
routes vLLM guards, else the URL's Basic, else none; never both. Every combination (none, key,
URL credentials, both) x (http, https with a private CA made here by openssl) runs ``watch``
past several canary rounds and ``check``, through the console script, against a loopback engine
that checks the credentials; the engine saw the right header on every route, and no secret
appears in anything the watchdog wrote."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import StubFactory
from tests.tools.cli import run_cli
from tests.tools.stub_engine import StubEngine, server_tls
from tests.tools.watch import WatchProcess, get, start_watch, stop_watch
from tests.waiting import eventually

KEY = "sk-conn-5e1d7b3a-never-written"
USER, PASSWORD = "probe", "pw-9c2f41d0-never-written"
BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
COMBOS = ("none", "key", "url", "both")
QUICK = ("--no-gpu", "--action", "none", "--canary-after", "1", "--idle-canary-interval", "1")
CANARY_ROUNDS = 3


def private_ca(workdir: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key): a CA of the test's own, made by
    openssl, that signs a certificate for 127.0.0.1 (bounded in time)."""
    ca_key, ca = workdir / "ca-key.pem", workdir / "ca.pem"
    key, csr, cert = workdir / "srv-key.pem", workdir / "srv.csr", workdir / "srv.pem"
    ext = workdir / "srv.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    steps = [
        ["openssl", "req", "-x509", *ec, "-days", "2", "-subj", "/CN=engine-watchdog test CA",
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign",
         "-keyout", str(ca_key), "-out", str(ca)],
        ["openssl", "req", *ec, "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(csr)],
        ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
         "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(cert)],
    ]  # fmt: skip
    for step in steps:
        subprocess.run(step, check=True, capture_output=True, timeout=60)
    return ca, cert, key


def expected(combo: str, path: str) -> str:
    """The one Authorization header the engine must see on ``path``."""
    keyed = combo in ("key", "both") and path.startswith("/v1")
    if keyed:
        return f"Bearer {KEY}"
    return BASIC if combo in ("url", "both") else ""


def _records(trace: Path, kind: str) -> list[dict[str, Any]]:
    if not trace.exists():
        return []
    lines = trace.read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def _url(engine: StubEngine, combo: str) -> str:
    if combo in ("url", "both"):
        return engine.url.replace("://", f"://{USER}:{PASSWORD}@")
    return engine.url


@pytest.fixture
async def engines(stub_engine: StubFactory, tmp_path: Path) -> dict[str, tuple[StubEngine, Path]]:
    ca, cert, key = private_ca(tmp_path)
    tls = server_tls(cert, key)
    made: dict[str, tuple[StubEngine, Path]] = {}
    for scheme in ("http", "https"):
        for combo in COMBOS:
            engine = await stub_engine(
                api_key=KEY if combo in ("key", "both") else None,
                basic=BASIC if combo in ("url", "both") else None,
                tls=tls if scheme == "https" else None,
            )
            made[f"{scheme}-{combo}"] = (engine, ca)
    return made


def _args(name: str, ca: Path, key_file: Path) -> list[str]:
    args = ["--ca-file", str(ca)] if name.startswith("https") else []
    if name.endswith(("-key", "-both")):
        args += ["--api-key-file", str(key_file)]
    return args


def _env() -> dict[str, str]:
    """No key from this machine's environment: each combination says its own."""
    return {
        k: v for k, v in os.environ.items() if k not in ("VLLM_API_KEY", "ENGINE_WATCHDOG_API_KEY")
    }


async def test_every_credential_combination_watches_and_checks_healthy(
    engines: dict[str, tuple[StubEngine, Path]], tmp_path: Path
) -> None:
    key_file = tmp_path / "api-key"
    key_file.write_text(KEY + "\n")
    watches: dict[str, WatchProcess] = {}
    try:
        for name, (engine, ca) in engines.items():
            url = _url(engine, name.split("-")[1])
            watches[name] = await start_watch(
                url,
                *QUICK,
                *_args(name, ca, key_file),
                "--record",
                str(tmp_path / f"{name}.jsonl"),
                stderr=tmp_path / f"{name}.log",
                env=_env(),
            )

        def counts() -> dict[str, int]:
            return {n: len(_records(tmp_path / f"{n}.jsonl", "canary")) for n in engines}

        try:
            await eventually(
                lambda: all(n >= CANARY_ROUNDS for n in counts().values()),
                timeout=60,
                interval=0.5,
                what=f"{CANARY_ROUNDS} canaries for every combination",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {counts()}") from None
        served = {n: await _served(w) for n, w in watches.items()}
    finally:
        await asyncio.gather(*(stop_watch(w) for w in watches.values()))
    checks = await asyncio.gather(
        *(
            run_cli(
                "check",
                _url(engine, name.split("-")[1]),
                "--no-gpu",
                "--timeout",
                "20",
                *_args(name, ca, key_file),
                env=_env(),
            )
            for name, (engine, ca) in engines.items()
        )
    )
    for (name, (engine, _)), ran in zip(engines.items(), checks, strict=True):
        combo = name.split("-")[1]
        canaries = _records(tmp_path / f"{name}.jsonl", "canary")
        assert all(c["ok"] for c in canaries), (name, [c.get("error") for c in canaries])
        out = await _stdout(watches[name])
        assert '"stalled"' not in out, (name, out)
        wrong = {(p, a) for _, p, a in engine.seen if a != expected(combo, p)}
        assert not wrong, (name, wrong)
        routes = {p for _, p, _ in engine.seen}
        assert {"/metrics", "/v1/models", "/v1/completions"} <= routes, (name, routes)
        assert ran.code == 0, (name, ran.out, ran.err)
        written = "\n".join(
            [out, served[name], ran.out, ran.err, (tmp_path / f"{name}.log").read_text(),
             (tmp_path / f"{name}.jsonl").read_text()]
        )  # fmt: skip
        for secret in (KEY, PASSWORD, BASIC.split()[1]):
            assert secret not in written, (name, "a secret was written")


async def _served(watch: WatchProcess) -> str:
    """What the watchdog serves (/status, /metrics) while it runs."""
    texts = [(await get(f"{watch.base}/{path}"))[1] for path in ("status", "metrics")]
    return "\n".join(texts)


async def _stdout(watch: WatchProcess) -> str:
    """The transition lines it printed (the process has ended)."""
    assert watch.proc.stdout is not None
    rest = await asyncio.wait_for(watch.proc.stdout.read(), 10)
    return "\n".join(json.dumps(line) for line in watch.lines) + rest.decode()
