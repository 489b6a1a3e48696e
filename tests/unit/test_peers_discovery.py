"""A node's view of its group, from LeaderWorkerSet's environment or --peers; bad values are
refused with one line naming the variable or flag; the peer secret's checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_watchdog.core.settings import Secret, SettingsError
from engine_watchdog.peers.auth import SECRET_VAR, authorised, load_secret
from engine_watchdog.peers.discovery import from_lws, from_peers, group_view

LWS = {
    "LWS_LEADER_ADDRESS": "vllm-0.vllm.default",
    "LWS_GROUP_SIZE": "3",
    "LWS_WORKER_INDEX": "2",
}


def test_lws_worker_knows_the_leader_and_every_worker() -> None:
    view = from_lws(LWS, 9401)
    assert view.role == "worker"
    assert view.me.name == "vllm-0-2" and view.me.address == "vllm-0-2.vllm.default:9401"
    assert view.leader.address == "vllm-0.vllm.default:9401"
    assert [p.name for p in view.peers] == ["vllm-0", "vllm-0-1", "vllm-0-2"]
    assert [p.name for p in view.others] == ["vllm-0", "vllm-0-1"]


def test_lws_index_zero_is_the_leader() -> None:
    view = from_lws({**LWS, "LWS_WORKER_INDEX": "0"}, 9401)
    assert view.role == "leader" and view.me == view.leader


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"LWS_GROUP_SIZE": "three"}, "LWS_GROUP_SIZE='three'"),
        ({"LWS_GROUP_SIZE": "0"}, "LWS_GROUP_SIZE=0"),
        ({"LWS_WORKER_INDEX": "3"}, "LWS_WORKER_INDEX=3"),
        ({"LWS_WORKER_INDEX": "-1"}, "LWS_WORKER_INDEX=-1"),
        ({"LWS_LEADER_ADDRESS": ""}, "LWS_LEADER_ADDRESS=''"),
        ({"LWS_LEADER_ADDRESS": "http://x"}, "LWS_LEADER_ADDRESS"),
    ],
)
def test_bad_lws_values_name_the_variable(changes: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match=named.replace("-", r"\-")):
        from_lws({**LWS, **changes}, 9401)


def test_a_partial_lws_environment_is_an_error() -> None:
    with pytest.raises(SettingsError, match="LWS_GROUP_SIZE"):
        group_view({"LWS_LEADER_ADDRESS": "a-0.a"}, [], {"a-0"}, 9401)


def test_peers_list_first_is_the_leader() -> None:
    entries = ["10.0.0.1:9401", "10.0.0.2:9401", "[fd00::3]:9401"]
    assert from_peers(entries, {"10.0.0.1"}, 9401).role == "leader"
    view = from_peers(entries, {"fd00::3", "host-3"}, 9401)
    assert view.role == "worker" and view.me.address == "[fd00::3]:9401"
    assert view.leader.name == "10.0.0.1:9401"


def test_peers_list_beats_lws_and_none_is_a_single_node() -> None:
    assert group_view(LWS, ["127.0.0.1:1", "127.0.0.1:2"], {"127.0.0.1"}, 2) is not None
    assert group_view({}, [], {"h"}, 9401) is None


@pytest.mark.parametrize(
    ("entries", "named"),
    [
        (["10.0.0.1"], "'10.0.0.1' is not HOST:PORT"),
        (["10.0.0.1:0"], "is not HOST:PORT"),
        (["10.0.0.1:99999"], "is not HOST:PORT"),
        (["10.0.0.1:9401", "10.0.0.1:9401"], "listed twice"),
        (["10.0.0.9:9401"], "is not in the list"),
        ([" "], "empty"),
    ],
)
def test_bad_peers_name_the_flag(entries: list[str], named: str) -> None:
    with pytest.raises(SettingsError, match=f"--peers.*{named}"):
        from_peers(entries, {"10.0.0.1"}, 9401)


def test_secret_from_a_mounted_file_and_from_the_environment(tmp_path: Path) -> None:
    f = tmp_path / "secret"
    f.write_text("s3cret-value-0123456789\n")
    assert load_secret(f, {}) == Secret("s3cret-value-0123456789")
    assert load_secret(None, {SECRET_VAR: "env-value-0123456789"}) == Secret("env-value-0123456789")


@pytest.mark.parametrize("content", ["", "zq7x"])
def test_a_missing_or_short_secret_is_refused_without_its_value(
    tmp_path: Path, content: str
) -> None:
    f = tmp_path / "secret"
    f.write_text(content)
    with pytest.raises(SettingsError, match="--peer-secret-file") as err:
        load_secret(f, {})
    assert not content or content not in str(err.value)


def test_an_unreadable_secret_file_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"--peer-secret-file .*cannot read it"):
        load_secret(tmp_path / "absent", {})


def test_only_the_bearer_with_the_secret_is_authorised() -> None:
    s = Secret("the-secret-0123456789")
    assert authorised("Bearer the-secret-0123456789", s)
    assert authorised("bearer the-secret-0123456789", s)
    for header in (None, "", "Bearer", "Bearer the-secret", "Basic the-secret-0123456789"):
        assert not authorised(header, s)
