"""The rules docs/architecture.md promises, checked over the code itself (its ``ast``), so the
doc cannot drift from the code: the layers import only downwards, probes never decide, the
detector never acts, recovery never probes, the core is pure, there are no import cycles (in
the package or in sim/), no function runs over 60 lines, and nothing is wired by attribute.
(That the map itself names what exists is the lint step's: tests/lint/test_map.py.)"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "engine_watchdog"
NAME = "engine_watchdog"

LAYERS = (
    "core",
    "host",
    "engines",
    "net",
    "probes",
    "hangs",
    "capture",
    "recovery",
    "report",
    "peers",
    "guard",
)
"""Bottom up: a layer imports only from the layers below it, and from itself."""
ABOVE = ("runtime", "cli")
"""The runtime may import every layer, the face (cli) everything."""
FORBIDDEN = {
    ("probes", "core.detector"): "probes never decide",
    ("probes", "core.progress"): "probes never decide",
    ("probes", "core.signals"): "probes never decide",
    ("recovery", "probes"): "recovery never probes",
    ("capture", "core.detector"): "capture never decides",
    ("guard", "core.detector"): "the guard carries out decisions, it never judges",
    ("guard", "core.requests"): "the guard carries out decisions, it never judges",
    ("guard", "probes"): "the guard is its own probe",
}
CORE_NO_IO = {"aiohttp", "asyncio", "psutil", "subprocess", "socket", "pynvml", "time", "os"}
"""The core has no clock and no I/O: the same code runs live, on a trace and in tests."""
MAX_FUNCTION_LINES = 60


def modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(p for p in parts if p != "__init__")
        yield name, ast.parse(path.read_text(encoding="utf-8"), str(path))


def imported(module: str, tree: ast.Module) -> Iterator[str]:
    """Every module this one imports, at any depth (function-level imports included)."""
    package = module.rsplit(".", 1)[0] if "." in module else ""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([NAME, *filter(None, up), base]).rstrip(".")
            # `from x import y`: module x.y where y is one, else x (resolved by the caller).
            yield from (f"{base}.{a.name}" for a in node.names)


def ours(modules_: dict[str, ast.Module]) -> dict[str, set[str]]:
    """module -> the package's own modules it imports (names relative to the package)."""
    graph: dict[str, set[str]] = {}
    for module, tree in modules_.items():
        deps = set()
        for name in imported(module, tree):
            if name == NAME or not name.startswith(NAME + "."):
                continue
            rel = name[len(NAME) + 1 :]
            while rel and rel not in modules_:
                rel = rel.rpartition(".")[0]  # `from x import name`: the module is x
            if rel and rel != module:
                deps.add(rel)
        graph[module] = deps
    return graph


ALL = dict(modules())
GRAPH = ours(ALL)


def layer(module: str) -> str:
    return module.split(".")[0]


def rank(module: str) -> int:
    order = (*LAYERS, *ABOVE)
    return order.index(layer(module)) if layer(module) in order else -1


def test_every_folder_is_a_known_layer() -> None:
    known = {*LAYERS, *ABOVE, "sim", "", "__main__"}
    assert {layer(m) for m in ALL} - known == set()


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if rank(m) >= 0))
def test_layers_import_only_downwards(module: str) -> None:
    for dep in GRAPH[module]:
        for (where, target), rule in FORBIDDEN.items():
            if layer(module) == where and (dep == target or dep.startswith(target + ".")):
                pytest.fail(f"{module} imports {dep}: {rule}")
        if layer(dep) in ("", "__main__"):
            continue  # the package root: __version__
        assert layer(dep) != "sim" or layer(module) == "cli", f"{module} imports {dep}"
        assert rank(dep) <= rank(module) or layer(module) == "cli", (
            f"{module} ({layer(module)}) imports {dep} ({layer(dep)}), a layer above it"
        )


def test_the_simulator_stands_alone() -> None:
    """sim/ is a stand-in for the engine: it imports nothing of the watchdog it is tested with."""
    for module, deps in GRAPH.items():
        if layer(module) == "sim":
            assert {d for d in deps if layer(d) != "sim"} == set(), module


@pytest.mark.parametrize("module", sorted(m for m in ALL if layer(m) == "core"))
def test_the_core_is_pure(module: str) -> None:
    roots = {name.split(".")[0] for name in imported(module, ALL[module])}
    assert roots & CORE_NO_IO == set(), f"{module} imports {sorted(roots & CORE_NO_IO)}"
    for node in ast.walk(ALL[module]):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id != "open", f"{module} opens a file"


def test_no_import_cycles() -> None:
    cycles = []
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for dep in sorted(GRAPH.get(module, ())):
            if state.get(dep) == 1:
                cycles.append([*path[path.index(dep) :], dep])
            elif dep not in state:
                visit(dep)
        path.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)
    assert cycles == []


def test_no_function_runs_over_the_limit() -> None:
    long = [
        f"{module}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for module, tree in ALL.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long == []


def test_the_rules_can_fail() -> None:
    """The checker sees a violation when there is one (a test that cannot fail checks nothing)."""
    bad = {"probes.x": ast.parse("from engine_watchdog.core.detector import Detector")}
    graph = ours({**ALL, **bad})
    assert "core.detector" in graph["probes.x"]
    cyclic = {
        "core.a": ast.parse("import engine_watchdog.core.b"),
        "core.b": ast.parse("from engine_watchdog.core import a"),
    }
    assert ours(cyclic) == {"core.a": {"core.b"}, "core.b": {"core.a"}}


SHELLS = {"create_subprocess_shell", "getoutput", "getstatusoutput"}
OS_SHELLS = {"system", "popen"}
UNBOUNDED_BY_DESIGN = {
    "recovery.supervise.start": "run mode's engine: it lives as long as the watchdog, which "
    "ends it (its own process group, a death signal), and the detector bounds its hangs",
}
BLOCKING_RUNS = {"run", "check_output", "check_call", "call"}


def test_no_shell_and_every_subprocess_is_bounded() -> None:
    """The doc's rule "subprocesses through create_subprocess_exec with timeouts, no
    shell=True", checked: no shell anywhere; a blocking subprocess call has a timeout, and a
    function that starts one with create_subprocess_exec or Popen bounds it (wait_for, a
    timeout, or a deadline it passes on)."""
    bad = []
    for module, tree in ALL.items():
        if layer(module) == "sim":  # the simulator stands apart; its children are its fakes
            continue
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            text = ast.unparse(fn)
            for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
                name = getattr(call.func, "attr", getattr(call.func, "id", ""))
                kw = {k.arg for k in call.keywords}
                shell = any(
                    k.arg == "shell" and getattr(k.value, "value", False) for k in call.keywords
                )
                owner = getattr(getattr(call.func, "value", None), "id", "")
                if shell or name in SHELLS or (owner == "os" and name in OS_SHELLS):
                    bad.append(f"{module}.{fn.name}: {name} with a shell")
                if name in BLOCKING_RUNS and owner == "subprocess" and "timeout" not in kw:
                    bad.append(f"{module}.{fn.name}: subprocess.{name} without a timeout")
                where = f"{module}.{fn.name}"
                if where in UNBOUNDED_BY_DESIGN:
                    continue
                if name in ("create_subprocess_exec", "Popen") and not any(
                    w in text for w in ("wait_for", "timeout", "deadline")
                ):
                    bad.append(f"{module}.{fn.name}: {name} with no bound in sight")
    assert bad == []


def test_recovery_imports_capture_only_in_actions() -> None:
    """Recovery may use capture only where the ladder's capture rung runs (recovery/actions.py);
    what both need of the host (tools, pdeathsig) lives below them, in host/."""
    bad = [
        f"{module} -> {dep}"
        for module, deps in GRAPH.items()
        if layer(module) == "recovery" and module != "recovery.actions"
        for dep in deps
        if layer(dep) == "capture"
    ]
    assert bad == []


RECORDS = {
    ("capture.cuda", "t"): "a CoreTarget, filled as its step finds the core's folder",
    ("cli.demo", "self.story"): "the demo's story: what its reporter saw, for the summary",
    ("core.detector", "self._restart"): "the detector's own restart window",
    ("guard.proxy", "ex"): "a request's exchange: its pump task is made from it",
    ("runtime.stopping", "self._backstop"): "threading.Timer takes no daemon= argument",
    ("sim.loadgen", "self.counts"): "the load generator's own tallies",
    ("sim.scheduler", "result"): "the step's result, filled as the step runs",
}
"""Objects whose attributes their owner fills after building them: records, not collaborators."""


def wired_by_attribute(tree: ast.Module) -> Iterator[tuple[int, str, str]]:
    """(line, the object, the assignment) for each attribute set on an object that a function
    built (``x = Thing(...)``, then ``x.part = ...``) or that its own object holds
    (``self.part.field = ...``): a collaborator wired after construction. Counters (``+=``)
    are not wiring."""

    def targets(node: ast.Assign | ast.AnnAssign) -> Iterator[ast.expr]:
        for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
            yield from t.elts if isinstance(t, ast.Tuple) else [t]

    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        built = {
            t.id
            for node in ast.walk(fn)
            if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", getattr(node.value.func, "attr", ""))[:1].isupper()
            for t in targets(node)
            if isinstance(t, ast.Name)
        }
        for node in ast.walk(fn):
            if not isinstance(node, ast.Assign | ast.AnnAssign):
                continue
            for t in targets(node):
                if not isinstance(t, ast.Attribute):
                    continue
                owner = t.value
                held = isinstance(owner, ast.Attribute) and getattr(owner.value, "id", "") == "self"
                if held or (isinstance(owner, ast.Name) and owner.id in built):
                    yield node.lineno, ast.unparse(owner), ast.unparse(t)


def set_attributes(tree: ast.Module) -> Iterator[tuple[int, str, str]]:
    """(line, the object, the assignment) for each attribute set on anything but ``self``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Attribute) and getattr(t.value, "id", "") != "self":
                    yield node.lineno, ast.unparse(t.value), ast.unparse(t)


def test_nothing_is_wired_by_attribute() -> None:
    """Collaborators go to constructors (or to the call that needs them): no module sets an
    attribute of an object after building it (``watcher.wire = guard``), nor of one its object
    holds (``self.canary.profile = ...``); the runtime, which assembles the parts, sets no
    attribute but its own at all. The records above are filled by their owners."""
    found = [
        f"{module} line {line}: {text}"
        for module, tree in ALL.items()
        for line, owner, text in {
            *wired_by_attribute(tree),
            *(set_attributes(tree) if layer(module) == "runtime" else ()),
        }
        if (module, owner) not in RECORDS
    ]
    assert found == [], "wired by attribute after construction"


def test_the_wiring_check_can_fail() -> None:
    built = ast.parse("def f():\n    w = Watcher(s)\n    w.wire = guard\n")
    held = ast.parse("class P:\n    def g(self):\n        self.canary.profile = p\n")
    counted = ast.parse("class P:\n    def g(self):\n        self.stats.stuck += 1\n")
    assert [t for _, _, t in wired_by_attribute(built)] == ["w.wire"]
    assert [t for _, _, t in wired_by_attribute(held)] == ["self.canary.profile"]
    assert list(wired_by_attribute(counted)) == []
    assert [t for _, _, t in set_attributes(ast.parse("t.watcher.wire = guard"))] == [
        "t.watcher.wire"
    ]
