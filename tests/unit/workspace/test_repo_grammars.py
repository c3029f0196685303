"""The languages the map reads: which files, how each is tagged, each grammar's query."""

from __future__ import annotations

import pytest

from merlin_flow.workspace.repo_grammars import (
    GRAMMARS,
    LANGUAGES,
    is_test,
    kind_of,
    language_of,
    parser_and_query,
)


def test_files_are_read_by_their_ending() -> None:
    assert language_of("pkg/engine.py") == "python"
    assert language_of("web/App.TSX") == "tsx"
    assert language_of("cmd/main.go") == "go"
    assert language_of("src/lib.rs") == "rust"
    assert language_of("lib/index.mjs") == "javascript"
    assert language_of("README.md") is None
    assert language_of("Makefile") is None
    assert language_of("dir.py/notes") is None
    assert language_of("dist/app.min.js") is None


def test_a_test_file_is_tagged_by_its_references_alone() -> None:
    assert kind_of("pkg/tests/test_engine.py") == "python:refs"
    assert kind_of("pkg/engine.py") == "python"
    assert kind_of("web/app.spec.ts") == "typescript:refs"
    assert kind_of("server/handler_test.go") == "go:refs"
    assert kind_of("README.md") is None
    assert is_test("conftest.py")
    assert is_test("src/__tests__/view.js")
    assert not is_test("src/contest.py")
    assert not is_test("sympy/testing/runtests.py")


@pytest.mark.parametrize("language", sorted(set(LANGUAGES.values())))
def test_every_grammar_loads_and_its_query_compiles(language: str) -> None:
    parser, query = parser_and_query(language)
    assert parser.parse(b"x").root_node is not None
    assert query.pattern_count >= 3
    assert GRAMMARS[language].keywords
