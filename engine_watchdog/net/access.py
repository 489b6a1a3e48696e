"""How to reach one engine: the certificates to trust (https) and its API key.

The key is sent only to the engine's own URL, and there only to the routes vLLM guards with
``--api-key`` (``GUARDED_PREFIX`` in vllm/entrypoints/serve/middleware/authenticate.py: /v1,
/v2, /inference, /cohere); /metrics and /health stay open and never see it. It comes from a
file or the environment, never from the command line, where the process table would show it.
"""

from __future__ import annotations

import base64
import functools
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from engine_watchdog.core.settings import ProbeSettings, Secret, SettingsError

GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")
API_KEY_ENV = ("ENGINE_WATCHDOG_API_KEY", "VLLM_API_KEY")
"""Where the key is looked for when no --api-key-file is given, in this order. VLLM_API_KEY is
the variable vLLM itself reads (vllm/envs.py), so one Kubernetes Secret serves both containers."""
MAX_KEY_FILE_BYTES = 64 * 1024


@dataclass(frozen=True)
class Access:
    tls: ssl.SSLContext | None = None
    """None: aiohttp's default verification against the system's CAs."""
    api_key: Secret | None = None
    basic: Secret | None = None
    """``user:password`` from the engine URL (net/connection.py), sent as Basic where the API
    key is not."""

    @property
    def ssl_arg(self) -> ssl.SSLContext | bool:
        """What aiohttp's ``ssl=`` takes: the context, or True (verify with the defaults)."""
        return self.tls if self.tls is not None else True

    def headers(self, path: str) -> dict[str, str]:
        """The watchdog's own Authorization for a request to ``path`` on the engine: the key
        where vLLM guards the route, else the URL's Basic credentials, else none."""
        if self.api_key is not None and path.startswith(GUARDED_PREFIXES):
            return {"Authorization": f"Bearer {self.api_key.reveal()}"}
        if self.basic is not None:
            token = base64.b64encode(self.basic.reveal().encode("utf-8")).decode("ascii")
            return {"Authorization": f"Basic {token}"}
        return {}


OPEN = Access()


def access_for(probe: ProbeSettings) -> Access:
    ctx = tls_context(probe.ca_file) if probe.ca_file is not None else None
    return Access(tls=ctx, api_key=probe.api_key)


@functools.lru_cache(maxsize=16)
def tls_context(ca_file: Path) -> ssl.SSLContext:
    """A verifying client context that trusts ``ca_file`` (one per file: a fleet shares it)."""
    try:
        return ssl.create_default_context(cafile=str(ca_file))
    except FileNotFoundError:
        raise SettingsError(f"--ca-file {ca_file}: no such file") from None
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise SettingsError(
            f"--ca-file {ca_file}: not a PEM file of CA certificates ({exc}); give the CA "
            "certificate that signed the engine's"
        ) from None


def load_api_key(key_file: Path | None, env: Mapping[str, str] | None = None) -> Secret | None:
    """The key from ``key_file``, else from the first of :data:`API_KEY_ENV` that is set."""
    if key_file is not None:
        return Secret(_key_text(_read_key_file(key_file), f"--api-key-file {key_file}"))
    env = os.environ if env is None else env
    for name in API_KEY_ENV:
        if env.get(name, "").strip():
            return Secret(_key_text(env[name], name))
    return None


def _read_key_file(path: Path) -> str:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise SettingsError(
            f"--api-key-file {path}: {reason}; give a readable file holding the key"
        ) from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise SettingsError(f"--api-key-file {path} is over 64 KiB: that is not an API key")
    return data.decode("utf-8", errors="replace")


def _key_text(text: str, where: str) -> str:
    key = text.strip()
    if not key:
        raise SettingsError(f"{where} is empty; it must hold the engine's API key")
    if any(ord(c) < 0x20 or c == "\x7f" for c in key):
        raise SettingsError(f"{where}: the key has control characters (one key on one line)")
    return key
