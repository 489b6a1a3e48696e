"""Multi-node vLLM on a LeaderWorkerSet: the chart (``lws.enabled``) and the kustomize overlay
``lws`` render a LeaderWorkerSet that LWS's own CRD schema accepts, whose leader and worker pods
each keep every promise of the single-node sidecar (tests/deploy/pod_checks.py), and whose
sidecars find each other on a free port with a Secret only they read."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest

from tests.deploy import lws as L
from tests.deploy import manifests as m
from tests.deploy.pod_checks import (
    ALL_CHECKS,
    DUMP_PATHS,
    ENGINE,
    SIDECAR,
    TOKEN_PATH,
    check_capabilities,
    check_schemas,
    check_sidecar_shape,
    pod,
)
from tests.deploy.tools import REPO

Obj = dict[str, Any]
CASES = list(L.LWS_CASES)
ROLES = ("leader", "worker")
PEER_DIR = L.PEER_SECRET_FILE.rsplit("/", 1)[0]


def the_lws(case: str) -> Obj:
    (lws,) = L.lws_objects(list(L.rendered(case)))
    return lws


def template(lws: Obj, role: str) -> Obj:
    t: Obj = lws["spec"]["leaderWorkerTemplate"][f"{role}Template"]
    return t


def containers(lws: Obj, role: str) -> dict[str, Obj]:
    return {c["name"]: c for c in template(lws, role)["spec"]["containers"]}


@pytest.mark.parametrize("case", CASES)
def test_the_leaderworkerset_validates_against_the_lws_crd(case: str) -> None:
    assert L.validate_lws(the_lws(case)) == []


def test_the_crd_check_has_teeth() -> None:
    """A misspelt field (in the group, and deep in a pod template), an unknown restart policy
    and a string size are each refused."""
    good = the_lws("helm-lws")
    bad = [copy.deepcopy(good) for _ in range(4)]
    bad[0]["spec"]["leaderWorkerTemplate"]["restartPolicies"] = "None"
    bad[1]["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "RestartOnFailure"
    bad[2]["spec"]["leaderWorkerTemplate"]["size"] = "2"
    sidecar = template(bad[3], "worker")["spec"]["containers"][-1]
    sidecar["volumeMounts"][-1]["readonly"] = True  # readOnly, misspelt: silently writable
    for obj in bad:
        assert L.validate_lws(obj), obj["spec"]["leaderWorkerTemplate"]


# A worker's sidecar (`engine-watchdog peer`) has no ConfigMap, so the checks that read one are
# the leader's; test_a_worker_s_sidecar_is_the_peer_endpoint_alone holds the worker to the rest.
WORKER_CHECKS = (check_schemas, check_sidecar_shape, check_capabilities)


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
@pytest.mark.parametrize("case", CASES)
def test_the_leader_s_pod_keeps_the_sidecar_s_promises(
    case: str, check: Callable[[m.Rendering], None]
) -> None:
    """Non-root as the engine, read-only root, ALL dropped, a memory limit, no GPU taken, dumps
    shared, the readiness gate, the default actions, ... as the single-node pod."""
    check(L.renderings(case)[0])


@pytest.mark.parametrize("check", WORKER_CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
@pytest.mark.parametrize("case", CASES)
def test_a_worker_s_pod_keeps_the_sidecar_s_promises(
    case: str, check: Callable[[m.Rendering], None]
) -> None:
    """Kubernetes schemas in strict mode, the engine's UID, read-only root, ALL dropped (and
    SYS_PTRACE only where meant), a memory limit, no GPU taken, no probe on the sidecar."""
    check(L.renderings(case)[1])


@pytest.mark.parametrize("case", CASES)
def test_a_worker_s_sidecar_is_the_peer_endpoint_alone(case: str) -> None:
    """No ConfigMap, metrics port, incident dir, token or API key; the engine's dumps shared;
    and no liveness probe on the worker's engine, even with liveness on (no /livez there)."""
    lws = the_lws(case)
    found = containers(lws, "worker")
    engine, sidecar = found[ENGINE], found[SIDECAR]
    assert "envFrom" not in sidecar and "livenessProbe" not in engine
    assert {e["name"] for e in sidecar["env"]} == {
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
    }
    assert "VLLM_API_KEY" not in {e["name"] for e in engine["env"]}
    sidecar_mounts = {v["mountPath"]: v["name"] for v in sidecar["volumeMounts"]}
    assert set(sidecar_mounts) == {"/var/run/engine-watchdog/dumps", "/tmp", PEER_DIR}
    engine_env = {e["name"]: e.get("value", "") for e in engine["env"]}
    engine_mounts = {v["mountPath"]: v["name"] for v in engine["volumeMounts"]}
    for var in DUMP_PATHS:
        directory = engine_env[var].rsplit("/", 1)[0]
        assert engine_mounts[directory] == sidecar_mounts[directory], var


@pytest.mark.parametrize("case", CASES)
def test_the_group_restarts_as_one_and_vllm_knows_its_nodes(case: str) -> None:
    """RecreateGroupOnPodRestart; vLLM's --nnodes is the group's size; the leader is node rank
    0 and serves, each worker is --headless at its LWS_WORKER_INDEX."""
    lws = the_lws(case)
    group = lws["spec"]["leaderWorkerTemplate"]
    assert group["restartPolicy"] == "RecreateGroupOnPodRestart"
    args = {role: containers(lws, role)[ENGINE]["args"] for role in ROLES}
    for role in ROLES:
        assert f"--nnodes={group['size']}" in args[role], role
        assert "--master-addr=$(LWS_LEADER_ADDRESS)" in args[role], role
    assert "--node-rank=0" in args["leader"] and "--headless" not in args["leader"]
    assert "--node-rank=$(LWS_WORKER_INDEX)" in args["worker"] and "--headless" in args["worker"]


@pytest.mark.parametrize("case", CASES)
def test_the_sidecars_find_each_other_on_a_free_port(case: str) -> None:
    """Every sidecar runs the peer endpoint on `peer` (9401) with the secret file, the group
    from LWS's env (no --peers list): the leader `watch`, a worker `peer`. No other container
    of the pod has that port (one network namespace: the engine's 8000, the guard's 8001, the
    watchdog's 9400)."""
    lws = the_lws(case)
    for role in ROLES:
        found = containers(lws, role)
        assert found[SIDECAR]["args"] == L.SIDECAR_ARGS[role], role
        ports = {p["name"]: p["containerPort"] for p in found[SIDECAR]["ports"]}
        assert ports["peer"] == L.PEER_PORT, role
        every = [p["containerPort"] for c in found.values() for p in c.get("ports", [])]
        assert len(every) == len(set(every)), (role, every)
    engine_ports = {p["containerPort"] for p in containers(lws, "leader")[ENGINE]["ports"]}
    assert L.PEER_PORT not in engine_ports | {8001, 9400}


@pytest.mark.parametrize("case", CASES)
def test_the_peer_secret_is_the_sidecars_alone_and_read_only(case: str) -> None:
    objs = list(L.rendered(case))
    lws = the_lws(case)
    for role in ROLES:
        spec = template(lws, role)["spec"]
        (volume,) = [v for v in spec["volumes"] if "secret" in v]
        secret = volume["secret"]
        assert secret["items"] == [{"key": secret["items"][0]["key"], "path": "secret"}], role
        assert secret["defaultMode"] == 0o440, role  # read-only, the owner and fsGroup
        found = containers(lws, role)
        (mount,) = [v for v in found[SIDECAR]["volumeMounts"] if v["name"] == volume["name"]]
        assert mount == {"name": volume["name"], "mountPath": PEER_DIR, "readOnly": True}, role
        engine_mounts = {v["name"] for v in found[ENGINE]["volumeMounts"]}
        assert volume["name"] not in engine_mounts, role
    names = {
        v["secret"]["secretName"]
        for r in ROLES
        for v in template(lws, r)["spec"]["volumes"]
        if "secret" in v
    }
    made = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Secret"}
    (name,) = names
    given = L.LWS_CASES[case].values.get("lws", {}).get("peer", {}).get("existingSecret")
    if given or L.LWS_CASES[case].source == "kustomize":
        assert name == (given or "engine-watchdog-peer") and name not in made  # the user's
    else:
        assert set(made) == {name} and len(made[name]["data"]["secret"]) >= 44  # 48 random chars


@pytest.mark.parametrize("case", CASES)
def test_a_worker_gets_no_api_token_and_the_service_only_the_leader(case: str) -> None:
    objs = list(L.rendered(case))
    lws = the_lws(case)
    worker = template(lws, "worker")["spec"]
    assert worker["automountServiceAccountToken"] is False and "serviceAccountName" not in worker
    assert all(
        v["mountPath"] != TOKEN_PATH for c in worker["containers"] for v in c["volumeMounts"]
    )
    leader_pod, worker_pod = (L.as_deployment(lws, r)["spec"]["template"] for r in ROLES)
    (service,) = [o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == "vllm"]
    selector = service["spec"]["selector"].items()
    assert selector <= leader_pod["metadata"]["labels"].items()
    assert not selector <= worker_pod["metadata"]["labels"].items()
    assert pod(L.as_deployment(lws, "leader"))["serviceAccountName"] == "engine-watchdog"


@pytest.mark.parametrize("case", [c for c in CASES if L.LWS_CASES[c].source == "helm"])
def test_helm_lint_is_clean_with_lws(case: str) -> None:
    report = m.lint_chart(m.CHART, L.LWS_CASES[case].values)
    assert report["errors"] == [], report
    assert [msg for msg in report["messages"] if msg["severity"] >= 2] == []


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"guard": {"enabled": True}, "lws": {"peer": {"port": 8001}}},
            "lws.peer.port 8001 is taken",
        ),
        ({"lws": {"peer": {"port": 9400}}}, "lws.peer.port 9400 is taken"),
        ({"lws": {"peer": {"port": 8000}}}, "lws.peer.port 8000 is taken"),
        ({"lws": {"size": 1}}, "lws.size must be >= 2"),
        ({"lws": {"size": 4}}, "has --nnodes=2 but lws.size is 4"),
        ({"persistence": {"enabled": True}}, "persistence.enabled with lws.enabled"),
        ({"engine": {"enabled": False}}, "set engine.enabled=true with it"),
    ],
    ids=[
        "guard-port",
        "watchdog-port",
        "engine-port",
        "size-1",
        "nnodes",
        "persistence",
        "no-engine",
    ],
)
def test_lws_values_that_would_break_the_group_are_refused(values: Obj, message: str) -> None:
    import helm_python as helm

    values = m_merge({"lws": {"enabled": True}}, values)
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        m.render_chart(m.CHART, values)


def m_merge(into: Obj, new: Obj) -> Obj:
    from tests.deploy.helm_cli import merge

    return merge(copy.deepcopy(into), new)


# ---- docs/multi-node.md says what the renderings do -------------------------------------
DOCS = REPO / "docs" / "multi-node.md"
SECTION = "## Deploy on LeaderWorkerSet"


def docs_section() -> str:
    text = DOCS.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start : end if end != -1 else None]


def test_the_docs_table_matches_the_rendered_objects() -> None:
    """Every row of the section's table (what, name, port or path) is what the chart and the
    overlay render."""
    rows = re.findall(r"^\| (.+?) \| `([^`]+)` \| `([^`]+)` \|$", docs_section(), re.M)
    table = {what: (name, where) for what, name, where in rows}
    for case in ("helm-lws", "kustomize-lws"):
        lws = the_lws(case)
        leader, worker = containers(lws, "leader"), containers(lws, "worker")
        engine_port = next(p for p in leader[ENGINE]["ports"] if p["name"] == "http")
        peer = next(p for p in worker[SIDECAR]["ports"] if p["name"] == "peer")
        assert peer in leader[SIDECAR]["ports"], case
        metrics = next(p for p in leader[SIDECAR]["ports"] if p["name"] == "watchdog")
        secret = next(v for v in template(lws, "worker")["spec"]["volumes"] if "secret" in v)
        found = {
            "engine API (leader)": (engine_port["name"], str(engine_port["containerPort"])),
            "peer port (every sidecar)": (peer["name"], str(peer["containerPort"])),
            "watchdog metrics (the leader's sidecar)": (
                metrics["name"],
                str(metrics["containerPort"]),
            ),
            "peer secret": (secret["secret"]["secretName"], L.PEER_SECRET_FILE),
            "restart policy": (
                lws["spec"]["leaderWorkerTemplate"]["restartPolicy"],
                "leaderWorkerTemplate.restartPolicy",
            ),
        }
        assert table == found, case
    for args in L.SIDECAR_ARGS.values():
        assert f"`{' '.join(args)}`" in " ".join(docs_section().split()), args


def test_kubernetes_md_points_to_the_section() -> None:
    text = (REPO / "docs" / "kubernetes.md").read_text()
    assert "multi-node.md#deploy-on-leaderworkerset" in text
    assert "overlays/lws" in text and "components/lws-watchdog" in text


@pytest.mark.parametrize("role", ROLES)
def test_the_chart_and_the_overlay_give_the_same_sidecar(role: str) -> None:
    """Two sources of one sidecar per role: its command line, ports, mounts and privileges."""

    def shape(case: str) -> Obj:
        c = containers(the_lws(case), role)[SIDECAR]
        mounts = sorted(c["volumeMounts"], key=lambda v: v["name"])
        return {k: c[k] for k in ("args", "ports", "securityContext")} | {"mounts": mounts}

    assert shape("helm-lws") == shape("kustomize-lws")


def test_the_watchdog_s_own_cli_takes_the_sidecars_command_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The leader's `watch` (with its ConfigMap as the environment, as envFrom gives it) and a
    worker's `peer` parse with engine-watchdog's own CLI: every flag the pods pass exists."""
    import click

    from engine_watchdog.cli.commands import register
    from engine_watchdog.cli.main import cli

    register(cli)  # every command attached now (main() imports each when it runs)
    if "peer" not in cli.list_commands(click.Context(cli)):
        pytest.skip("this engine-watchdog has no `peer` command (the multi-node CLI) yet")
    objs = list(L.rendered("helm-lws"))
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap"]
    for key, value in cm["data"].items():
        monkeypatch.setenv(key, value)
    lws = the_lws("helm-lws")
    for role in ROLES:
        name, *args = containers(lws, role)[SIDECAR]["args"]
        command = cli.get_command(click.Context(cli), name)
        assert command is not None, name
        with command.make_context(name, list(args)) as ctx:
            assert ctx.params, role
