"""The languages the repository map reads: their grammars, definition queries, keywords.

Each language is an official tree-sitter grammar wheel (``tree-sitter-python``...,
its compiled grammar inside: nothing is downloaded at run time) and a small query for
its definitions: classes, functions, methods, types, module constants... Each query
has a maximum start depth, the depth of a file's outline in that grammar (a method of
a decorated class in Python is at depth 4), so that the query cursor never walks the
bodies of functions: on sympy's 28 MB of Python the query takes 0.4 s, against 1.8 s
for the same query over the whole tree (measured here).

A file is read by its ending (``LANGUAGES``; others are skipped); a test file
(``is_test``) by its references alone (``kind_of``).
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass
from functools import cache
from typing import Any


@dataclass(frozen=True)
class _Grammar:
    module: str
    function: str
    query: str
    depth: int
    """The query's maximum start depth: how deep the outline of a file of it goes."""
    keywords: frozenset[str]


_JS_DEFINITIONS = """
(class_declaration name: (_) @name) @definition.class
(function_declaration name: (identifier) @name) @definition.function
(generator_function_declaration name: (identifier) @name) @definition.function
(method_definition name: (property_identifier) @name) @definition.method
(variable_declarator name: (identifier) @name
  value: [(arrow_function) (function_expression) (class)]) @definition.function
(assignment_expression
  left: [(identifier) @name (member_expression property: (property_identifier) @name)]
  right: [(arrow_function) (function_expression) (class)]) @definition.function
(pair key: (property_identifier) @name
  value: [(arrow_function) (function_expression)]) @definition.function
"""
_TS_DEFINITIONS = (
    _JS_DEFINITIONS
    + """
(abstract_class_declaration name: (type_identifier) @name) @definition.class
(interface_declaration name: (type_identifier) @name) @definition.interface
(type_alias_declaration name: (type_identifier) @name) @definition.type
(enum_declaration name: (identifier) @name) @definition.enum
(method_signature name: (property_identifier) @name) @definition.method
(abstract_method_signature name: (property_identifier) @name) @definition.method
(function_signature name: (identifier) @name) @definition.function
(internal_module name: (identifier) @name) @definition.module
"""
)
_GO_KEYWORDS = (
    "break case chan const continue default defer else fallthrough for func go goto if "
    "import interface map package range return select struct switch type var nil true "
    "false"
)
_RUST_KEYWORDS = (
    "as async await break const continue crate dyn else enum extern false fn for if impl "
    "in let loop match mod move mut pub ref return self Self static struct super trait "
    "true type unsafe use where while"
)
_JS_KEYWORDS = (
    "async await break case catch class const continue debugger default delete do else "
    "export extends false finally for from function if import in instanceof let new null "
    "of return static super switch this throw true try typeof undefined var void while "
    "with yield"
)
GRAMMARS = {
    "python": _Grammar(
        "tree_sitter_python",
        "language",
        """
(class_definition name: (identifier) @name) @definition.class
(function_definition name: (identifier) @name) @definition.function
(module (expression_statement (assignment left: (identifier) @name)) @definition.constant)
""",
        4,
        frozenset([*keyword.kwlist, "self", "cls"]),
    ),
    "javascript": _Grammar(
        "tree_sitter_javascript", "language", _JS_DEFINITIONS, 5, frozenset(_JS_KEYWORDS.split())
    ),
    "typescript": _Grammar(
        "tree_sitter_typescript",
        "language_typescript",
        _TS_DEFINITIONS,
        5,
        frozenset((_JS_KEYWORDS + " interface type enum implements private public").split()),
    ),
    "tsx": _Grammar(
        "tree_sitter_typescript",
        "language_tsx",
        _TS_DEFINITIONS,
        5,
        frozenset((_JS_KEYWORDS + " interface type enum implements private public").split()),
    ),
    "go": _Grammar(
        "tree_sitter_go",
        "language",
        """
(function_declaration name: (identifier) @name) @definition.function
(method_declaration name: (field_identifier) @name) @definition.method
(type_spec name: (type_identifier) @name) @definition.type
(method_elem name: (field_identifier) @name) @definition.method
(source_file (const_declaration (const_spec name: (identifier) @name) @definition.constant))
(source_file (var_declaration (var_spec name: (identifier) @name) @definition.variable))
""",
        4,
        frozenset(_GO_KEYWORDS.split()),
    ),
    "rust": _Grammar(
        "tree_sitter_rust",
        "language",
        """
(struct_item name: (type_identifier) @name) @definition.class
(enum_item name: (type_identifier) @name) @definition.class
(union_item name: (type_identifier) @name) @definition.class
(type_item name: (type_identifier) @name) @definition.type
(trait_item name: (type_identifier) @name) @definition.interface
(impl_item type: [(type_identifier) @name (generic_type type: (type_identifier) @name)])
  @definition.impl
(function_item name: (identifier) @name) @definition.function
(function_signature_item name: (identifier) @name) @definition.function
(mod_item name: (identifier) @name) @definition.module
(macro_definition name: (identifier) @name) @definition.macro
(const_item name: (identifier) @name) @definition.constant
(static_item name: (identifier) @name) @definition.constant
""",
        5,
        frozenset(_RUST_KEYWORDS.split()),
    ),
}
LANGUAGES = {
    ".py": "python",
    ".pyi": "python",
    ".js": "javascript",
    ".jsx": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".ts": "typescript",
    ".mts": "typescript",
    ".cts": "typescript",
    ".tsx": "tsx",
    ".go": "go",
    ".rs": "rust",
}
"""File name endings the map reads, and the grammar of each; other files are skipped."""


_TEST = re.compile(
    r"(?:^|/)(?:tests?|__tests__|testdata|specs?)/"
    r"|(?:^|/)(?:test_[^/]*\.py|[^/]*_test\.(?:py|go|rs)|conftest\.py"
    r"|[^/]*\.(?:test|spec)\.(?:js|jsx|mjs|cjs|ts|tsx))$"
)
REFERENCES_ONLY = ":refs"
"""The ending of the kind of a file tagged by its references alone (a test file)."""


def is_test(path: str) -> bool:
    """True for a file of tests, by its folder or its name.

    In a ``tests/`` (``test``, ``__tests__``...) folder, or named as tests are
    (``test_*.py``, ``*_test.go``, ``*.spec.ts``, ``conftest.py``...).
    """
    if "test" not in path and "spec" not in path:  # most paths: no pattern to try
        return False
    return _TEST.search(path) is not None


def kind_of(path: str) -> str | None:
    """How the file at ``path`` is tagged, or None for a file the map skips.

    Its language, with REFERENCES_ONLY for a test file.
    """
    language = language_of(path)
    if language is None:
        return None
    return language + REFERENCES_ONLY if is_test(path) else language


def language_of(path: str) -> str | None:
    """The language of the file at ``path`` (by its ending), or None if the map skips it."""
    dot = path.rfind(".")
    if dot <= path.rfind("/") or path.endswith(".min.js"):
        return None
    return LANGUAGES.get(path[dot:].lower())


@cache
def parser_and_query(language: str) -> tuple[Any, Any]:
    """The tree-sitter parser and definition query of ``language``, made once."""
    import importlib

    from tree_sitter import Language, Parser, Query

    grammar = GRAMMARS[language]
    module = importlib.import_module(grammar.module)
    lang = Language(getattr(module, grammar.function)())
    return Parser(lang), Query(lang, grammar.query)
