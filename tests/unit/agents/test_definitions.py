"""Agent files: the scopes and their precedence, validation, imports, memory, AGENTS.md."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from merlin_flow.agents.definitions import (
    AgentCatalog,
    AgentDefinition,
    AgentScope,
    agent_dir,
    expand_imports,
    instruction_file,
    instruction_text,
    load_agents,
    parse_agent_file,
)
from merlin_flow.agents.instructions import INSTRUCTION_LIMIT
from merlin_flow.errors import AgentFileError, InputError

PROJECT = "repo/.merlin/agents"
USER = "merlin-home/agents"
STARTERS = ("docs-writer", "refactorer", "reviewer", "test-writer")
SECRET = "TOP-SECRET-CONTENT"
"""What files outside the repository hold: no project agent may read it."""


def agent(name: str, body: str = "Do the work.", **fields: str) -> str:
    """An agent file's text: front matter with ``name``, a description and ``fields``."""
    lines = [f"name: {name}", f"description: {name} does things", *map(": ".join, fields.items())]
    return "---\n" + "\n".join(lines) + "\n---\n" + body + "\n"


@dataclass
class Case:
    files: dict[str, str]
    """Files to write, by path under the test's folder (``userhome/`` is $HOME)."""
    agents: dict[str, str] = field(default_factory=dict)
    """The effective agents expected (besides the starters), by name: their scope."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Each skipped file's name: a piece of its problem."""
    warnings: tuple[str, ...] = ()
    prompts: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Pieces each named agent's prompt must hold."""


CASES = {
    "project-scope": Case({f"{PROJECT}/a.md": agent("a")}, {"a": "project"}),
    "user-scope": Case({f"{USER}/u.md": agent("u")}, {"u": "user"}),
    "project-over-user": Case(
        {f"{PROJECT}/a.md": agent("a", "from the project"), f"{USER}/a.md": agent("a", "mine")},
        {"a": "project"},
        prompts={"a": ("from the project",)},
    ),
    "user-over-builtin": Case(
        {f"{USER}/reviewer.md": agent("reviewer", "my reviewer")},
        {"reviewer": "user"},
        prompts={"reviewer": ("my reviewer",)},
    ),
    "project-over-builtin": Case(
        {f"{PROJECT}/test-writer.md": agent("test-writer")}, {"test-writer": "project"}
    ),
    "missing-name": Case(
        {f"{PROJECT}/a.md": "---\ndescription: d\n---\nbody\n"},
        skipped={"a.md": "required field `name` is missing"},
    ),
    "missing-description": Case(
        {f"{PROJECT}/a.md": "---\nname: a\n---\nbody\n"},
        skipped={"a.md": "required field `description` is missing"},
    ),
    "unknown-key-warns-and-loads": Case(
        {f"{PROJECT}/a.md": agent("a", provider="gemini")},
        {"a": "project"},
        warnings=("unknown key(s) ignored: provider",),
    ),
    "invalid-yaml": Case(
        {f"{PROJECT}/a.md": "---\nname: [a\ndescription: d\n---\nbody\n"},
        skipped={"a.md": "invalid YAML in the front matter at line"},
    ),
    "no-front-matter": Case(
        {f"{PROJECT}/a.md": "# Just a prompt\n"}, skipped={"a.md": "no front matter"}
    ),
    "front-matter-not-a-mapping": Case(
        {f"{PROJECT}/a.md": "---\n- a\n- b\n---\nbody\n"}, skipped={"a.md": "not a mapping"}
    ),
    "tier-and-model": Case(
        {f"{PROJECT}/a.md": agent("a", tier="fast", model="openai/gpt-4o")},
        skipped={"a.md": "both tier ('fast') and model ('openai/gpt-4o') are set"},
    ),
    "wrong-type": Case(
        {f"{PROJECT}/a.md": agent("a", tools="5")}, skipped={"a.md": "`tools` must be a list"}
    ),
    "description-not-text": Case(
        {f"{PROJECT}/a.md": "---\nname: a\ndescription: [x, y]\n---\nbody\n"},
        skipped={"a.md": "`description` must be text, not list"},
    ),
    "bad-name": Case(
        {f"{PROJECT}/a.md": agent("Code Reviewer")},
        skipped={"a.md": "'Code Reviewer' is not a valid agent name"},
    ),
    "name-differs-from-file": Case(
        {f"{PROJECT}/a.md": agent("b")},
        {"b": "project"},
        warnings=("name 'b' differs from the file name a.md",),
    ),
    "same-name-twice-in-a-scope": Case(
        {f"{PROJECT}/a.md": agent("a", "first"), f"{PROJECT}/b.md": agent("a", "second")},
        {"a": "project"},
        skipped={"b.md": "a.md of the same scope defines 'a' already"},
        prompts={"a": ("first",)},
    ),
    "tools-as-a-list-or-a-string": Case(
        {
            f"{PROJECT}/a.md": agent("a", tools="[read_file, grep, mcp__github__get_issue]"),
            f"{PROJECT}/b.md": agent("b", tools="Read, Grep, Bash"),
        },
        {"a": "project", "b": "project"},
    ),
    "unknown-tool-warns": Case(
        {f"{PROJECT}/a.md": agent("a", tools="[read_file, WebFetch]")},
        {"a": "project"},
        warnings=("unknown tool name(s) WebFetch",),
    ),
    "empty-body-warns": Case(
        {f"{PROJECT}/a.md": agent("a", body="")},
        {"a": "project"},
        warnings=("the body is empty",),
    ),
    "imports-expanded-recursively": Case(
        {
            f"{PROJECT}/a.md": agent("a", "Intro.\n@shared/b.md\nOutro."),
            f"{PROJECT}/shared/b.md": "B says hi.\n@c.md\n",
            f"{PROJECT}/shared/c.md": "C says hi.\n",
        },
        {"a": "project"},
        prompts={"a": ("Intro.\nB says hi.\nC says hi.\nOutro.",)},
    ),
    "import-lines-in-code-fences-stay": Case(
        {f"{PROJECT}/a.md": agent("a", "```python\n@dataclass\nclass A: ...\n```")},
        {"a": "project"},
        prompts={"a": ("@dataclass\nclass A",)},
    ),
    "import-cycle": Case(
        {
            f"{PROJECT}/a.md": agent("a", "@shared/b.md"),
            f"{PROJECT}/shared/b.md": "@../a.md\n",
        },
        skipped={"a.md": "import cycle: a.md -> shared/b.md -> a.md"},
    ),
    "missing-import": Case(
        {f"{PROJECT}/a.md": agent("a", "@nothere.md")},
        skipped={"a.md": "@nothere.md: "},
    ),
    "memory-appended": Case(
        {f"{PROJECT}/a.md": agent("a", memory="notes/a.md"), f"{PROJECT}/notes/a.md": "Remember."},
        {"a": "project"},
        prompts={"a": ("Do the work.\n\n## Memory\n\nRemember.",)},
    ),
    "memory-imports-expanded": Case(
        {
            f"{PROJECT}/a.md": agent("a", memory="notes/a.md"),
            f"{PROJECT}/notes/a.md": "Remember.\n@more.md\n",
            f"{PROJECT}/notes/more.md": "And this.",
        },
        {"a": "project"},
        prompts={"a": ("## Memory\n\nRemember.\nAnd this.",)},
    ),
    "missing-memory-file": Case(
        {f"{PROJECT}/a.md": agent("a", memory="notes.md")},
        skipped={"a.md": "the memory file: "},
    ),
    "project-imports-from-home-refused": Case(
        {f"{PROJECT}/a.md": agent("a", "@~/x.md"), "userhome/x.md": SECRET},
        skipped={"a.md": "~/x.md: a repository's file may not name the home folder"},
    ),
    "project-imports-dotdot-refused": Case(
        {f"{PROJECT}/a.md": agent("a", "@../../../x.md"), "x.md": SECRET},
        skipped={"a.md": "../../../x.md leads outside the repository"},
    ),
    "project-memory-outside-refused": Case(
        {f"{PROJECT}/a.md": agent("a", memory="../../../x.md"), "x.md": SECRET},
        skipped={"a.md": "../../../x.md leads outside the repository"},
    ),
    "project-memory-in-home-refused": Case(
        {f"{PROJECT}/a.md": agent("a", memory="~/x.md"), "userhome/x.md": SECRET},
        skipped={"a.md": "may not name the home folder"},
    ),
    "user-imports-from-home": Case(
        {
            f"{USER}/u.md": agent("u", "@~/snippets/s.md", memory="~/m.md"),
            "userhome/snippets/s.md": "Snippet.",
            "userhome/m.md": "Memo.",
        },
        {"u": "user"},
        prompts={"u": ("Snippet.", "## Memory\n\nMemo.")},
    ),
    "user-imports-outside-its-folder": Case(
        {f"{USER}/u.md": agent("u", "@../../x.md"), "x.md": "Shared."},
        {"u": "user"},
        prompts={"u": ("Shared.",)},
    ),
}


@pytest.fixture
def place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder holding repo/, merlin-home/ and userhome/ (which is $HOME)."""
    for folder in ("repo", "merlin-home", "userhome"):
        (tmp_path / folder).mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "userhome"))
    return tmp_path


def write(place: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = place / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def load(place: Path) -> AgentCatalog:
    return load_agents(place / "repo", place / "merlin-home")


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_loading(place: Path, case: Case) -> None:
    write(place, {f"{PROJECT}/ok.md": agent("ok"), **case.files})
    catalog = load(place)

    assert catalog.agents["ok"].scope is AgentScope.PROJECT  # a bad file stops no other
    found = {name: a.scope.value for name, a in catalog.agents.items() if name != "ok"}
    expected = {name: "builtin" for name in STARTERS} | case.agents
    assert found == expected
    problems = {Path(file).name: problem for file, problem in catalog.skipped}
    assert set(problems) == set(case.skipped), catalog.skipped
    for name, piece in case.skipped.items():
        assert piece in problems[name]
    warnings = [w for a in catalog.agents.values() for w in a.warnings]
    assert len(warnings) == len(case.warnings), warnings
    for piece in case.warnings:
        assert any(piece in w for w in warnings), warnings
    for name, pieces in case.prompts.items():
        for piece in pieces:
            assert piece in catalog.agents[name].prompt
    for piece in (SECRET,):
        assert all(piece not in a.prompt for a in catalog.agents.values())


def test_a_higher_scope_hides_the_lower_ones_which_stay_visible(place: Path) -> None:
    write(
        place,
        {f"{PROJECT}/reviewer.md": agent("reviewer"), f"{USER}/reviewer.md": agent("reviewer")},
    )
    catalog = load(place)
    assert catalog.agents["reviewer"].file == str(place / PROJECT / "reviewer.md")
    assert [(a.scope.value, a.name) for a in catalog.shadowed] == [
        ("user", "reviewer"),
        ("builtin", "reviewer"),
    ]
    assert [a.scope.value for a in catalog.definitions("reviewer")] == [
        "project",
        "user",
        "builtin",
    ]


def test_without_a_project_only_the_user_and_builtin_scopes_load(place: Path) -> None:
    write(place, {f"{PROJECT}/a.md": agent("a"), f"{USER}/u.md": agent("u")})
    catalog = load_agents(None, place / "merlin-home")
    assert set(catalog.agents) == {"u", *STARTERS}


def test_the_parsed_definition(place: Path) -> None:
    text = (
        "---\nname: a\ndescription: >\n  Reviews\n  diffs.\ntools: [read_file, grep]\ntier: fast\n"
    )
    write(place, {f"{PROJECT}/a.md": text + "---\n\nBe careful.\n"})
    parsed = parse_agent_file(place / PROJECT / "a.md", AgentScope.PROJECT, place / "repo")
    assert parsed == AgentDefinition(
        name="a",
        description="Reviews diffs.",
        prompt="Be careful.",
        tools=("read_file", "grep"),
        tier="fast",
        model=None,
        memory=None,
        scope=AgentScope.PROJECT,
        file=str(place / PROJECT / "a.md"),
    )


def test_absent_tools_mean_every_tool_and_an_empty_list_none(place: Path) -> None:
    write(place, {f"{PROJECT}/a.md": agent("a"), f"{PROJECT}/b.md": agent("b", tools="[]")})
    catalog = load(place)
    assert catalog.agents["a"].tools is None
    assert catalog.agents["b"].tools == ()
    assert catalog.agents["a"].model is None
    assert catalog.agents["a"].tier is None


def test_crlf_and_a_byte_order_mark_are_read(place: Path) -> None:
    text = "\ufeff---\r\nname: a\r\ndescription: d\r\n---\r\nBody.\r\n"
    write(place, {f"{PROJECT}/a.md": text})
    assert load(place).agents["a"].prompt == "Body."


def test_a_project_file_symlinked_out_of_the_repository_is_refused(place: Path) -> None:
    write(place, {"outside/evil.md": agent("evil"), "outside/x.md": SECRET})
    agents = place / PROJECT
    agents.mkdir(parents=True)
    (agents / "evil.md").symlink_to(place / "outside" / "evil.md")
    (agents / "link").symlink_to(place / "outside")
    write(place, {f"{PROJECT}/a.md": agent("a", "@link/x.md")})
    catalog = load(place)
    problems = dict((Path(f).name, p) for f, p in catalog.skipped)
    assert "the agent file evil.md leads outside the repository" in problems["evil.md"]
    assert "link/x.md leads outside the repository" in problems["a.md"]
    assert str(place / "outside" / "x.md") in problems["a.md"]  # the path named


def test_nested_yaml_aliases_are_refused_with_a_short_message(place: Path) -> None:
    levels = ["a: &a [x, x, x, x, x, x, x, x]"]
    for n, letter in enumerate("bcdefghij"):
        previous = "abcdefghij"[n]
        levels.append(f"{letter}: &{letter} [" + ", ".join([f"*{previous}"] * 8) + "]")
    front = "\n".join(["name: a", "description: d", *levels, "tools: [*j, *j]"])
    write(place, {f"{PROJECT}/a.md": f"---\n{front}\n---\nbody\n"})
    (problem,) = [problem for _, problem in load(place).skipped]
    assert problem.startswith("`tools` must be a list of tool names")
    assert len(problem) < 200


def test_a_user_file_may_be_a_symlink(place: Path) -> None:
    write(place, {"dotfiles/u.md": agent("u")})
    (place / USER).mkdir(parents=True)
    (place / USER / "u.md").symlink_to(place / "dotfiles" / "u.md")
    assert load(place).agents["u"].scope is AgentScope.USER


def test_editor_lock_files_are_not_read(place: Path) -> None:
    write(place, {f"{PROJECT}/.#a.md": "junk", f"{PROJECT}/notes.txt": "junk"})
    assert load(place).skipped == []


def test_the_starter_agents_load_cleanly_and_the_reviewer_writes_nothing(place: Path) -> None:
    catalog = load_agents(None, place / "merlin-home")
    assert sorted(catalog.agents) == list(STARTERS)
    assert catalog.warnings == []
    assert catalog.agents["reviewer"].tools == ("read_file", "list_files", "grep", "run_command")
    for starter in catalog.agents.values():
        assert starter.scope is AgentScope.BUILTIN
        for heading in ("## Responsibilities", "## How to work", "## Guardrails"):
            assert heading in starter.prompt, (starter.name, heading)


def test_get_names_the_known_agents_and_a_file_that_did_not_load(place: Path) -> None:
    write(place, {f"{PROJECT}/broken.md": "no front matter"})
    catalog = load(place)
    with pytest.raises(AgentFileError) as raised:
        catalog.get("broken")
    message = str(raised.value)
    assert "no agent named 'broken'" in message
    assert "broken.md did not load" in message
    assert "docs-writer, refactorer, reviewer, test-writer" in message
    assert isinstance(raised.value, InputError)
    assert raised.value.exit_code == 2


def test_warnings_name_each_file(place: Path) -> None:
    write(place, {f"{PROJECT}/a.md": agent("a", color="red"), f"{USER}/b.md": "nothing"})
    warnings = load(place).warnings
    assert len(warnings) == 2
    assert f"{place / USER / 'b.md'}: skipped: no front matter" in warnings[0]
    assert warnings[1].startswith(f"{place / PROJECT / 'a.md'}: unknown key(s) ignored: color")


def test_a_record_round_trips_through_json(place: Path) -> None:
    write(place, {f"{PROJECT}/a.md": agent("a", tools="[grep]", model="ollama/x", color="red")})
    original = load(place).agents["a"]
    again = AgentDefinition.from_record(json.loads(json.dumps(original.to_record())))
    assert again == original
    assert AgentDefinition.from_record({**original.to_record(), "tools": None}).tools is None


def test_a_damaged_record_is_an_agent_file_error() -> None:
    with pytest.raises(AgentFileError, match="stored agent record is damaged"):
        AgentDefinition.from_record({"name": "a", "scope": "galaxy"})


def test_agent_dir(place: Path) -> None:
    home = place / "merlin-home"
    assert agent_dir(AgentScope.PROJECT, place / "repo", home) == place / PROJECT
    assert agent_dir(AgentScope.USER, None, home) == home / "agents"
    assert (agent_dir(AgentScope.BUILTIN, None, home) / "reviewer.md").is_file()
    with pytest.raises(AgentFileError, match="need a repository"):
        agent_dir(AgentScope.PROJECT, None, home)


def test_a_project_file_needs_its_root(place: Path) -> None:
    write(place, {f"{PROJECT}/a.md": agent("a")})
    with pytest.raises(AgentFileError, match="needs its repository root"):
        parse_agent_file(place / PROJECT / "a.md", AgentScope.PROJECT, None)


def test_expand_imports_names_the_cycle(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("A\n@b.md\n")
    (tmp_path / "b.md").write_text("B\n@a.md\n")
    with pytest.raises(AgentFileError) as raised:
        expand_imports("A\n@b.md\n", tmp_path / "a.md", confine_to=None)
    assert str(raised.value) == "import cycle: a.md -> b.md -> a.md"


def test_expand_imports_stops_deep_chains(tmp_path: Path) -> None:
    for n in range(15):
        (tmp_path / f"{n}.md").write_text(f"@{n + 1}.md\n")
    (tmp_path / "15.md").write_text("end\n")
    with pytest.raises(AgentFileError, match="imports nest deeper than 10"):
        expand_imports("@0.md\n", tmp_path / "top.md", confine_to=None)


def test_expand_imports_leaves_indented_and_inline_at_signs(tmp_path: Path) -> None:
    text = "    @indented.md\nmail me @ home\n@two words.md\n"
    assert expand_imports(text, tmp_path / "a.md", confine_to=tmp_path) == text


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"AGENTS.md": "Use tabs.", "MERLIN.md": "Use spaces."}, "Use tabs."),
        ({"MERLIN.md": "Use spaces."}, "Use spaces."),
        ({}, ""),
        ({"AGENTS.md": "Rules:\n@docs/style.md\nEnd.", "docs/style.md": "Short names."},
         "Rules:\nShort names.\nEnd."),
    ],
    ids=["agents-md-first", "merlin-md-else", "none", "imports"],
)  # fmt: skip
def test_instruction_text(tmp_path: Path, files: dict[str, str], expected: str) -> None:
    write(tmp_path, files)
    assert instruction_text(tmp_path) == expected
    names = [name for name in ("AGENTS.md", "MERLIN.md") if name in files]
    assert instruction_file(tmp_path) == (names[0] if names else None)


def test_instruction_text_leaves_out_a_bad_import_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    write(tmp_path, {"home/x.md": SECRET, "outside.md": SECRET})
    write(tmp_path, {"repo/AGENTS.md": "Before.\n@~/x.md\n@../outside.md\n@gone.md\nAfter.\n"})
    text = instruction_text(tmp_path / "repo")
    assert text.startswith("Before.\n(@~/x.md left out: ~/x.md: a repository's file may not")
    assert "(@../outside.md left out: ../outside.md leads outside the repository" in text
    assert "(@gone.md left out: @gone.md: " in text
    assert text.endswith("After.\n")
    assert SECRET not in text


def test_instruction_text_imports_nothing_permissions_hide_from_the_agent(
    tmp_path: Path,
) -> None:
    """`Read(./secrets/**)`: `@secrets/key.txt` in AGENTS.md carries no key into the prompt."""
    from merlin_flow.tool_config import PermissionRules
    from merlin_flow.tools.permissions import Permissions

    write(tmp_path, {"repo/secrets/key.txt": SECRET, "repo/docs/ok.md": "Fine.\n"})
    write(tmp_path, {"repo/AGENTS.md": "Before.\n@secrets/key.txt\n@docs/ok.md\nAfter.\n"})
    root = tmp_path / "repo"
    rules = Permissions(PermissionRules(deny=["Read(./secrets/**)"]), root=root)
    text = instruction_text(root, rules.path_readable)
    assert SECRET not in text
    assert (
        "(@secrets/key.txt left out: @secrets/key.txt: [permissions] hide secrets/key.txt" in text
    )
    assert "Fine.\n" in text
    assert SECRET in instruction_text(root)  # without the rules, as before
    hidden = Permissions(PermissionRules(deny=["Read(./AGENTS.md)"]), root=root)
    assert instruction_text(root, hidden.path_readable).startswith("(AGENTS.md left out:")


def test_instruction_text_is_capped_with_a_note(tmp_path: Path) -> None:
    write(tmp_path, {"AGENTS.md": "x" * (INSTRUCTION_LIMIT + 500)})
    text = instruction_text(tmp_path)
    assert text.startswith("x" * INSTRUCTION_LIMIT + "\n\n[AGENTS.md cut: 20,500 characters")
    assert "x" * (INSTRUCTION_LIMIT + 1) not in text


def test_instruction_file_symlinked_out_of_the_repository_is_left_out(tmp_path: Path) -> None:
    write(tmp_path, {"secret.md": SECRET, "repo/README.md": ""})
    (tmp_path / "repo" / "AGENTS.md").symlink_to(tmp_path / "secret.md")
    text = instruction_text(tmp_path / "repo")
    assert text.startswith("(AGENTS.md left out: AGENTS.md leads outside the repository")
    assert SECRET not in text
