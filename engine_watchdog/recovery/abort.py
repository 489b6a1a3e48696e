"""Abort in-flight requests through the engine's own endpoints, where it offers them.

vLLM (vllm/entrypoints/rl/online/api_router.py and scale_out/...):
- ``VLLM_SERVER_DEV_MODE=1``: ``POST /abort_requests {}`` aborts every in-flight request;
- ``--enable-scale-out``: ``POST /inference/v1/abort_requests {"request_ids": [...]}`` needs the
  ids (we know our own canaries'); without the flag it answers 403.
An abort ends the clients' streams in the API server even when the engine core is blocked, so
clients are answered; it cannot unblock the engine, so a stall that persists escalates.
"""

from __future__ import annotations

import json

import aiohttp

from engine_watchdog.core.model import Outcome, Result
from engine_watchdog.engines.profile import EngineProfile
from engine_watchdog.net.connection import EngineConnection
from engine_watchdog.net.http import post_json


async def abort_requests(
    session: aiohttp.ClientSession,
    connection: EngineConnection,
    profile: EngineProfile,
    known_ids: list[str],
    timeout_s: float = 5.0,
) -> Outcome:
    """Try the profile's abort endpoints, most useful first; say what happened."""
    url, access = connection.url, connection.access
    tried = []
    if profile.abort_all is not None:  # an engine's own "abort everything" (SGLang)
        path, body_text = profile.abort_all
        body_doc = json.loads(body_text)
        status, text = await post_json(session, url(path), body_doc, timeout_s, access)
        if status == 200:
            return Outcome(Result.OK, f"POST {path} {body_text}: aborted all in-flight requests")
        tried.append(f"{path}: {status or text}")
    for path in sorted(profile.abort_paths, key=lambda p: p != "/abort_requests"):
        if profile.abort_all is not None and path == profile.abort_all[0]:
            continue  # tried above with its own body
        all_requests = (
            path == "/abort_requests" and profile.name == "vllm"
        )  # dev mode: an empty body aborts everything
        if not all_requests and not known_ids:
            tried.append(f"{path}: no request ids known")
            continue
        body: dict[str, object] = {} if all_requests else {"request_ids": known_ids}
        status, text = await post_json(session, url(path), body, timeout_s, access)
        if status == 200:
            what = "all in-flight requests" if all_requests else f"{len(known_ids)} request(s)"
            return Outcome(Result.OK, f"POST {path}: aborted {what}")
        tried.append(f"{path}: {status or text}")
    hint = (
        ". vLLM offers one with VLLM_SERVER_DEV_MODE=1 (abort all) or --enable-scale-out (by id)"
        if profile.name == "vllm"
        else ""
    )
    what = "; ".join(tried) or f"{profile.name} has none"
    return Outcome(Result.NOT_AVAILABLE, f"no abort endpoint accepted ({what}){hint}")
