"""The group's shared secret: read once where it enters, compared in constant time.

The secret comes from a file (``--peer-secret-file``: a Kubernetes Secret mounted as a volume,
so it never sits in the pod spec) or from ``ENGINE_WATCHDOG_PEER_SECRET``. It is held as a
:class:`Secret` (never printed, not JSON-able) and only revealed to build or check an
``Authorization: Bearer`` header.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from pathlib import Path

from engine_watchdog.core.settings import Secret, SettingsError

SECRET_VAR = "ENGINE_WATCHDOG_PEER_SECRET"
MIN_SECRET_CHARS = 16
"""Shorter is guessable; ``openssl rand -hex 32`` gives 64."""
MAX_SECRET_BYTES = 4096


def load_secret(path: Path | None, env: Mapping[str, str]) -> Secret:
    """The secret from ``path`` (surrounding whitespace dropped: a Secret's file often ends in
    a newline), else from the environment. SettingsError names the flag or variable, never the
    value."""
    if path is not None:
        try:
            with path.open("rb") as f:
                data = f.read(MAX_SECRET_BYTES + 1)
        except OSError as e:
            why = f"--peer-secret-file {path}: cannot read it ({e.strerror})"
            raise SettingsError(why) from None
        if len(data) > MAX_SECRET_BYTES:
            raise SettingsError(f"--peer-secret-file {path}: over {MAX_SECRET_BYTES} bytes")
        value, where = data.decode(errors="replace").strip(), f"--peer-secret-file {path}"
    else:
        value, where = env.get(SECRET_VAR, "").strip(), SECRET_VAR
    if not value:
        raise SettingsError(
            f"{where}: no peer secret; mount one (kubectl create secret generic "
            "engine-watchdog-peers --from-literal=secret=$(openssl rand -hex 32)) and pass "
            f"--peer-secret-file, or set {SECRET_VAR}"
        )
    if len(value) < MIN_SECRET_CHARS:
        raise SettingsError(f"{where}: the peer secret is under {MIN_SECRET_CHARS} characters")
    return Secret(value)


def bearer(secret: Secret) -> dict[str, str]:
    """The header a peer request carries."""
    return {"Authorization": f"Bearer {secret.reveal()}"}


def authorised(header: str | None, secret: Secret) -> bool:
    """``header`` is ``Bearer <the secret>`` (constant time, whatever it holds)."""
    scheme, _, given = (header or "").partition(" ")
    expected = secret.reveal().encode()
    ok = hmac.compare_digest(given.strip().encode(errors="replace"), expected)
    return ok and scheme.lower() == "bearer"
