"""The shape of the code, as docs/architecture.md draws it.

The wings' order is written once, in the ``## Wings`` block of docs/architecture.md: a
wing imports only itself and the wings below it. Every import is read with ``ast``
wherever it stands (inside a function, under ``TYPE_CHECKING``), so a late import cannot
hide an edge that points the wrong way.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from merlin_flow import _EXPORTS
from merlin_flow.failures import AttemptKind, FailureKind
from merlin_flow.store.events import EventKind
from merlin_flow.store.status import AttemptStatus, JobStatus, Phase, StepStatus

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("merlin_flow", "workers")
ARCHITECTURE = ROOT / "docs" / "architecture.md"
MOST_LINES = 400
"""Past 400 lines a module holds more than one concept (CONTRIBUTING.md)."""
MOST_TOP_LEVEL = 12
"""Modules directly in ``merlin_flow/`` besides the wings (``__init__`` counted)."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "_bundled" not in path.parts:
                found[_module_name(path)] = path
    return found


def _imports(path: Path, name: str) -> Iterator[tuple[str, tuple[str, ...]]]:
    """Every import of ``path``, anywhere in it: the module, and the names taken from it.

    Relative imports are resolved; ``import a.b`` takes no names from ``a.b``.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            yield base, tuple(alias.name for alias in node.names)


def _graph() -> dict[str, set[str]]:
    """Module -> the modules of merlin_flow and workers it imports.

    ``from package import module`` imports that module (and the package's ``__init__``
    only when another name comes from it).
    """
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for module, names in _imports(path, name):
            if module == "merlin_flow":  # the public API: each name from its own module
                targets |= {_EXPORTS[n] for n in names if n in _EXPORTS}
                names = tuple(n for n in names if n not in _EXPORTS)
            submodules = {f"{module}.{n}" for n in names} & known
            targets |= submodules
            if len(submodules) < len(names) or not names:
                targets.add(module)
        edges = set()
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def _wing_order() -> list[tuple[str, str]]:
    """The ``(wing, path)`` lines of the ``## Wings`` block, top wing first."""
    text = ARCHITECTURE.read_text()
    block = text.split("## Wings", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    return [tuple(line.split()[:2]) for line in block.strip().splitlines()]  # type: ignore[misc]


def _wing_of(module: str, wings: list[tuple[str, str]]) -> str:
    """The wing a module belongs to: its package's, or ``base`` for a top-level module."""
    for wing, path in wings:
        prefix = path.rstrip("/").replace("/", ".")
        if not path.endswith(".py") and (module == prefix or module.startswith(prefix + ".")):
            return wing
    if module == "merlin_flow.__main__":  # `python -m merlin_flow`: the command line
        return "cli"
    if module.count(".") <= 1 and module.startswith("merlin_flow"):
        return "base"
    raise AssertionError(f"{module} is in no wing of docs/architecture.md")


def _a_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _a_cycle({"a": {"b"}, "b": set()}) is None


def test_imports_inside_functions_are_read() -> None:
    graph = _graph()
    # merlin_flow.cli.following imports workers.canvas inside a function only.
    assert "workers.canvas" in graph["merlin_flow.cli.following"]
    assert "merlin_flow.engine.lifecycle" in graph["merlin_flow.engine.attempt"]


def test_no_module_imports_itself_back() -> None:
    cycle = _a_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_wing_imports_itself_back() -> None:
    wings = _wing_order()
    packages: dict[str, set[str]] = {}
    for name, edges in _graph().items():
        mine = _wing_of(name, wings)
        packages.setdefault(mine, set()).update(
            wing for wing in (_wing_of(e, wings) for e in edges) if wing != mine
        )
    cycle = _a_cycle(packages)
    assert cycle is None, "wings import each other: " + " -> ".join(cycle or [])


def test_every_wing_imports_only_the_wings_below_it() -> None:
    wings = _wing_order()
    assert [w for w, _ in wings][-1] == "base"  # the block is read
    assert len(wings) >= 10
    rank = {wing: len(wings) - index for index, (wing, _) in enumerate(wings)}
    wrong = sorted(
        f"{name} ({mine}) imports {edge} ({theirs})"
        for name, edges in _graph().items()
        for edge in edges
        if rank[(theirs := _wing_of(edge, wings))] > rank[(mine := _wing_of(name, wings))]
    )
    assert wrong == []


def test_the_wing_block_names_every_package() -> None:
    wings = {path.rstrip("/") for _, path in _wing_order()}
    packages = {
        str(path.parent.relative_to(ROOT))
        for path in (ROOT / "merlin_flow").glob("*/__init__.py")
        if path.parent.name != "_bundled"
    }
    assert packages
    assert packages | {"workers"} <= wings


def _celery_imports(path: Path, name: str) -> set[str]:
    return {
        module for module, _ in _imports(path, name) if module.split(".")[0] in ("celery", "kombu")
    }


def test_celery_and_kombu_are_imported_only_in_workers() -> None:
    users = {name for name, path in _modules().items() if _celery_imports(path, name)}
    assert "workers.app" in users  # the check finds them
    assert sorted(name for name in users if not name.startswith("workers")) == []


def test_the_celery_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    source = tmp_path / "late.py"
    source.write_text("def f():\n    if True:\n        from kombu.utils import json\n")
    assert _celery_imports(source, "late") == {"kombu.utils"}


def test_no_module_outgrows_one_concern() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    assert max(sizes.values()) > 100  # the sizes are read
    assert {name: n for name, n in sizes.items() if n > MOST_LINES} == {}


def test_the_top_level_holds_few_modules() -> None:
    top = sorted(path.name for path in (ROOT / "merlin_flow").glob("*.py"))
    assert "config.py" in top
    assert len(top) <= MOST_TOP_LEVEL, top


VOCABULARY = {
    value: enum.__name__
    for enum in (JobStatus, StepStatus, AttemptStatus, Phase, EventKind, AttemptKind, FailureKind)
    for value in enum
}
"""Every status, phase, event kind and attempt kind, as the database holds them."""


FIELDS = frozenset({"status", "phase", "kind", "next_kind", "failure_kind"})
"""Where a status, a phase, an event kind or an attempt kind is held: columns and keys."""


def _field(node: ast.expr) -> bool:
    """Whether ``node`` names such a field: ``x.status``, ``x["kind"]``, ``next_kind``."""
    if isinstance(node, ast.Attribute):
        return node.attr in FIELDS
    if isinstance(node, ast.Subscript):
        key = node.slice
        return isinstance(key, ast.Constant) and key.value in FIELDS
    return isinstance(node, ast.Name) and node.id in FIELDS


def _strings(node: ast.AST) -> Iterator[ast.Constant]:
    """The string constants of an expression (a tuple of them, a call's arguments...)."""
    for inner in ast.walk(node):
        if isinstance(inner, ast.Constant) and isinstance(inner.value, str):
            yield inner


def _uses(node: ast.AST) -> list[ast.expr]:
    """The expressions ``node`` uses as a status or a kind (none for most nodes)."""
    if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        return [side for side in sides if not _field(side)] if any(map(_field, sides)) else []
    if isinstance(node, ast.Assign):
        return [node.value] if any(map(_field, node.targets)) else []
    if isinstance(node, ast.AnnAssign):
        return [node.value] if node.value is not None and _field(node.target) else []
    if isinstance(node, ast.keyword):
        return [node.value] if node.arg in FIELDS else []
    if isinstance(node, ast.Dict):
        pairs = zip(node.keys, node.values, strict=True)
        return [v for k, v in pairs if isinstance(k, ast.Constant) and k.value in FIELDS]
    return []


def _status_literals(path: Path) -> Iterator[tuple[int, str]]:
    """Strings used as a status or a kind: compared with, stored in or passed as one."""
    for node in ast.walk(ast.parse(path.read_text())):
        for expression in _uses(node):
            yield from ((c.lineno, c.value) for c in _strings(expression))


def test_statuses_and_event_kinds_are_written_with_their_enums() -> None:
    found = sorted(
        f"{path.relative_to(ROOT)}:{line}: {value!r} is a {VOCABULARY[value]}"
        for path in _modules().values()
        for line, value in _status_literals(path)
        if value in VOCABULARY
    )
    assert found == []


def test_the_literal_check_finds_a_bare_status(tmp_path: Path) -> None:
    source = tmp_path / "bare.py"
    source.write_text(
        "from enum import StrEnum\n"
        "class Mine(StrEnum):\n    X = 'failed'\n"
        "def f(job, view, Event):\n"
        "    job.status = 'running'\n"
        "    other = {'status': 'pending', 'error': 'failed'}\n"
        "    found = Event.kind == 'escalated' or view['status'] in ('Skipped', 'x')\n"
        "    g(next_kind='execute', word='fix')\n"
        "    return 'failed: ' + job.error, view['error']\n"
    )
    values = [value for _, value in _status_literals(source) if value in VOCABULARY]
    assert sorted(values) == ["Skipped", "escalated", "execute", "pending", "running"]


def _status_writes(path: Path) -> Iterator[int]:
    """Lines of ``path`` that change a row's status (creating a row in its first is no change)."""
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Attribute) and t.attr == "status" for t in targets):
            yield node.lineno
        if not isinstance(node, ast.Call):
            continue
        func, named = node.func, {k.arg for k in node.keywords}
        if isinstance(func, ast.Attribute) and func.attr == "values" and "status" in named:
            yield node.lineno  # update(...).values(status=...)
        literal = [a.value for a in node.args[1:2] if isinstance(a, ast.Constant)]
        if isinstance(func, ast.Name) and func.id == "setattr" and literal == ["status"]:
            yield node.lineno


def test_every_status_change_is_a_transition_of_the_lifecycle() -> None:
    lifecycle = ROOT / "merlin_flow" / "engine" / "lifecycle.py"
    assert list(_status_writes(lifecycle))  # the writes are found
    found = sorted(
        f"{path.relative_to(ROOT)}:{line}"
        for path in _modules().values()
        if path != lifecycle
        for line in _status_writes(path)
    )
    assert found == []


def test_the_status_write_check_finds_each_way_to_write(tmp_path: Path) -> None:
    source = tmp_path / "writes.py"
    source.write_text(
        "def f(job, step, session, update, Step, Job):\n"
        "    job.status = 'x'\n"
        "    session.execute(update(Step).values(status='y'))\n"
        "    setattr(step, 'status', 'z')\n"
        "    session.add(Job(id='j', status='pending'))\n"  # a row made in its first state
        "    job.error = 'status'\n"
    )
    assert sorted(_status_writes(source)) == [2, 3, 4]


CROSS_CUTTING = frozenset(
    {
        "layers", "docs", "deploy", "dependencies", "fuzz", "hostile_output", "migrations",
        "public_api", "test_servers",
    }
)  # fmt: skip
"""The tests in ``tests/unit/`` that are about no one module (the shape, the files shipped)."""
UNTESTED = frozenset(
    {
        "merlin_flow/agents/choice.py", "merlin_flow/agents/instructions.py",
        "merlin_flow/cli/agent_places.py", "merlin_flow/cli/approval.py",
        "merlin_flow/cli/following.py", "merlin_flow/cli/operations.py",
        "merlin_flow/cli/pruning.py", "merlin_flow/cli/transcripts.py",
        "merlin_flow/jobs/agent_runs.py", "merlin_flow/jobs/demo.py", "merlin_flow/jobs/views.py",
        "merlin_flow/resources.py", "merlin_flow/settings.py", "merlin_flow/store/database.py",
        "merlin_flow/store/models.py", "merlin_flow/workspace/command_guard.py",
        "workers/canvas.py", "workers/roles.py", "workers/sweeper.py",
    }
)  # fmt: skip
"""Modules with no test file of their own (their tests are the CLI's, the e2e tests or
another module's). The list only shrinks: a new module comes with its tests."""


def _test_folder(module: Path) -> Path:
    """Where a module's tests live: ``tests/unit/<wing>/``, or ``tests/unit/`` for the base."""
    wing = module.parent.relative_to(ROOT)
    if wing.parts == ("merlin_flow",):
        return ROOT / "tests" / "unit"
    return ROOT / "tests" / "unit" / wing.name


def _named_for(test: Path, module: str) -> bool:
    """``test_<module>.py``, or ``test_<module>_<aspect>.py`` for one aspect of it."""
    return test.stem == f"test_{module}" or test.stem.startswith(f"test_{module}_")


def test_every_module_has_its_own_tests_but_the_listed() -> None:
    modules = [p for p in _modules().values() if p.name not in ("__init__.py", "__main__.py")]
    untested = {
        str(module.relative_to(ROOT))
        for module in modules
        if not any(_named_for(test, module.stem) for test in _test_folder(module).glob("test_*.py"))
    }
    assert len(modules) > 80  # the modules are found
    assert sorted(untested - UNTESTED) == [], "a module with no tests of its own"
    assert sorted(UNTESTED - untested) == [], "tested now: take it off UNTESTED"


def test_the_tests_mirror_the_wings() -> None:
    folders = {ROOT / "tests" / "unit" / wing for wing, _ in _wing_order() if wing != "base"}
    strays = []
    for folder in folders:
        source = (
            ROOT / "workers" if folder.name == "workers" else ROOT / "merlin_flow" / folder.name
        )
        stems = [p.stem for p in source.glob("*.py")]
        for test in folder.glob("test_*.py"):
            if not any(_named_for(test, stem) for stem in stems):
                strays.append(str(test.relative_to(ROOT)))
    base = {p.stem for p in (ROOT / "merlin_flow").glob("*.py")}
    for test in (ROOT / "tests" / "unit").glob("test_*.py"):
        if not any(_named_for(test, stem) for stem in base | CROSS_CUTTING):
            strays.append(str(test.relative_to(ROOT)))
    assert len(folders) >= 10  # every wing has its folder
    assert sorted(strays) == [], "a test file named for no module of its wing"


def test_contributing_lists_every_module() -> None:
    table = (ROOT / "CONTRIBUTING.md").read_text()
    paths = {str(path.relative_to(ROOT)) for path in _modules().values()}
    packages = {p for p in paths if p.endswith("__init__.py") and p != "merlin_flow/__init__.py"}
    missing = sorted(p for p in paths - packages if f"`{p}`" not in table)
    assert paths  # the modules are found
    assert missing == []


def test_architecture_names_only_modules_that_exist() -> None:
    named = set(re.findall(r"`((?:merlin_flow|workers)/[\w/]+\.py)`", ARCHITECTURE.read_text()))
    assert named  # the page names modules
    assert sorted(p for p in named if not (ROOT / p).is_file()) == []
