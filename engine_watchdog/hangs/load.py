"""Read and check a signature file. A bad file is refused with one line naming the signature and
the field (``signatures.json: signature 'x', rules[2].weight: must be an integer from 1 to 10``).

Adding a signature is an edit of the JSON file only: nothing here knows any signature.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

from engine_watchdog.hangs.schema import (
    ENGINES,
    FORMAT,
    FORMAT_VERSION,
    GPU_SCOPES,
    GPU_STATES,
    ROLES,
    RULE_TYPES,
    VERSION_COMPONENTS,
    Link,
    Rule,
    Signature,
    SignatureSet,
)

BUILTIN = "signatures.json"
MAX_FILE_BYTES = 4 << 20
_ID = re.compile(r"^[a-z0-9][a-z0-9-]{2,63}$")
_SIG_KEYS = frozenset(
    {"id", "title", "engine", "summary", "seen_in", "fixed_in", "workaround", "links", "rules"}
)
_OPTIONAL_SIG_KEYS = frozenset({"not_confirmed"})
_COMMON_RULE_KEYS = {"kind": str, "why": str, "weight": int, "required": bool, "negate": bool}
# Per kind: field -> (type, allowed values or None). Tuples of strings are JSON lists of strings.
_RULE_FIELDS: dict[str, dict[str, tuple[type, tuple[str, ...] | None]]] = {
    "frame": {
        "role": (str, ROLES),
        "frames": (tuple, None),
        "any_frames": (tuple, None),
        "processes": (str, ("any", "all")),
    },
    "gpu": {
        "state": (str, GPU_STATES),
        "scope": (str, GPU_SCOPES),
        "peer_state": (str, GPU_STATES),
    },
    "gpu_model": {"names": (tuple, None)},
    "flight_recorder": {"op": (str, None), "state": (str, None), "mismatch": (bool, None)},
    "log": {
        "any_of": (tuple, None),
        "all_of": (tuple, None),
        "none_of": (tuple, None),
        "min_count": (int, None),
        "only_with_requests": (bool, None),
    },
    "flag": {
        "names": (tuple, None),
        "role": (str, ROLES),
        "value_contains": (str, None),
        "min_value": (float, None),
    },
    "cmdline": {"any_of": (tuple, None), "role": (str, ROLES)},
    "env": {"name": (str, None), "equals": (str, None), "role": (str, ROLES)},
    "version": {
        "min_version": (str, None),
        "max_version": (str, None),
        "component": (str, VERSION_COMPONENTS),
    },
    "multi_node": {},
}
_NEEDS = {  # at least one of these fields must be given and non-empty
    "frame": ("frames", "any_frames"),
    "gpu": ("state",),
    "gpu_model": ("names",),
    "flight_recorder": ("op", "state", "mismatch"),
    "log": ("any_of", "all_of"),
    "flag": ("names",),
    "cmdline": ("any_of",),
    "env": ("name",),
    "version": ("min_version", "max_version"),
    "multi_node": (),
}


_TYPE_WORDS = {str: "a string", bool: "true or false", int: "an integer"}


class SignatureFileError(ValueError):
    """The signature file is unusable; the message is one line naming the problem."""


def load_signatures(path: Path | None = None) -> SignatureSet:
    """The installed signature file, or the one at ``path``."""
    if path is None:
        data = resources.files("engine_watchdog.hangs").joinpath(BUILTIN).read_bytes()
        return parse_signatures(data, BUILTIN)
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise SignatureFileError(f"{path}: cannot read: {e.strerror or e}") from None
    if len(data) > MAX_FILE_BYTES:
        raise SignatureFileError(f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB")
    return parse_signatures(data, str(path))


def parse_signatures(data: bytes | str, source: str = "signatures") -> SignatureSet:
    """Check and build a signature set from the file's text."""
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise SignatureFileError(f"{source}: not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise SignatureFileError(f"{source}: the top level must be a JSON object")
    _check_header(doc, source)
    sigs = doc["signatures"]
    out: list[Signature] = []
    seen: set[str] = set()
    for i, raw in enumerate(sigs):
        sig = _signature(raw, source, i)
        if sig.id in seen:
            raise SignatureFileError(f"{source}: signature '{sig.id}': id used twice")
        seen.add(sig.id)
        out.append(sig)
    return SignatureSet(str(doc["revision"]), tuple(out), source)


def _check_header(doc: dict[str, Any], source: str) -> None:
    if doc.get("format") != FORMAT:
        raise SignatureFileError(f'{source}: "format" must be "{FORMAT}"')
    if doc.get("format_version") != FORMAT_VERSION:
        raise SignatureFileError(
            f'{source}: "format_version" {doc.get("format_version")!r} is not supported '
            f"(this engine-watchdog reads {FORMAT_VERSION})"
        )
    if not isinstance(doc.get("revision"), str) or not doc["revision"]:
        raise SignatureFileError(f'{source}: "revision" must be a non-empty string')
    if not isinstance(doc.get("signatures"), list) or not doc["signatures"]:
        raise SignatureFileError(f'{source}: "signatures" must be a non-empty list')
    extra = set(doc) - {"format", "format_version", "revision", "description", "signatures"}
    if extra:
        raise SignatureFileError(f"{source}: unknown top-level field {sorted(extra)[0]!r}")


def _signature(raw: Any, source: str, index: int) -> Signature:
    if not isinstance(raw, dict):
        raise SignatureFileError(f"{source}: signatures[{index}]: must be an object")
    sid = raw.get("id")
    if not isinstance(sid, str) or not _ID.match(sid):
        raise SignatureFileError(
            f"{source}: signatures[{index}].id: must match {_ID.pattern} (it is a label value)"
        )
    where = f"{source}: signature '{sid}'"
    _no_unknown(raw, _SIG_KEYS | _OPTIONAL_SIG_KEYS, where, "")
    missing = sorted(_SIG_KEYS - set(raw))
    if missing:
        raise SignatureFileError(f"{where}: missing field {missing[0]!r}")
    text = {k: _text(raw, k, where) for k in ("title", "summary", "fixed_in", "workaround")}
    if raw["engine"] not in ENGINES:
        raise SignatureFileError(f"{where}, engine: must be one of {', '.join(ENGINES)}")
    return Signature(
        id=sid,
        title=text["title"],
        engine=raw["engine"],
        summary=text["summary"],
        seen_in=_strings(raw["seen_in"], f"{where}, seen_in", allow_empty=True),
        fixed_in=text["fixed_in"],
        workaround=text["workaround"],
        links=_links(raw["links"], where),
        rules=_rules(raw["rules"], where),
        not_confirmed=_text(raw, "not_confirmed", where, optional=True),
    )


def _text(raw: dict[str, Any], key: str, where: str, optional: bool = False) -> str:
    value = raw.get(key, "" if optional else None)
    if not isinstance(value, str) or (not optional and not value.strip()):
        raise SignatureFileError(f"{where}, {key}: must be a non-empty string")
    return value


def _strings(value: Any, where: str, allow_empty: bool = False) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise SignatureFileError(f"{where}: must be a list of non-empty strings")
    if not value and not allow_empty:
        raise SignatureFileError(f"{where}: must not be empty")
    return tuple(value)


def _links(value: Any, where: str) -> tuple[Link, ...]:
    if not isinstance(value, list) or not value:
        raise SignatureFileError(f"{where}, links: must be a non-empty list (cite the report)")
    out = []
    for i, item in enumerate(value):
        at = f"{where}, links[{i}]"
        if not isinstance(item, dict):
            raise SignatureFileError(f"{at}: must be an object")
        _no_unknown(item, {"ref", "url", "shows"}, at, "")
        ref, url, shows = (_text(item, k, at) for k in ("ref", "url", "shows"))
        if not re.match(r"^[\w.-]+/[\w.-]+#\d+$", ref):
            raise SignatureFileError(f"{at}.ref: must look like owner/repo#123")
        if not url.startswith("https://github.com/"):
            raise SignatureFileError(f"{at}.url: must be a https://github.com/ address")
        out.append(Link(ref, url, shows))
    return tuple(out)


def _rules(value: Any, where: str) -> tuple[Rule, ...]:
    if not isinstance(value, list) or not value:
        raise SignatureFileError(f"{where}, rules: must be a non-empty list")
    return tuple(_rule(item, f"{where}, rules[{i}]") for i, item in enumerate(value))


def _rule(raw: Any, at: str) -> Rule:
    if not isinstance(raw, dict):
        raise SignatureFileError(f"{at}: must be an object")
    kind = raw.get("kind")
    if kind not in RULE_TYPES:
        raise SignatureFileError(f"{at}.kind: must be one of {', '.join(RULE_TYPES)}")
    fields = _RULE_FIELDS[kind]
    _no_unknown(raw, set(fields) | set(_COMMON_RULE_KEYS), at, f" for a {kind} rule")
    kwargs: dict[str, Any] = {}
    for key, typ in _COMMON_RULE_KEYS.items():
        if key in raw and key != "kind":
            kwargs[key] = _typed(raw[key], typ, None, f"{at}.{key}")
    if not str(kwargs.get("why", "")).strip():
        raise SignatureFileError(f"{at}.why: say what the report shows that this rule looks for")
    if not 1 <= kwargs.get("weight", 1) <= 10:
        raise SignatureFileError(f"{at}.weight: must be an integer from 1 to 10")
    for key, (typ, allowed) in fields.items():
        if key in raw:
            kwargs[key] = _typed(raw[key], typ, allowed, f"{at}.{key}")
    if _NEEDS[kind] and not any(kwargs.get(k) for k in _NEEDS[kind]):
        raise SignatureFileError(f"{at}: a {kind} rule needs {' or '.join(_NEEDS[kind])}")
    return RULE_TYPES[kind](**kwargs)


def _typed(value: Any, typ: type, allowed: tuple[str, ...] | None, at: str) -> Any:
    if typ is tuple:
        return _strings(value, at)
    if typ is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SignatureFileError(f"{at}: must be a number")
        return float(value)
    if typ is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise SignatureFileError(f"{at}: must be an integer")
    if not isinstance(value, typ):
        raise SignatureFileError(f"{at}: must be {_TYPE_WORDS.get(typ, typ.__name__)}")
    if allowed is not None and value not in allowed:
        raise SignatureFileError(f"{at}: must be one of {', '.join(allowed)}")
    return value


def _no_unknown(raw: dict[str, Any], known: set[str] | frozenset[str], at: str, what: str) -> None:
    extra = sorted(set(raw) - set(known))
    if extra:
        raise SignatureFileError(f"{at}: unknown field {extra[0]!r}{what}")
