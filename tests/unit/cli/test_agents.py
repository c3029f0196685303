"""`merlin agents`: list, show, create, edit, rm, init and run through the real CLI."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from merlin_flow.cli.app import app
from merlin_flow.resources import resource_dir
from tests.conftest import git, make_repo

runner = CliRunner()
STARTERS = ["docs-writer", "refactorer", "reviewer", "test-writer"]


@pytest.fixture
def repo(tmp_path: Path, merlin_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A git work tree (its .git is all that is needed), and no editor configured."""
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    (tmp_path / "repo" / "src").mkdir()
    monkeypatch.delenv("VISUAL", raising=False)
    monkeypatch.delenv("EDITOR", raising=False)
    return tmp_path / "repo"


def merlin(*args: str) -> Result:
    return runner.invoke(app, ["agents", *args])


def squash(text: str) -> str:
    return " ".join(text.split())


def agent_file(folder: Path, name: str, extra: str = "", body: str = "Work.") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.md"
    path.write_text(f"---\nname: {name}\ndescription: {name} agent\n{extra}---\n{body}\n")
    return path


def test_list_json_gives_the_contract_fields(repo: Path, merlin_home: Path) -> None:
    agent_file(repo / ".merlin/agents", "reviewer", "tier: premium\n")
    agent_file(repo / ".merlin/agents", "odd", "tools: [read_file]\ncolor: red\n")
    (repo / ".merlin/agents/broken.md").write_text("no front matter here")
    agent_file(merlin_home / "agents", "mine", "model: ollama/qwen\n")

    result = merlin("list", "--json", "--repo", str(repo))

    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    by_name = {entry["name"]: entry for entry in data["agents"]}
    assert sorted(by_name) == [
        "docs-writer",
        "mine",
        "odd",
        "refactorer",
        "reviewer",
        "test-writer",
    ]
    assert by_name["reviewer"] == {
        "name": "reviewer",
        "description": "reviewer agent",
        "scope": "project",
        "file": str(repo / ".merlin/agents/reviewer.md"),
        "tools": None,
        "model": None,
        "tier": "premium",
        "warnings": [],
    }
    assert by_name["mine"]["scope"] == "user"
    assert by_name["mine"]["model"] == "ollama/qwen"
    assert by_name["odd"]["tools"] == ["read_file"]
    assert by_name["odd"]["warnings"] == [
        "unknown key(s) ignored: color (known: name, description, tools, tier, model, memory)"
    ]
    assert by_name["test-writer"]["scope"] == "builtin"
    assert [entry["file"] for entry in data["skipped"]] == [str(repo / ".merlin/agents/broken.md")]
    assert "no front matter" in data["skipped"][0]["problem"]
    builtin = resource_dir("config") / "agents" / "reviewer.md"
    assert data["shadowed"] == [{"name": "reviewer", "scope": "builtin", "file": str(builtin)}]


def test_list_shows_a_table_the_warnings_and_the_skipped_files(repo: Path) -> None:
    agent_file(repo / ".merlin/agents", "odd", "color: red\n")
    (repo / ".merlin/agents/broken.md").write_text("---\nname: broken\n---\n")
    result = merlin("list", "--repo", str(repo))
    assert result.exit_code == 0, result.output
    cells = [
        [cell.strip() for cell in line.strip("│").split("│")]
        for line in result.stdout.splitlines()
        if line.startswith("│")
    ]
    rows = {row[0]: row for row in cells if row[0]}  # a row's first line (a long cell folds)
    assert rows["odd"] == ["odd", "project", "all", "-", "odd agent", "!"]
    assert rows["reviewer"][:2] == ["reviewer", "builtin"]
    assert rows["reviewer"][2].startswith("read_file,")
    assert rows["reviewer"][-1] == ""
    assert "broken.md: skipped: the required field `description` is missing" in result.output
    assert "odd.md: unknown key(s) ignored: color" in squash(result.output)


def test_list_from_a_subfolder_finds_the_projects_agents(repo: Path) -> None:
    agent_file(repo / ".merlin/agents", "local")
    result = merlin("list", "--json", "--repo", str(repo / "src"))
    assert result.exit_code == 0, result.output
    assert "local" in [entry["name"] for entry in json.loads(result.stdout)["agents"]]


def test_list_for_a_step_ranks_by_score(repo: Path) -> None:
    result = merlin("list", "--json", "--for", "write tests for the parser", "--repo", str(repo))
    assert result.exit_code == 0, result.output
    agents = json.loads(result.stdout)["agents"]
    assert agents[0]["name"] == "test-writer"
    assert agents[0]["score"] > 0.5
    assert [entry["score"] for entry in agents[1:]] == [0, 0, 0]


def test_show_prints_the_definition_and_the_final_prompt(repo: Path) -> None:
    folder = repo / ".merlin/agents"
    agent_file(folder, "reviewer", "tools: [grep]\nmemory: notes.md\n", body="Look.\n@rules.md")
    (folder / "rules.md").write_text("Rule one.\n")
    (folder / "notes.md").write_text("Noted.\n")
    result = merlin("show", "reviewer", "--repo", str(repo))
    assert result.exit_code == 0, result.output
    assert "scope: project" in result.stdout
    assert "tools: grep" in result.stdout
    assert "hides: the builtin agent in" in result.stdout
    assert result.stdout.endswith("Look.\nRule one.\n\n## Memory\n\nNoted.\n")

    as_json = json.loads(merlin("show", "reviewer", "--json", "--repo", str(repo)).stdout)
    assert as_json["prompt"] == "Look.\nRule one.\n\n## Memory\n\nNoted."
    assert as_json["memory"] == "notes.md"


def test_show_an_unknown_agent_names_the_known_ones(repo: Path) -> None:
    result = merlin("show", "nobody", "--repo", str(repo))
    assert result.exit_code == 2
    assert (
        "no agent named 'nobody'; the agents: docs-writer, refactorer, reviewer, test-writer"
        in (squash(result.output))
    )


def test_create_writes_a_template_that_loads(repo: Path) -> None:
    result = merlin(
        "create", "db-expert", "--description", "Alembic: migrations", "--repo", str(repo)
    )
    assert result.exit_code == 0, result.output
    path = repo / ".merlin/agents/db-expert.md"
    assert f"created {path}" in result.stdout
    listed = json.loads(merlin("list", "--json", "--repo", str(repo)).stdout)
    created = next(entry for entry in listed["agents"] if entry["name"] == "db-expert")
    assert created["description"] == "Alembic: migrations"
    assert created["warnings"] == []
    assert listed["skipped"] == []
    assert "## Guardrails" in path.read_text()


def test_create_refuses_an_existing_agent_and_a_bad_name(repo: Path) -> None:
    assert merlin("create", "mine", "--repo", str(repo)).exit_code == 0
    before = (repo / ".merlin/agents/mine.md").read_text()
    again = merlin("create", "mine", "--description", "other", "--repo", str(repo))
    assert again.exit_code == 2
    assert "the project agent mine exists already" in squash(again.output)
    assert (repo / ".merlin/agents/mine.md").read_text() == before
    bad = merlin("create", "My Agent", "--repo", str(repo))
    assert bad.exit_code == 2
    assert "'My Agent' is not a valid agent name" in squash(bad.output)


def test_create_in_the_user_scope(repo: Path, merlin_home: Path) -> None:
    result = merlin("create", "reviewer", "--scope", "user", "--repo", str(repo))
    assert result.exit_code == 0, result.output
    assert (merlin_home / "agents/reviewer.md").is_file()
    assert "it hides the builtin reviewer" in result.stdout
    assert not (repo / ".merlin").exists()


def editor(tmp_path: Path, script: str) -> str:
    path = tmp_path / "editor.sh"
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_edit_opens_the_file_in_the_editor_and_checks_it(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = agent_file(repo / ".merlin/agents", "mine")
    monkeypatch.setenv("EDITOR", editor(tmp_path, 'echo "Edited." >> "$1"'))
    result = merlin("edit", "mine", "--repo", str(repo))
    assert result.exit_code == 0, result.output
    assert path.read_text().endswith("Work.\nEdited.\n")
    assert f"{path}: the agent mine loads" in result.stdout


def test_edit_prefers_visual_and_warns_when_the_file_no_longer_loads(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = agent_file(repo / ".merlin/agents", "mine")
    monkeypatch.setenv("EDITOR", "false")
    monkeypatch.setenv("VISUAL", editor(tmp_path, 'printf "broken" > "$1"'))
    result = merlin("edit", "mine", "--repo", str(repo))
    assert result.exit_code == 0, result.output
    assert path.read_text() == "broken"
    assert f"{path} does not load: no front matter" in squash(result.output)


def test_edit_reaches_a_file_that_does_not_load(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = repo / ".merlin/agents/mine.md"
    path.parent.mkdir(parents=True)
    path.write_text("broken")
    fix = "printf -- '---\\nname: mine\\ndescription: fixed\\n---\\nWork.\\n' > \"$1\""
    monkeypatch.setenv("EDITOR", editor(tmp_path, fix))
    result = merlin("edit", "mine", "--repo", str(repo))
    assert result.exit_code == 0, result.output
    assert "the agent mine loads" in result.stdout


@pytest.mark.parametrize(
    ("setup", "name", "message"),
    [
        ("none", "mine", "neither VISUAL nor EDITOR is set"),
        ("true", "reviewer", "reviewer is a builtin agent"),
        ("true", "nobody", "no agent named 'nobody'"),
        ("false", "mine", "the editor 'false' exited with code 1"),
        ("/no/such/editor", "mine", "cannot start the editor '/no/such/editor'"),
    ],
)
def test_edit_refusals(
    repo: Path, monkeypatch: pytest.MonkeyPatch, setup: str, name: str, message: str
) -> None:
    agent_file(repo / ".merlin/agents", "mine")
    if setup != "none":
        monkeypatch.setenv("EDITOR", setup)
    result = merlin("edit", name, "--repo", str(repo))
    assert result.exit_code == (1 if setup == "false" else 2), result.output
    assert message in squash(result.output)


def test_rm_asks_for_a_scope_when_both_have_the_agent(repo: Path, merlin_home: Path) -> None:
    project = agent_file(repo / ".merlin/agents", "mine")
    user = agent_file(merlin_home / "agents", "mine")

    ambiguous = merlin("rm", "mine", "--repo", str(repo))
    assert ambiguous.exit_code == 2
    assert "say which to remove with --scope project or --scope user" in squash(ambiguous.output)
    assert project.exists()
    assert user.exists()

    removed = merlin("rm", "mine", "--scope", "project", "--repo", str(repo))
    assert removed.exit_code == 0, removed.output
    assert not project.exists()
    assert user.exists()
    assert f"in effect now: the user agent mine ({user})" in squash(removed.stdout)


def test_rm_removes_a_file_that_does_not_load(repo: Path) -> None:
    path = repo / ".merlin/agents/mine.md"
    path.parent.mkdir(parents=True)
    path.write_text("broken")
    result = merlin("rm", "mine", "--repo", str(repo))
    assert result.exit_code == 0, result.output
    assert not path.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["reviewer"], "reviewer is a builtin agent, shipped with merlin, and cannot be"),
        (["mine", "--scope", "user"], "no user agent mine; it is defined in: project"),
        (["nobody"], "no agent named 'nobody'"),
        (["reviewer", "--scope", "builtin"], "Invalid value for '--scope'"),
    ],
)
def test_rm_refusals(repo: Path, args: list[str], message: str) -> None:
    agent_file(repo / ".merlin/agents", "mine")
    result = merlin("rm", *args, "--repo", str(repo))
    assert result.exit_code == 2, result.output
    assert message in squash(result.output)
    assert (repo / ".merlin/agents/mine.md").exists()


def test_init_copies_the_starters_and_keeps_what_exists(repo: Path) -> None:
    folder = repo / ".merlin/agents"
    first = merlin("init", "--repo", str(repo))
    assert first.exit_code == 0, first.output
    assert sorted(p.stem for p in folder.glob("*.md")) == STARTERS
    (folder / "reviewer.md").write_text("mine now")

    second = merlin("init", "--repo", str(repo))
    assert second.exit_code == 0, second.output
    assert f"kept {folder / 'reviewer.md'}: it exists (--force overwrites it)" in second.stdout
    assert (folder / "reviewer.md").read_text() == "mine now"

    forced = merlin("init", "--force", "--repo", str(repo))
    assert forced.exit_code == 0, forced.output
    assert f"overwrote {folder / 'reviewer.md'}" in forced.stdout
    assert (folder / "reviewer.md").read_text().startswith("---\nname: reviewer\n")
    listed = json.loads(merlin("list", "--json", "--repo", str(repo)).stdout)
    assert {entry["scope"] for entry in listed["agents"]} == {"project"}


def test_init_into_the_user_scope(repo: Path, merlin_home: Path) -> None:
    result = merlin("init", "--scope", "user", "--repo", str(repo))
    assert result.exit_code == 0, result.output
    assert sorted(p.stem for p in (merlin_home / "agents").glob("*.md")) == STARTERS


def test_a_repo_that_is_not_a_folder_is_an_input_error(tmp_path: Path) -> None:
    result = merlin("list", "--repo", str(tmp_path / "nowhere"))
    assert result.exit_code == 2
    assert "no such folder" in squash(result.output)


RUN_KEYS = {
    "agent", "scope", "file", "tier", "system_prompt", "user_prompt", "tools", "permissions",
    "warnings",
}  # fmt: skip
DENY_TOML = '[permissions]\ndeny = ["Read(./secrets/**)", "Bash(git push:*)"]\n'


@pytest.fixture
def guarded_repo(tmp_path: Path) -> Path:
    """A Python project whose merlin.toml denies reading secrets/ and `git push`."""
    return make_repo(
        tmp_path / "guarded",
        {
            "pyproject.toml": '[project]\nname = "sample"\nversion = "0"\n',
            "app.py": "def answer():\n    return 41\n",
            "secrets/key.txt": "hunter2\n",
            "merlin.toml": DENY_TOML,
            "AGENTS.md": "Run the tests with pytest.\n",
        },
    )


def test_run_dry_run_of_the_reviewer_offers_no_tool_that_writes(
    repo: Path, merlin_home: Path
) -> None:
    result = merlin("run", "reviewer", "Review app.py.", "--dry-run", "--repo", str(repo))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "offered: read_file, list_files, grep, run_command, finish" in out
    assert "not offered: write_file (not in the agent's tools)" in out
    assert "not offered: edit_file (not in the agent's tools)" in out
    assert "step: run, a Verify step" in out
    assert "You are a careful code reviewer." in out  # its prompt, in the system prompt
    assert "── first user message ──\nStep run (Verify): Review app.py.\n" in out
    assert "read-only for commands: . (the whole worktree" in out
    # No project kind here: no exit command, which submission would refuse.
    assert "submission would refuse it: step 'run': no exit command" in squash(result.output)
    assert not merlin_home.exists()  # no job, no database: nothing written


def test_run_dry_run_shows_the_rules_and_the_paths_they_hide(
    guarded_repo: Path, merlin_home: Path
) -> None:
    result = merlin("run", "test-writer", "Cover app.py.", "--dry-run", "--repo", str(guarded_repo))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "deny:\n  Read(./secrets/**)\n  Bash(git push:*)\n" in out
    assert "default: allow" in out
    assert "hidden from commands: secrets" in out
    assert "read-only for commands: -" in out
    assert "step: run, a Feature step" in out
    assert "exit command: python -m pytest -q" in out
    assert "The repository's instructions (AGENTS.md):\nRun the tests with pytest." in out
    assert git(guarded_repo, "status", "--porcelain") == ""
    assert git(guarded_repo, "branch", "--list", "merlin/*") == ""
    assert not merlin_home.exists()


def test_run_dry_run_json(guarded_repo: Path, merlin_home: Path) -> None:
    args = ["reviewer", "Review\n  the  code.", "--dry-run", "--json"]
    result = merlin("run", *args, "--repo", str(guarded_repo))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) == RUN_KEYS
    builtin = resource_dir("config") / "agents" / "reviewer.md"
    assert (data["agent"], data["scope"], data["file"]) == ("reviewer", "builtin", str(builtin))
    assert data["tier"] == "local"
    assert data["system_prompt"].startswith("You are merlin, an autonomous coding agent")
    assert "Your role:\nYou are a careful code reviewer." in data["system_prompt"]
    assert data["user_prompt"] == (
        "Step run (Verify): Review\n  the  code.\nExit command that must succeed: "
        "python -m pytest -q"
    )
    tools = data["tools"]
    assert tools["offered"] == ["read_file", "list_files", "grep", "run_command", "finish"]
    assert {t["name"] for t in tools["withheld"]} == {"write_file", "edit_file"}
    assert tools["mcp_servers"] == []
    assert data["permissions"] == {
        "allow": [],
        "deny": ["Read(./secrets/**)", "Bash(git push:*)"],
        "ask": [],
        "default": "allow",
        "hidden": ["secrets"],
        "read_only": ["."],
    }
    assert data["warnings"] == []


def test_run_dry_run_lists_mcp_servers_and_what_submission_would_refuse(
    guarded_repo: Path, tmp_path: Path
) -> None:
    agent_file(
        guarded_repo / ".merlin/agents", "gh", "tools: [Read, mcp__github__issues]\ntier: big\n"
    )
    config = tmp_path / "merlin.toml"
    config.write_text(
        '[mcp_servers.github]\ncommand = "gh-mcp"\n[mcp_servers.db]\ncommand = "db-mcp"\n'
        '[mcp_servers.web]\ncommand = "web-mcp"\n[permissions]\ndeny = ["mcp__db"]\n'
    )
    args = ["gh", "Triage.", "--dry-run", "--json", "--config", str(config)]
    result = merlin("run", *args, "--repo", str(guarded_repo))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    servers = {s["name"]: (s["started"], s["why"]) for s in data["tools"]["mcp_servers"]}
    assert servers == {
        "db": (False, "not started: [permissions] refuse it whole"),
        "github": (
            True,
            "started at run time, which lists its tools; the agent gets only mcp__github__issues",
        ),
        "web": (False, "not started: the agent's tools do not name it"),
    }
    assert data["permissions"]["hidden"] == []  # --config replaces the repository's file
    (refusal,) = data["warnings"]
    assert "submission would refuse it: step run: agent 'gh'" in refusal
    assert "asks for tier 'big', which is not configured" in refusal


@pytest.mark.parametrize("dry_run", [True, False])
def test_run_an_unknown_agent_names_the_known_ones(
    guarded_repo: Path, merlin_home: Path, dry_run: bool
) -> None:
    args = ["--dry-run"] if dry_run else []
    result = merlin("run", "nobody", "Do it.", *args, "--repo", str(guarded_repo))
    assert result.exit_code == 2
    assert (
        "no agent named 'nobody'; the agents: docs-writer, refactorer, reviewer, test-writer"
        in squash(result.output)
    )
    assert not merlin_home.exists()


def test_run_an_empty_prompt_is_refused(guarded_repo: Path, merlin_home: Path) -> None:
    result = merlin("run", "reviewer", " \n ", "--dry-run", "--repo", str(guarded_repo))
    assert result.exit_code == 2
    assert "the prompt is empty" in result.output


def test_run_submits_a_one_step_job_and_works_it_here(
    guarded_repo: Path, merlin_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job `merlin run` would make of the TaskList; its working is the e2e test's."""
    import merlin_flow.workspace.sandbox

    monkeypatch.setattr(merlin_flow.workspace.sandbox, "sandbox_problem", lambda: None)
    worked: list[str] = []
    monkeypatch.setattr(
        "merlin_flow.cli.following.run_embedded",
        lambda db, job_id, as_json, until=None, on_interrupt=None: worked.append(job_id),
    )
    config = tmp_path / "scripted.toml"
    config.write_text('[[tiers]]\nname = "local"\nmodel = "scripted/local.yaml"\n' + DENY_TOML)
    (tmp_path / "local.yaml").write_text("rules: []\n")
    long = "Add tests for answer() " + "and more " * 10
    args = ["test-writer", long, "--config", str(config), "--repo", str(guarded_repo)]
    result = merlin("run", *args)
    assert result.exit_code == 0, result.output
    (job_id,) = worked

    from merlin_flow.jobs.views import job_view
    from merlin_flow.settings import get_settings
    from merlin_flow.store import open_database

    db = open_database(get_settings().database)
    try:
        view = job_view(db, job_id)
    finally:
        db.dispose()
    assert view["title"] == long[:71].rstrip() + "…"
    (step,) = view["steps"]
    assert (step["id"], step["step_type"], step["agent"]) == ("run", "Feature", "test-writer")
    assert step["agent_choice"] == "named"
    assert step["description"] == long.strip()
    assert step["exit_command"] == "python -m pytest -q"
    assert git(guarded_repo, "branch", "--list", f"merlin/{job_id}") != ""
