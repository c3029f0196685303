"""The shape of the code: no import cycle among merlin's modules, Celery only in workers/.

Module-level imports only (an import inside a function runs late, on purpose). Read from
the source with ``ast``, so the test sees every module whatever imports it first.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("merlin_flow", "workers")


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


def _statements_run_at_import(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements of ``body`` that run when the module loads (function bodies do not)."""
    run: list[ast.stmt] = []
    for node in body:
        if isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                run += _statements_run_at_import(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            run += _statements_run_at_import(node.body + node.orelse + node.finalbody)
        else:
            run.append(node)
    return run


def _top_level_imports(path: Path, known: set[str]) -> set[str]:
    """The known modules ``path`` imports when it is loaded."""
    names: set[str] = set()
    for node in _statements_run_at_import(ast.parse(path.read_text()).body):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & known
            names.update(submodules)  # `from package import module`: that module
            if len(submodules) < len(node.names):
                names.add(node.module)  # and any other name comes from the package
    imported = set()
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            imported.add(name)
    return imported


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph = {}
    for name, path in modules.items():
        edges = _top_level_imports(path, known) - {name}
        # A package's __init__ runs before any of its modules: importing one imports it.
        for target in list(edges):
            parent = target.rpartition(".")[0]
            while parent:
                if parent in known and parent != name and not name.startswith(parent + "."):
                    edges.add(parent)
                parent = parent.rpartition(".")[0]
        graph[name] = edges
    return graph


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


def test_no_module_imports_itself_back() -> None:
    graph = _graph()
    assert (
        "merlin_flow.engine.lifecycle" in graph["merlin_flow.engine.attempt"]
    )  # the imports are read
    cycle = _a_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_engine_does_not_load_the_cli_or_celery() -> None:
    graph = _graph()
    for name, edges in graph.items():
        entry_point = name.endswith("__main__")
        if (
            name.startswith("merlin_flow")
            and not name.startswith("merlin_flow.cli")
            and not entry_point
        ):
            assert not {e for e in edges if e.startswith(("merlin_flow.cli", "workers"))}, name
    celery_users = {
        name
        for name, path in _modules().items()
        if any(
            line.startswith(("import celery", "from celery", "import kombu", "from kombu"))
            for line in path.read_text().splitlines()
        )
    }
    assert celery_users  # the check finds them
    assert all(name.startswith("workers") for name in celery_users), celery_users


MOST_LINES = 460
"""About 450 lines: past that, a module holds more than one thing (CONTRIBUTING.md)."""


def test_no_module_outgrows_one_concern() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    assert max(sizes.values()) > 100  # the sizes are read
    assert {name: n for name, n in sizes.items() if n > MOST_LINES} == {}


def test_contributing_lists_every_module() -> None:
    table = (ROOT / "CONTRIBUTING.md").read_text()
    paths = {str(path.relative_to(ROOT)) for path in _modules().values()}
    packages = {p for p in paths if p.endswith("__init__.py") and p != "merlin_flow/__init__.py"}
    missing = sorted(p for p in paths - packages if f"`{p}`" not in table)
    assert paths  # the modules are found
    assert missing == []
