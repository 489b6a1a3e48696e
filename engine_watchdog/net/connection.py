"""One engine connection: the real URL, its credentials, the TLS trust and the API key, built
once (:meth:`EngineConnection.of`) and handed to every part that talks to the engine: probes,
canary, abort, capture, and (without any credential) the guard.

Which credential goes where is decided here, once (:meth:`Access.headers`):
- the API key (vLLM ``--api-key``) as ``Bearer`` on the routes vLLM guards;
- the URL's ``user:password@`` as ``Basic`` on every other route (and on the guarded ones when
  there is no key). aiohttp refuses a URL with credentials and an ``Authorization`` header in
  one request, so the URL that requests go to never holds them (``base``).
The guard gets only :meth:`EngineConnection.upstream`: an address and a TLS context. It adds
nothing a client did not send, so a client without credentials meets the engine's own 401.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from engine_watchdog.core.redact import redact_url
from engine_watchdog.core.settings import Secret, WatchSettings
from engine_watchdog.net.access import Access, access_for


@dataclass(frozen=True)
class Upstream:
    """Where the guard connects: the engine's address and TLS, never a credential."""

    scheme: str
    host: str
    port: int
    authority: str
    """The Host header (host, and the port when the URL gives one)."""
    base_path: str
    """The engine URL's path (no trailing slash), put before every request's."""
    tls: ssl.SSLContext | None
    """None for http://; for https:// the verifying context (the --ca-file's, or the system's)."""


@dataclass(frozen=True)
class EngineConnection:
    """How to reach one engine. ``display`` is for logs, metrics and bundles only."""

    base: str
    """scheme://host:port/path with no userinfo and no trailing slash: where requests go."""
    display: str
    """The URL as every report shows it (a ``user:password@`` is ``<redacted>@``)."""
    access: Access
    """TLS trust and the watchdog's own credentials (the API key, the URL's Basic)."""

    @classmethod
    def of(cls, url: str, access: Access | None = None) -> EngineConnection:
        """From the full URL as the user gave it (credentials and all), and the TLS trust and
        API key of ``access``; the URL's ``user:password@`` joins them as Basic credentials."""
        parts = urlsplit(url)
        access = access or Access()
        if parts.username is not None or parts.password is not None:
            basic = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
            access = Access(tls=access.tls, api_key=access.api_key, basic=Secret(basic))
        netloc = parts.netloc.rpartition("@")[2]
        base = parts._replace(netloc=netloc).geturl().rstrip("/")
        return cls(base=base, display=redact_url(url.rstrip("/")), access=access)

    def url(self, path: str) -> str:
        return self.base + path

    def upstream(self) -> Upstream:
        parts = urlsplit(self.base)
        assert parts.hostname is not None
        secure = parts.scheme == "https"
        tls = (self.access.tls or ssl.create_default_context()) if secure else None
        port = parts.port or (443 if secure else 80)
        host = parts.hostname
        authority = parts.netloc
        return Upstream(parts.scheme, host, port, authority, parts.path.rstrip("/"), tls)


def connection_for(settings: WatchSettings) -> EngineConnection:
    """The one connection of a target: built where settings become a target (runtime/assembly.py,
    runtime/check.py) and handed down to the watcher, its probes and recovery."""
    return EngineConnection.of(settings.connect_url or settings.url, access_for(settings.probe))
