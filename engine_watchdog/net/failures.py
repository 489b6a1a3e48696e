"""Short, stable codes for failed requests (verdicts, metrics and traces carry them: each is a
core/model.py ``Cause``), and the one line for humans that says what happened and what to do
about it."""

from __future__ import annotations

import asyncio
import ssl

import aiohttp

from engine_watchdog.core.model import Cause

TIMEOUT = Cause.TIMEOUT
TOO_LARGE = Cause.TOO_LARGE
TLS = Cause.TLS
REFUSED = Cause.REFUSED
DNS = Cause.DNS
"""The URL's host name does not resolve: no connection was even tried."""
DISCONNECTED = Cause.DISCONNECTED
HTTP_ERROR = Cause.HTTP_ERROR

_NAME_MISMATCH = (62, 64)
"""OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and _IP_ADDRESS_MISMATCH: the certificate is for
another host."""


class BodyTooLarge(aiohttp.ClientError):
    """An answer's body passed the cap it was read with; the read stopped there."""


def error_code(exc: BaseException) -> Cause:
    """The code of a request that raised ``exc``."""
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return TIMEOUT
    if isinstance(exc, BodyTooLarge):
        return TOO_LARGE
    # Before ClientConnectorError: aiohttp's TLS errors are connector errors too, and its
    # certificate error is also a ValueError (ssl.CertificateError).
    if isinstance(exc, aiohttp.ClientSSLError | ssl.SSLError | aiohttp.ServerFingerprintMismatch):
        return TLS
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return DNS
    if isinstance(exc, aiohttp.ClientConnectorError):
        return REFUSED
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return DISCONNECTED
    return HTTP_ERROR


def describe(exc: BaseException, timeout_s: float) -> str:
    """One line: what went wrong, and for TLS what to do about it."""
    code = error_code(exc)
    if code == TIMEOUT:
        return f"{TIMEOUT} (no answer within {timeout_s:g} s)"
    if code == TLS:
        return f"{TLS} ({tls_hint(exc)})"
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        why = exc.os_error.strerror or exc.os_error
        return f"{DNS} (cannot resolve the host name {exc.host!r}: {why}; check the URL's host)"
    return f"{code} ({exc or type(exc).__name__})"


def tls_hint(exc: BaseException) -> str:
    """Why the TLS handshake failed, and the one-line fix."""
    cert = getattr(exc, "certificate_error", exc)  # aiohttp wraps ssl's own error
    if isinstance(cert, ssl.SSLCertVerificationError):
        reason = cert.verify_message or cert.reason or "verification failed"
        if cert.verify_code in _NAME_MISMATCH:
            return f"{reason.rstrip('.')}: put the host name the certificate names in the URL"
        return (
            f"certificate not trusted: {reason}; give the CA that signed it with --ca-file PATH "
            "(ENGINE_WATCHDOG_CA_FILE)"
        )
    inner = getattr(exc, "os_error", None) or exc  # aiohttp's connector error wraps ssl's
    code = getattr(inner, "reason", None)  # e.g. WRONG_VERSION_NUMBER
    reason = code.lower().replace("_", " ") if isinstance(code, str) else str(inner)
    return f"TLS handshake failed: {reason}; is the engine serving https? if not, use http://"
