"""The signature file: what ships, and what the loader refuses (one line naming the problem)."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from engine_watchdog.hangs import SignatureFileError, load_signatures, parse_signatures
from engine_watchdog.hangs.load import BUILTIN

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "engine_watchdog" / "hangs" / BUILTIN


def shipped() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(SHIPPED.read_text())
    return doc


def test_the_installed_file_loads_with_cited_signatures() -> None:
    sigs = load_signatures()
    assert len(sigs.signatures) >= 12
    assert sigs.revision
    for sig in sigs.signatures:
        assert sig.links and all(link.url.startswith("https://github.com/") for link in sig.links)
        assert sig.workaround and sig.rules
        assert any(r.required for r in sig.rules), f"{sig.id}: a signature needs a required rule"
    engines = {s.engine for s in sigs.signatures}
    assert {"vllm", "sglang"} <= engines


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is 3.11+")
def test_the_file_is_package_data() -> None:
    import tomllib

    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert BUILTIN in conf["tool"]["setuptools"]["package-data"]["engine_watchdog.hangs"]


def test_a_given_file_is_read(tmp_path: Path) -> None:
    doc = shipped()
    doc["signatures"] = doc["signatures"][:1]
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(doc))
    sigs = load_signatures(path)
    assert len(sigs.signatures) == 1 and sigs.source == str(path)


def _mutate(doc: dict[str, Any], how: str) -> Any:
    sig = doc["signatures"][1]
    rule = sig["rules"][0]
    if how == "not-json":
        return "{not json"
    if how == "format":
        doc["format"] = "something/else"
    elif how == "version":
        doc["format_version"] = 2
    elif how == "duplicate":
        doc["signatures"].append(copy.deepcopy(sig))
    elif how == "bad-id":
        sig["id"] = "Has Spaces"
    elif how == "missing":
        del sig["workaround"]
    elif how == "unknown-field":
        sig["workaroud"] = "typo"
    elif how == "weight":
        rule["weight"] = 11
    elif how == "weight-type":
        rule["weight"] = "3"
    elif how == "kind":
        rule["kind"] = "telepathy"
    elif how == "role":
        rule["role"] = "gpu-driver"
    elif how == "rule-field":
        rule["requird"] = True
    elif how == "why":
        rule["why"] = " "
    elif how == "empty-rule":
        sig["rules"] = [{"kind": "log", "why": "x"}]
    elif how == "no-rules":
        sig["rules"] = []
    elif how == "ref":
        sig["links"][0]["ref"] = "#40926"
    elif how == "url":
        sig["links"][0]["url"] = "http://example.com/1"
    elif how == "engine":
        sig["engine"] = "ollama"
    return doc


@pytest.mark.parametrize(
    ("how", "needle"),
    [
        ("not-json", "not JSON"),
        ("format", '"format" must be'),
        ("version", "is not supported"),
        ("duplicate", "id used twice"),
        ("bad-id", "signatures[1].id: must match"),
        ("missing", "missing field 'workaround'"),
        ("unknown-field", "unknown field 'workaroud'"),
        ("weight", "rules[0].weight: must be an integer from 1 to 10"),
        ("weight-type", "rules[0].weight: must be an integer"),
        ("kind", "rules[0].kind: must be one of"),
        ("role", "rules[0].role: must be one of"),
        ("rule-field", "rules[0]: unknown field 'requird' for a frame rule"),
        ("why", "rules[0].why"),
        ("empty-rule", "a log rule needs any_of or all_of"),
        ("no-rules", "rules: must be a non-empty list"),
        ("ref", "links[0].ref: must look like owner/repo#123"),
        ("url", "links[0].url"),
        ("engine", "engine: must be one of"),
    ],
)
def test_a_bad_file_is_refused_with_one_clear_line(how: str, needle: str) -> None:
    bad = _mutate(shipped(), how)
    data = bad if isinstance(bad, str) else json.dumps(bad)
    with pytest.raises(SignatureFileError) as err:
        parse_signatures(data, "mine.json")
    msg = str(err.value)
    assert needle in msg and "\n" not in msg and msg.startswith("mine.json: ")
    if how not in ("not-json", "format", "version", "bad-id"):
        sid = shipped()["signatures"][1]["id"]
        assert f"signature '{sid}'" in msg


def test_unreadable_and_oversized_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SignatureFileError, match="cannot read"):
        load_signatures(tmp_path / "absent.json")
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (4 << 20) + b"{}")
    with pytest.raises(SignatureFileError, match="larger than 4 MiB"):
        load_signatures(big)


def test_adding_a_signature_needs_no_code() -> None:
    doc = shipped()
    doc["signatures"].append(
        {
            "id": "my-site-hang",
            "title": "Our own hang",
            "engine": "any",
            "summary": "Seen on our cluster.",
            "seen_in": [],
            "fixed_in": "not fixed",
            "workaround": "restart",
            "links": [
                {
                    "ref": "example/repo#1",
                    "url": "https://github.com/example/repo/issues/1",
                    "shows": "it",
                }
            ],
            "rules": [
                {"kind": "log", "any_of": ["boom"], "required": True, "why": "the log says boom"}
            ],
        }
    )
    sigs = parse_signatures(json.dumps(doc))
    assert sigs.ids()[-1] == "my-site-hang"


def test_the_docs_list_every_signature() -> None:
    doc = (ROOT / "docs" / "known-hangs.md").read_text()
    sigs = load_signatures()
    missing = [s.id for s in sigs.signatures if f"`{s.id}`" not in doc]
    assert missing == []
    assert f"{2 * len(sigs.signatures) + 1} values today" in doc


def test_the_package_imports_nothing_else_from_engine_watchdog() -> None:
    """But the one redaction module (pure, importing nothing itself): secrets are hidden by
    one set of rules, in the bundle and in the report alike."""
    import ast

    for path in (ROOT / "engine_watchdog" / "hangs").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                assert (
                    not name.startswith("engine_watchdog")
                    or name.startswith("engine_watchdog.hangs")
                    or name == "engine_watchdog.core.redact"
                ), f"{path.name} imports {name}"


def test_a_version_rule_names_engine_or_nccl() -> None:
    doc = shipped()
    nccl = next(
        s for s in doc["signatures"] if s["id"] == "nccl-2289-cross-node-cudagraph-deadlock"
    )
    assert nccl["rules"][0]["component"] == "nccl"
    nccl["rules"][0]["component"] = "cuda"
    with pytest.raises(SignatureFileError, match="component: must be one of"):
        parse_signatures(json.dumps(doc))
