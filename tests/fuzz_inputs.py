"""Hostile and near-valid input for the fuzzing of merlin's readers (hypothesis strategies).

Each input kind has a strategy that mostly starts from a valid document and breaks it a
little (a field dropped, of the wrong type, odd unicode, huge or empty, NUL), or writes
what parsers find hard (deep nesting, duplicate keys, YAML anchors and alias bombs, tags,
bytes that are not UTF-8), and a check: the reader either succeeds or raises only its
documented error, with a short message that names the problem. ``PROPERTIES`` lists the
checks with their strategies; ``tests/unit/test_fuzz.py`` runs a few hundred examples of
each, ``python -m tests.chaos.fuzz`` ten thousand.
"""

from __future__ import annotations

import json
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

MAX_MESSAGE = 4000
"""The longest error message that still reads as a message (not the input echoed)."""


class Unexpected(AssertionError):
    """A reader broke its contract: another exception, or an unhelpful message."""


# ---------------------------------------------------------------- building blocks

HOSTILE_STRINGS = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "\t\r\n",
    "\u202e\u200b\ufeff",
    "é" * 3,
    "🙂",
    "~",
    "~nouser-xq/x",
    "..",
    "../../etc/passwd",
    "/etc/passwd",
    "a..b",
    "a.lock",
    "-rf",
    "*",
    "**",
    "null",
    "yes",
    ".inf",
    "0x1F",
    "2026-01-01",
    "1e999",
    "${HOME}",
    "$(rm -rf /)",
    "`id`",
    "'\"",
    "(",
    ")",
    "[",
    "{",
    "\\",
    "x" * 70,
    "x" * 5000,
]

odd_text = st.one_of(
    st.sampled_from(HOSTILE_STRINGS),
    st.text(max_size=30),
    st.text(st.characters(codec="utf-8"), max_size=12),
)
"""Strings that break naive code: empty, NUL, controls, bidi marks, paths, huge."""

odd_scalar = st.one_of(
    odd_text,
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),  # inf and nan included
    st.booleans(),
    st.none(),
)

odd_value = st.recursive(
    odd_scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(odd_text, inner, max_size=4)
    ),
    max_leaves=12,
)
"""Any JSON-like value: what a field of the wrong type may hold."""


def _mutated(draw: st.DrawFn, base: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """``base`` with a few fields dropped, replaced by odd values, or added."""
    data = dict(base)
    for _ in range(draw(st.integers(0, 3))):
        action = draw(st.sampled_from(["drop", "odd", "near", "extra"]))
        key = draw(st.sampled_from(sorted(fields)))
        if action == "drop":
            data.pop(key, None)
        elif action == "odd":
            data[key] = draw(odd_value)
        elif action == "near":
            data[key] = draw(fields[key])
        else:
            data[draw(odd_text)] = draw(odd_value)
    return data


# ---------------------------------------------------------------- TaskLists

STEP_TYPES = ["Debug", "Feature", "Refactor", "Verify", "Test"]
step_ids = st.one_of(st.from_regex(r"[a-z][a-z0-9_.-]{0,8}", fullmatch=True), odd_text)
STEP_FIELDS: dict[str, Any] = {
    "id": step_ids,
    "step_type": st.one_of(st.sampled_from(STEP_TYPES), st.sampled_from(["debug", "Debugg"])),
    "description": odd_text,
    "verification": odd_text,
    "exit_command": st.one_of(st.none(), odd_text),
    "agent": st.one_of(st.none(), odd_text),
    "tier": st.one_of(st.none(), odd_text),
    "depends_on": st.one_of(st.none(), st.lists(step_ids, max_size=3)),
    "on_failure": st.sampled_from(["stop", "continue", "STOP", ""]),
    "spec_check": st.one_of(st.booleans(), st.sampled_from(["yes", "no", "on", 2])),
    "status": odd_value,
}


@st.composite
def tasklist_data(draw: st.DrawFn) -> dict[str, Any]:
    """A TaskList as data, mostly valid, some fields mutated."""
    steps = []
    for index in range(draw(st.integers(0, 4))):
        base = {"id": f"s{index}", "step_type": "Debug", "description": "Fix it."}
        if index and draw(st.booleans()):
            base["depends_on"] = [f"s{index - 1}"]
        steps.append(_mutated(draw, base, STEP_FIELDS))
    if len(steps) > 1 and draw(st.integers(0, 9)) == 0:
        steps.append(dict(steps[0]))  # a duplicate id
    top_fields: dict[str, Any] = {
        "title": odd_text,
        "id": step_ids,
        "on_failure": STEP_FIELDS["on_failure"],
        "steps": st.lists(odd_value, max_size=3),
        "status": odd_value,
    }
    return _mutated(draw, {"title": "A job", "steps": steps}, top_fields)


def _dump_yaml(data: Any) -> str:
    return yaml.safe_dump(data, allow_unicode=True, sort_keys=False)


ALIAS_BOMB = (
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
    "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
    "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
    "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
)
YAML_SNIPPETS = [
    ALIAS_BOMB + "title: *g\nsteps: *g\n",
    ALIAS_BOMB + "title: x\nsteps:\n  - {id: a, step_type: Debug, description: *g}\n",
    ALIAS_BOMB
    + "title: x\nsteps:\n  - {id: a, step_type: Debug, description: d, depends_on: *g}\n",
    ALIAS_BOMB + "title: x\nsteps: []\n*g : 1\n",
    "title: x\ntitle: y\nsteps: []\n",
    "title: x\nsteps:\n  - &s {id: a, step_type: Debug, description: d}\n  - *s\n",
    "title: x\nsteps:\n  - &s {id: a, step_type: Debug, description: d}\n  - {<<: *s, id: b}\n",
    "a: &a [*a]\n",
    "&a [*a]\n",
    "title: !!python/object/apply:os.system ['echo hi']\nsteps: []\n",
    "title: !!binary aGVsbG8=\nsteps: []\n",
    "title: !!set {a, b}\nsteps: []\n",
    "title: !!timestamp 2026-01-01\nsteps: []\n",
    "title: !custom x\nsteps: []\n",
    "title: !!timestamp 20*x26-01-01\nsteps: []\n",
    "title: !!int abc\nsteps: []\n",
    "title: !!int\n",
    "title: !!bool maybe\nsteps: []\n",
    "title: !!float x\nsteps: []\n",
    "? [a, b]\n: x\n",
    "? {a: b}\n: x\n",
    "title: x\nsteps:\n  - {id: 1, step_type: Debug, description: d}\n",
    "title: x\nsteps:\n  - {id: 2026-01-01, step_type: Debug, description: d}\n",
    "title: x\nsteps:\n  - {1: 2, null: 3, 2.5: 4, true: 5}\n",
    "title: x\nsteps:\n  - {id: a, step_type: Debug, description: d, depends_on: a}\n",
    "title: x\nsteps:\n  - {id: a, step_type: Debug, description: d, depends_on: [a]}\n",
    "title: x\nsteps: " + "[" * 3000 + "]" * 3000 + "\n",
    "title: x\nsteps: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n",
    "title: x\nsteps: " + "- " * 2000 + "x\n",
    "--- a\n--- b\n",
    "%YAML 1.1\n---\ntitle: x\n",
    "%YAML 9.9\n---\ntitle: x\n",
    "\ufefftitle: x\nsteps: []\n",
    "title: x\n\tsteps: []\n",
    "",
    "~",
    "- a\n- b\n",
    "42",
]
JSON_SNIPPETS = [
    '{"title": "x", "title": "y", "steps": []}',
    '{"title": "x", "steps": ' + "[" * 5000 + "]" * 5000 + "}",
    '{"title": "x", "steps": [], "id": NaN}',
    '{"title": "x", "steps": [], "id": Infinity}',
    '{"title": "\\ud800", "steps": []}',
    '{"title": 1e999, "steps": []}',
    '{"title": "x", "steps": [{"id": "a", "step_type": "Debug", "description": "d", '
    '"depends_on": [' + ", ".join(['"a"'] * 1000) + "]}]}",
    "",
    "[]",
    "null",
    '"x"',
]


def _text_mutation(draw: st.DrawFn, text: str) -> str:
    """``text`` cut short, or with odd characters put in somewhere."""
    action = draw(st.sampled_from(["none", "none", "cut", "insert"]))
    if not text or action == "none":
        return text
    where = draw(st.integers(0, len(text)))
    if action == "cut":
        return text[:where]
    junk = draw(st.sampled_from(["\x00", ":", "\n  ", "- ", "&x ", "*x", "{", "]", '"', "\t", "#"]))
    return text[:where] + junk + text[where:]


@dataclass(frozen=True)
class Document:
    """A file to write: its name and its bytes (not always valid UTF-8)."""

    name: str
    data: bytes

    def __repr__(self) -> str:
        """Short enough for a failure report."""
        shown = self.data[:300] + (b"..." if len(self.data) > 300 else b"")
        return f"Document({self.name!r}, {shown!r})"

    def write(self, folder: Path) -> Path:
        """The document written into ``folder``; its path."""
        path = folder / self.name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.data)
        return path


def _encoded(draw: st.DrawFn, text: str) -> bytes:
    data = text.encode("utf-8", "surrogatepass")
    if data and draw(st.integers(0, 19)) == 0:  # bytes that are not UTF-8
        where = draw(st.integers(0, len(data)))
        data = (
            data[:where] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80"])) + data[where:]
        )
    return data


@st.composite
def tasklist_documents(draw: st.DrawFn) -> Document:
    """A TaskList file: YAML or JSON text of near-valid data, or a known-hard snippet."""
    suffix = draw(st.sampled_from([".yaml", ".yml", ".json"]))
    if draw(st.integers(0, 4)) == 0:
        pool = JSON_SNIPPETS if suffix == ".json" else YAML_SNIPPETS
        text = draw(st.sampled_from(pool))
    else:
        data = draw(tasklist_data())
        if suffix == ".json":
            text = json.dumps(data, ensure_ascii=draw(st.booleans()))
        else:
            text = _dump_yaml(data)
    return Document("tasklist" + suffix, _encoded(draw, _text_mutation(draw, text)))


# ---------------------------------------------------------------- merlin.toml


def toml_value(value: Any) -> str:
    """``value`` in TOML's inline syntax (invalid TOML for None: a decode error to test)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return "nan"
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    return "null"  # not TOML


def toml_key(key: Any) -> str:
    """A key: bare when it can be, quoted otherwise."""
    text = str(key)
    if text and all(c.isascii() and (c.isalnum() or c in "_-") for c in text):
        return text
    return json.dumps(text, ensure_ascii=False)


def _is_table(key: str, value: Any) -> bool:
    """Whether ``value`` is written as a ``[table]`` (or ``[[tables]]``), not inline."""
    if key == "mcp_servers" and isinstance(value, dict):
        return True
    if isinstance(value, dict):
        return bool(value) and not any(isinstance(v, dict) for v in value.values())
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def toml_document(data: dict[str, Any]) -> str:
    """``data`` as a TOML document: scalars first, then tables, arrays of tables."""
    lines = []
    tables = []
    for key, value in data.items():
        if _is_table(key, value):
            tables.append((key, value))
        else:
            lines.append(f"{toml_key(key)} = {toml_value(value)}")
    for key, value in tables:
        if isinstance(value, list):
            for item in value:
                lines.append(f"\n[[{toml_key(key)}]]")
                lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in item.items()]
        elif key == "mcp_servers":
            for name, server in value.items():
                if isinstance(server, dict):
                    lines.append(f"\n[{toml_key(key)}.{toml_key(name)}]")
                    lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in server.items()]
                else:
                    lines.append(f"\n[{toml_key(key)}]\n{toml_key(name)} = {toml_value(server)}")
        else:
            lines.append(f"\n[{toml_key(key)}]")
            lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()]
    return "\n".join(lines) + "\n"


RULE_KINDS = ["Bash", "Read", "Edit", "Write", "Grep", "Glob", "read_file", "run_command"]
RULE_SPECIFIERS = [
    "git push:*",
    "rm -rf *",
    "./secrets/**",
    "*.lock",
    ".env",
    "src/*.py",
    "~/x",
    "//etc",
    "app/[id]/page.tsx",
    "a/../b",
    "**",
    "*",
    ":*",
    "echo 'unclosed",
    "a(b)",
    "",
    " ",
    "\x00",
]


@st.composite
def permission_rules(draw: st.DrawFn) -> str:
    """A `[permissions]` rule: `Tool`, `Tool(specifier)`, an MCP name, or a broken one."""
    kind = draw(
        st.one_of(
            st.sampled_from(RULE_KINDS),
            st.sampled_from(
                ["bash", "mcp__github", "mcp__gh__create", "mcp__x__*", "mcp__", "Bash "]
            ),
            odd_text,
        )
    )
    shape = draw(st.sampled_from(["bare", "spec", "spec", "odd", "unbalanced", "nested"]))
    spec = draw(st.one_of(st.sampled_from(RULE_SPECIFIERS), odd_text))
    return {
        "bare": kind,
        "spec": f"{kind}({spec})",
        "odd": draw(odd_text),
        "unbalanced": f"{kind}({spec}" if draw(st.booleans()) else f"{kind}){spec}(",
        "nested": f"{kind}(({spec}))",
    }[shape]


TIER_FIELDS: dict[str, Any] = {
    "name": odd_text,
    "model": st.one_of(
        st.sampled_from(
            [
                "openai/gpt-4o-mini",
                "anthropic/claude-sonnet-4-5",
                "smollm2",
                "/x",
                "scripted/local.yaml",
                "scripted/missing.yaml",
                "scripted/bad.yaml",
                "scripted/binary.yaml",
                "scripted/deep.yaml",
                "scripted/.",
                "scripted/~nouser-xq/x.yaml",
                "scripted/a\x00b.yaml",
            ]
        ),
        odd_text,
    ),
    "price_in": st.one_of(st.floats(), st.integers(-5, 5)),
    "price_out": st.one_of(st.floats(), odd_text),
    "max_tokens": st.one_of(st.integers(-(2**70), 2**70), st.floats()),
    "timeout": st.floats(),
    "api_base": st.one_of(
        st.sampled_from(["http://127.0.0.1:8080/v1", "ftp://x", "http://"]), odd_text
    ),
    "api_key_env": st.one_of(st.sampled_from(["OPENAI_API_KEY", "sk-abc"]), odd_text),
    "step_types": st.lists(st.one_of(st.sampled_from(STEP_TYPES), odd_text), max_size=3),
}
SECTION_FIELDS: dict[str, Any] = {
    "limits": st.dictionaries(
        st.sampled_from(
            ["fix_attempts", "max_retry_attempts", "max_turns", "turn_timeout", "nope"]
        ),
        st.one_of(st.integers(-3, 2**70), st.floats(), odd_text),
        max_size=3,
    ),
    "sandbox": st.dictionaries(
        st.sampled_from(["mode", "network", "pass_env", "max_file_size_mb", "max_memory_mb"]),
        st.one_of(
            st.sampled_from(["bwrap", "none", "docker"]),
            st.lists(st.sampled_from(["PATH", "OPENAI_API_KEY", "DB_PASSWORD"]), max_size=2),
            st.booleans(),
            st.integers(-1, 2**40),
        ),
        max_size=3,
    ),
    "permissions": st.one_of(
        st.fixed_dictionaries(
            {},
            optional={
                "allow": st.lists(permission_rules(), max_size=3),
                "deny": st.lists(permission_rules(), max_size=3),
                "ask": st.lists(permission_rules(), max_size=2),
                "default": st.sampled_from(["allow", "deny", "maybe"]),
            },
        ),
        odd_value,
    ),
    "agents": st.one_of(
        st.fixed_dictionaries(
            {},
            optional={
                "default": odd_text,
                "autodelegate": st.one_of(st.booleans(), odd_text),
                "min_score": st.floats(),
            },
        ),
        odd_value,
    ),
    "mcp_servers": st.one_of(
        st.dictionaries(
            st.one_of(st.sampled_from(["gh", "a b", "x" * 50, ""]), odd_text),
            st.one_of(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "command": odd_text,
                        "args": st.lists(odd_text, max_size=2),
                        "env": st.dictionaries(odd_text, odd_text, max_size=2),
                        "url": odd_text,
                        "timeout": st.floats(),
                    },
                ),
                odd_value,
            ),
            max_size=2,
        ),
        odd_value,
    ),
    "routing": st.dictionaries(st.sampled_from(["medium", "complex", "x"]), odd_text, max_size=2),
    "planning": st.dictionaries(
        st.sampled_from(["tier", "max_steps", "context_tokens"]), odd_scalar, max_size=2
    ),
    "specs": st.dictionaries(
        st.sampled_from(["paths", "top", "check", "check_tier"]), odd_value, max_size=2
    ),
    "environment": st.dictionaries(
        st.sampled_from(["setup", "cache_key", "setup_timeout"]), odd_value, max_size=2
    ),
    "exit_commands": st.dictionaries(
        st.one_of(st.sampled_from(STEP_TYPES), odd_text), odd_value, max_size=2
    ),
    "budget_usd": st.one_of(st.floats(), st.integers(-1, 10)),
    "shell": odd_scalar,
    "tiers": st.lists(odd_value, max_size=2),
}


@st.composite
def config_data(draw: st.DrawFn) -> dict[str, Any]:
    """A merlin.toml as data: tiers and sections, mostly near valid."""
    tiers = []
    for index in range(draw(st.integers(0, 3))):
        base = {"name": f"t{index}", "model": "openai/gpt-4o-mini"}
        tiers.append(_mutated(draw, base, TIER_FIELDS))
    data: dict[str, Any] = {"tiers": tiers} if tiers or draw(st.booleans()) else {}
    for key in draw(st.lists(st.sampled_from(sorted(SECTION_FIELDS)), max_size=4, unique=True)):
        data[key] = draw(SECTION_FIELDS[key])
    return data


TOML_SNIPPETS = [
    "[[tiers]]\nname = 'a'\nmodel = 'openai/x'\n[[tiers]]\nname = 'a'\nmodel = 'openai/y'\n",
    "tiers = 1\n",
    "tiers = []\n",
    "[tiers]\nname = 'a'\n",
    "a = " + "[" * 3000 + "]" * 3000 + "\n",
    "a = " + "{b = " * 3000 + "1" + "}" * 3000 + "\n",
    "[limits]\nmax_turns = 1\n[limits]\nmax_turns = 2\n",
    "price_in = inf\n",
    "[sandbox]\nmode = 'none'\n",
    "[sandbox]\npass_env = ['X', 1]\n",
    "permissions = 'deny'\n",
    "permissions = []\n",
    "[permissions]\nallow = 'Bash'\n",
    "[permissions]\ndeny = [1, 2]\n",
    "[permissions]\ndeny = ['Bash(']\n",
    "mcp_servers = ['a']\n",
    "mcp_servers = 'x'\n",
    "[mcp_servers]\ngh = 1\n",
    "[mcp_servers.gh]\nurl = 1\n",
    "[mcp_servers.gh]\ncommand = 'x'\nurl = 'http://x'\n",
    "agents = 1\n",
    "[agents]\nmin_score = nan\n",
    "[[tiers]]\nname = 'a'\nmodel = 'scripted/binary.yaml'\n",
    "[[tiers]]\nname = 'a'\nmodel = 'scripted/deep.yaml'\n",
    "[[tiers]]\nname = 'a'\nmodel = 'scripted/.'\n",
    "[[tiers]]\nname = 'a'\nmodel = 'scripted/bad.yaml'\n",
    "[[tiers]]\nname = 'a'\nmodel = 'scripted/x\\u0000.yaml'\n",
    "",
    "\ufeff",
    "a = 1\na = 2\n",
    "a = 2026-01-01T00:00:00\n",
    "[x]\n[x.y]\n[x]\n",
]


@st.composite
def config_documents(draw: st.DrawFn) -> Document:
    """A merlin.toml file: TOML of near-valid data, or a known-hard snippet."""
    if draw(st.integers(0, 4)) == 0:
        text = draw(st.sampled_from(TOML_SNIPPETS))
    else:
        text = toml_document(draw(config_data()))
    return Document("merlin.toml", _encoded(draw, _text_mutation(draw, text)))


SCRIPTS = {
    "local.yaml": b"rules: []\n",
    "bad.yaml": b"rules: 1\n",
    "binary.yaml": b"rules: [\xff]\n",
    "deep.yaml": b"rules: " + b"[" * 3000 + b"]" * 3000 + b"\n",
}
"""Scripts the fuzzed configurations' scripted tiers may name, beside the file."""


# ---------------------------------------------------------------- model replies

TOOL_NAMES = ["read_file", "write_file", "edit_file", "list_files", "grep", "finish"]
tool_arguments = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "path": st.one_of(
                st.sampled_from(["a.txt", ".", ".git/config", "../x", "/etc"]), odd_text
            ),
            "content": odd_text,
            "old": odd_text,
            "new": odd_text,
            "pattern": st.one_of(st.sampled_from(["(", "a*", "[z-a]", "*.py"]), odd_text),
            "start_line": st.one_of(st.integers(-(2**70), 2**70), odd_text),
            "end_line": st.one_of(st.integers(-3, 10), st.none()),
            "summary": odd_value,
            "extra": odd_value,
        },
    ),
    odd_value,
)


def _arguments_as_written(draw: st.DrawFn) -> Any:
    """Arguments as a model may send them: JSON text, broken JSON, a dict, a list..."""
    args = draw(tool_arguments)
    form = draw(st.sampled_from(["json", "json", "dict", "broken", "raw"]))
    if form == "json":
        return json.dumps(args)
    if form == "dict":
        return args
    if form == "broken":
        text = json.dumps(args)
        return text[: draw(st.integers(0, len(text)))]
    return draw(odd_value)


@st.composite
def native_tool_calls(draw: st.DrawFn) -> Any:
    """One entry of ``tool_calls``, of any shape a provider or journal might give."""
    call: dict[str, Any] = {"type": "function"}
    if draw(st.integers(0, 4)):
        call["id"] = draw(st.one_of(st.just("call_1"), odd_scalar))
    function: dict[str, Any] = {}
    if draw(st.integers(0, 6)):
        function["name"] = draw(st.one_of(st.sampled_from(TOOL_NAMES), odd_scalar))
    if draw(st.integers(0, 6)):
        function["arguments"] = _arguments_as_written(draw)
    call["function"] = function if draw(st.integers(0, 9)) else draw(odd_value)
    return call if draw(st.integers(0, 14)) else draw(odd_value)


@st.composite
def text_calls(draw: st.DrawFn) -> str:
    """Tool calls written as text, in every format ``merlin_flow.tools.text_calls`` reads."""
    name = draw(st.one_of(st.sampled_from(TOOL_NAMES), odd_text))
    args = _arguments_as_written(draw)
    args_json = args if isinstance(args, str) else json.dumps(args)
    call = json.dumps({"name": name, "arguments": args})
    params = "".join(
        f"<parameter={key}>{draw(odd_text)}</parameter>"
        for key in draw(st.lists(st.sampled_from(["path", "content", "old", "x y"]), max_size=3))
    )
    forms = [
        f"<tool_call>{call}</tool_call>",
        f"<tool_call>{call}",
        f"<tool_call><function={name}>{params}</function></tool_call>",
        f"<function={name}>{params}",
        f"<function={name}>{args_json}</function>",
        f"[TOOL_CALLS] [{call}]",
        f"[TOOL_CALLS]{name}[ARGS]{args_json}",
        f"<|python_tag|>{call}; {call}",
        call,
        f"[{call}, {call}]",
        f"```json\n{call}\n```",
        f"```tool_call\n[{call},]\n```",
        f"<think>{call}</think>",
        "<tool_call>" * 50,
        "[TOOL_CALLS]" + "[" * 5000,
        "{" * 5000,
        "```\n" + "[" * 5000 + "\n```",
        '{"name": "read_file", "arguments": ' + "[" * 5000 + "}",
    ]
    parts = draw(st.lists(st.sampled_from(forms), min_size=1, max_size=3))
    text = draw(st.sampled_from(["", "Sure. ", "\x00"])).join(parts)
    return _text_mutation(draw, text)


@st.composite
def model_replies(draw: st.DrawFn) -> Any:
    """An assistant message as a provider, a journal or a local server might return it."""
    message: dict[str, Any] = {
        "role": draw(st.sampled_from(["assistant", "assistant", "user", None]))
    }
    content = draw(st.one_of(st.none(), odd_text, text_calls(), st.just("x" * 200_000), odd_value))
    if draw(st.integers(0, 5)):
        message["content"] = content
    shape = draw(st.sampled_from(["list", "list", "list", "none", "empty", "odd"]))
    if shape == "list":
        message["tool_calls"] = draw(st.lists(native_tool_calls(), min_size=1, max_size=3))
    elif shape == "empty":
        message["tool_calls"] = []
    elif shape == "odd":
        message["tool_calls"] = None
    return message


# ---------------------------------------------------------------- agent files

AGENT_FIELDS: dict[str, Any] = {
    "name": st.one_of(st.sampled_from(["helper", "Helper", "a b", "-x"]), odd_text),
    "description": odd_text,
    "tools": st.one_of(
        st.lists(
            st.one_of(st.sampled_from(["Read", "Bash", "mcp__gh__x", "read_file"]), odd_text),
            max_size=3,
        ),
        st.sampled_from(["Read, Grep", "", ",,,"]),
        odd_value,
    ),
    "tier": odd_text,
    "model": odd_text,
    "memory": st.one_of(
        st.sampled_from(["memory.md", "../out.md", "~/m.md", "/etc/hostname", "loop.md"]), odd_text
    ),
    "color": odd_value,
}
IMPORT_LINES = [
    "@notes.md",
    "@loop.md",
    "@missing.md",
    "@../outside.md",
    "@~/x.md",
    "@/etc/hostname",
    "@binary.md",
    "@.",
    "@sub",
    "@" + "x" * 300,
    "@a\x00b",
    "@~nouser-xq/x.md",
    "```\n@notes.md\n```",
    "  @notes.md",
]
AGENT_FILE_SNIPPETS = [
    "",
    "---\n",
    "---\n---\n",
    "---\nname: helper\n",
    "---\n- a\n---\nbody",
    "---\n" + ALIAS_BOMB + "name: helper\ndescription: *g\n---\n",
    "---\n" + ALIAS_BOMB + "name: helper\ndescription: d\ntools: *g\n---\n",
    "---\nname: helper\nname: other\ndescription: d\n---\n",
    "---\nname: !!python/object/apply:os.system ['id']\n---\n",
    "---\nname: helper\ndescription: [" + "[" * 3000 + "\n---\n",
    "---\nname: helper\ndescription: " + "[" * 3000 + "]" * 3000 + "\n---\n",
    "\ufeff---\nname: helper\ndescription: d\n...\nbody",
    "---\r\nname: helper\r\ndescription: d\r\n---\r\nbody",
    "---\n? [a]\n: b\n---\n",
    "---\nname: !!timestamp x\ndescription: d\n---\n",
    "---\nname: !!bool x\ndescription: d\n---\n",
]


@st.composite
def agent_documents(draw: st.DrawFn) -> Document:
    """An agent file: front matter of near-valid fields, a body with ``@`` import lines."""
    if draw(st.integers(0, 5)) == 0:
        text = draw(st.sampled_from(AGENT_FILE_SNIPPETS))
    else:
        data = _mutated(draw, {"name": "helper", "description": "Helps."}, AGENT_FIELDS)
        front = _dump_yaml(data) if data else ""
        body = draw(st.lists(st.one_of(st.sampled_from(IMPORT_LINES), odd_text), max_size=4))
        text = "---\n" + front + "---\n" + "\n".join(body) + "\n"
    return Document("helper.md", _encoded(draw, _text_mutation(draw, text)))


AGENT_FOLDER_FILES = {
    "notes.md": b"Some notes.\n@more.md\n",
    "more.md": b"More.\n",
    "loop.md": b"@loop2.md\n",
    "loop2.md": b"@loop.md\n",
    "memory.md": b"Remember.\n",
    "binary.md": b"\xff\xfe\n",
    "sub/x.md": b"x\n",
}
"""Files beside a fuzzed agent file that its imports and memory may name."""


# ---------------------------------------------------------------- checks


def check_message(exc: BaseException, what: str) -> None:
    """The message of an expected error: present, short, no traceback."""
    text = str(exc)
    if not text.strip() or not text.strip().splitlines()[0].strip():
        raise Unexpected(f"{what}: {type(exc).__name__} with an empty first line: {text!r}")
    if len(text) > MAX_MESSAGE:
        raise Unexpected(f"{what}: message of {len(text)} characters: {text[:300]!r}...")
    if "Traceback" in text:
        raise Unexpected(f"{what}: a traceback in the message: {text[:300]!r}")


def expect(
    what: str, run: Callable[[], object], allowed: tuple[type[BaseException], ...]
) -> BaseException | None:
    """Run ``run``: success, or an ``allowed`` error with a good message; else Unexpected."""
    try:
        run()
    except allowed as exc:
        check_message(exc, what)
        return exc
    except Exception as exc:
        tb = "".join(traceback.format_exception(exc, limit=-6))
        raise Unexpected(f"{what}: {type(exc).__name__}: {str(exc)[:300]}\n{tb}") from exc
    return None


def check_tasklist(doc: Document) -> None:
    """``load_tasklist`` on the file: a TaskList or a TaskListError."""
    from merlin_flow.errors import TaskListError
    from merlin_flow.tasklist import load_tasklist

    with tempfile.TemporaryDirectory() as folder:
        path = doc.write(Path(folder))
        expect("load_tasklist", lambda: load_tasklist(path), (TaskListError,))


def check_tasklist_data(data: Any) -> None:
    """``parse_tasklist`` on data: a TaskList or a TaskListError."""
    from merlin_flow.errors import TaskListError
    from merlin_flow.tasklist import parse_tasklist

    expect("parse_tasklist", lambda: parse_tasklist(data, "fuzz"), (TaskListError,))


def check_config(doc: Document, where: str) -> None:
    """``load_config`` with the file as ``--config``, a repository's or the user's file."""
    from merlin_flow.config import load_config
    from merlin_flow.errors import ConfigError

    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder)
        for name, data in SCRIPTS.items():
            (base / name).write_bytes(data)
        doc.write(base)
        path = base / doc.name
        runs: dict[str, Callable[[], object]] = {
            "config": lambda: load_config(config_path=path),
            "repo": lambda: load_config(repo=base),
            "user": lambda: load_config(repo=_repo_beside(base), user_home=base),
        }
        expect(f"load_config ({where})", runs[where], (ConfigError,))


def _repo_beside(base: Path) -> Path:
    """A folder with a valid merlin.toml that allows something: the user's file lies under it."""
    repo = base / "repo"
    repo.mkdir()
    (repo / "merlin.toml").write_text(
        '[[tiers]]\nname = "a"\nmodel = "openai/x"\n[permissions]\nallow = ["Read"]\n'
    )
    return repo


def check_rule(text: str) -> None:
    """``parse_rule``: a Rule or a ValueError naming the rule."""
    from merlin_flow.tool_config import parse_rule

    expect("parse_rule", lambda: parse_rule(text), (ValueError,))


def check_text_calls(content: Any) -> None:
    """``text_tool_calls`` never raises, and returns well-shaped calls of known tools."""
    from merlin_flow.tools.text_calls import text_tool_calls

    try:
        calls = text_tool_calls(content, TOOL_NAMES)
    except Exception as exc:
        tb = "".join(traceback.format_exception(exc, limit=-6))
        raise Unexpected(f"text_tool_calls: {type(exc).__name__}: {exc}\n{tb}") from exc
    for call in calls:
        function = call["function"]
        if function["name"] not in TOOL_NAMES or not isinstance(function["arguments"], str):
            raise Unexpected(f"text_tool_calls: a malformed call {call!r}")


def _toolbox(root: Path) -> Any:
    from merlin_flow.tool_config import Sandbox
    from merlin_flow.tools.toolbox import Toolbox
    from merlin_flow.workspace.checkout import Checkout

    (root / "a.txt").write_text("one\ntwo\n")
    (root / ".git").mkdir(exist_ok=True)
    only = ("read_file", "write_file", "edit_file", "list_files", "grep")  # no run_command
    return Toolbox(Checkout.folder(root, Sandbox(mode="none")), only=only)


def check_toolbox_call(name: Any, arguments: Any) -> None:
    """``Toolbox.call`` answers every call with a text, never raising."""
    with tempfile.TemporaryDirectory() as folder:
        toolbox = _toolbox(Path(folder))
        try:
            reply = toolbox.call(name, arguments)
        except Exception as exc:
            tb = "".join(traceback.format_exception(exc, limit=-6))
            raise Unexpected(f"Toolbox.call: {type(exc).__name__}: {exc}\n{tb}") from exc
        if not isinstance(reply, str):
            raise Unexpected(f"Toolbox.call answered {type(reply).__name__}, not text")


def check_converse(replies: list[Any]) -> None:
    """``converse`` over fuzzed replies: a result or an AgentError, nothing else."""
    from merlin_flow.agents.loop import converse
    from merlin_flow.config import Limits, Tier
    from merlin_flow.errors import AgentError
    from merlin_flow.models.llm import Completion

    tier = Tier(name="fuzz", model="openai/fuzz")

    def call_model(_tier: Any, messages: list[Any], _tools: Any) -> Completion:
        turn = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
        return Completion(replies[turn % len(replies)], 1, 1, None, 0.0, "fuzz")

    with tempfile.TemporaryDirectory() as folder:
        toolbox = _toolbox(Path(folder))
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix it."}]
        expect(
            "converse",
            lambda: converse(
                tier,
                messages,
                toolbox,
                lambda *_: None,
                limits=Limits(max_turns=3),
                call_model=call_model,
                sleep=lambda _seconds: None,
            ),
            (AgentError,),
        )


def check_agent_file(doc: Document, scope: str) -> None:
    """``parse_agent_file``: a definition or an AgentFileError, in a project or user scope."""
    from merlin_flow.agents.definitions import AgentScope, parse_agent_file
    from merlin_flow.errors import AgentFileError

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "repo"
        agents = root / ".merlin" / "agents"
        for name, data in AGENT_FOLDER_FILES.items():
            (agents / name).parent.mkdir(parents=True, exist_ok=True)
            (agents / name).write_bytes(data)
        (Path(folder) / "outside.md").write_text("outside\n")
        path = doc.write(agents)
        expect(
            f"parse_agent_file ({scope})",
            lambda: parse_agent_file(path, AgentScope(scope), root),
            (AgentFileError,),
        )


SHELL_PARTS = [
    "git push",
    "rm -rf /",
    "FOO=1",
    "sudo",
    "env -S 'git push'",
    "timeout 5",
    "xargs",
    "find . -exec rm {} ;",
    "sh -c",
    "bash -c 'eval \"git push\"'",
    "eval",
    "&&",
    "||",
    ";",
    "|",
    "&",
    "\n",
    "(",
    ")",
    "$(",
    "`",
    "<(",
    "<<EOF\nbody $(x)\nEOF\n",
    "<<'EOF'",
    "2>&1",
    "> out",
    "'",
    '"',
    "\\",
    "$CMD",
    "\x00",
    "sh -c '" * 30,
    "$(" * 500,
    "(" * 2000,
]


@st.composite
def shell_commands(draw: st.DrawFn) -> str:
    """Shell text: compound commands, substitutions, wrappers, quotes, unclosed and deep."""
    parts = draw(st.lists(st.one_of(st.sampled_from(SHELL_PARTS), odd_text), max_size=8))
    return " ".join(parts)


def check_shell(command: str) -> None:
    """``split_command``: the simple commands, or a ValueError saying why not."""
    from merlin_flow.tools.shell_commands import split_command

    expect("split_command", lambda: split_command(command), (ValueError,))


@dataclass(frozen=True)
class Property:
    """A check and the strategy of its input, as the fast slice and the full run use them."""

    name: str
    strategy: st.SearchStrategy[Any]
    check: Callable[[Any], None]


PROPERTIES = [
    Property("tasklist file", tasklist_documents(), check_tasklist),
    Property("tasklist data", tasklist_data(), check_tasklist_data),
    Property(
        "merlin.toml",
        st.tuples(config_documents(), st.sampled_from(["config", "repo", "user"])),
        lambda pair: check_config(*pair),
    ),
    Property("permission rule", permission_rules(), check_rule),
    Property("shell command", shell_commands(), check_shell),
    Property("text tool calls", st.one_of(text_calls(), odd_value), check_text_calls),
    Property(
        "toolbox call",
        st.tuples(
            st.one_of(st.sampled_from(TOOL_NAMES), odd_scalar),
            st.one_of(tool_arguments, st.builds(json.dumps, tool_arguments), st.text(max_size=40)),
        ),
        lambda pair: check_toolbox_call(*pair),
    ),
    Property("model replies", st.lists(model_replies(), min_size=1, max_size=3), check_converse),
    Property(
        "agent file",
        st.tuples(agent_documents(), st.sampled_from(["project", "user"])),
        lambda pair: check_agent_file(*pair),
    ),
]
"""Every fuzzed reader, by name."""
