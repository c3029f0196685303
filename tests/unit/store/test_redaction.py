"""Secrets of the worker's environment never reach the database."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm.attributes import flag_modified

from merlin_flow.store import Attempt, Database, Event, Job, LlmCall, Step
from merlin_flow.store.redaction import (
    REDACTED,
    Redactor,
    current_redactor,
    fill_secrets,
    refer_to_secrets,
    reset_redactor,
    secret_values,
)

API_KEY = "sk-test-1234567890"
DB_PASSWORD = "hunter2-pw"
DB_URL = f"postgresql://merlin:{DB_PASSWORD}@db.example:5432/merlin"


# secret_values


def test_secret_names_give_their_values() -> None:
    env = {
        "OPENAI_API_KEY": "sk-abcdef",
        "GITHUB_TOKEN": "ghp_123456",
        "my_client_secret": "s3cr3t-value",
        "DB_PASSWORD_FILE": "/run/secrets/pw",
        "HOME": "/home/merlin",
        "PATH": "/usr/bin:/bin",
    }
    assert sorted(secret_values(env)) == sorted(
        ["sk-abcdef", "ghp_123456", "s3cr3t-value", "/run/secrets/pw"]
    )


def test_url_credentials_of_any_variable() -> None:
    env = {
        "MERLIN_DATABASE_URL": "postgresql://user:pw-123456@host/db",
        "MERLIN_BROKER_URL": "redis://:redis-pass@cache:6379/0",
        "PIP_INDEX_URL": "https://tok-abcdefgh@pypi.example/simple",
        "PLAIN_URL": "https://example.com/path?q=1",
    }
    assert set(secret_values(env)) == {
        "postgresql://user:pw-123456@host/db",
        "https://tok-abcdefgh@pypi.example/simple",
        "redis://:redis-pass@cache:6379/0",
        "tok-abcdefgh",
        "pw-123456",
        "redis-pass",
    }


def test_url_password_is_also_given_decoded() -> None:
    values = secret_values({"X_URL": "postgresql://u:p%40ss-word@h/db"})
    assert "p%40ss-word" in values
    assert "p@ss-word" in values


def test_unescaped_at_stays_in_the_password() -> None:
    assert "p@ss-word" in secret_values({"X_URL": "postgresql://u:p@ss-word@h/db"})


def test_short_and_empty_values_are_ignored() -> None:
    env = {
        "A_KEY": "",
        "B_TOKEN": "12345",
        "C_SECRET": "123456",
        "GIT_URL": "ssh://git@github.com/o/r",  # a user name, not a credential
        "E_URL": "redis://:pw@cache",  # the password 'pw' is too short; the URL is not
    }
    assert set(secret_values(env)) == {"redis://:pw@cache", "123456"}


def test_longest_first_without_duplicates() -> None:
    env = {
        "A_KEY": "same-value",
        "B_KEY": "same-value",
        "C_KEY": "a-much-longer-value",
        "D_URL": "postgresql://user:pw-123456@host/db",
    }
    assert secret_values(env) == [
        "postgresql://user:pw-123456@host/db",
        "a-much-longer-value",
        "same-value",
        "pw-123456",
    ]


def test_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MERLIN_TEST_API_KEY", API_KEY)
    assert API_KEY in secret_values()


# Redactor


def test_redact_text() -> None:
    redactor = Redactor([API_KEY, DB_URL, DB_PASSWORD])
    assert redactor.redact(f"key={API_KEY}; again {API_KEY}") == (
        f"key={REDACTED}; again {REDACTED}"
    )
    # The URL goes whole, not as a URL with its password cut out.
    assert redactor.redact(f"cannot connect to {DB_URL}") == f"cannot connect to {REDACTED}"
    assert redactor.redact(f"password {DB_PASSWORD}!") == f"password {REDACTED}!"


def test_redact_escapes_regex_characters() -> None:
    redactor = Redactor(["a.b*c+d(e)"])
    assert redactor.redact("xa.b*c+d(e)y aXbbbc+d(e)") == f"x{REDACTED}y aXbbbc+d(e)"


def test_redact_returns_the_same_text_without_secrets() -> None:
    redactor = Redactor([API_KEY])
    original = "".join(["nothing ", "here"])
    assert redactor.redact(original) is original


def test_redact_json_nested() -> None:
    redactor = Redactor([API_KEY])
    value: dict[str, Any] = {
        "messages": [
            {"role": "tool", "content": f"env: OPENAI_API_KEY={API_KEY}"},
            {"role": "user", "content": "fine"},
        ],
        API_KEY: ["x", 1, 2.5, None, True, (f"t{API_KEY}",)],
        "count": 3,
    }
    redacted = redactor.redact_json(value)
    assert redacted == {
        "messages": [
            {"role": "tool", "content": f"env: OPENAI_API_KEY={REDACTED}"},
            {"role": "user", "content": "fine"},
        ],
        REDACTED: ["x", 1, 2.5, None, True, (f"t{REDACTED}",)],
        "count": 3,
    }
    assert API_KEY in str(value)  # the input is not modified
    assert redacted["messages"][1] is value["messages"][1]  # unchanged parts are shared


def test_redact_json_without_secrets_in_it_returns_the_input() -> None:
    redactor = Redactor([API_KEY])
    value = {"a": ["b", {"c": "d"}], "e": 1}
    assert redactor.redact_json(value) is value


def test_no_secrets_fast_path() -> None:
    redactor = Redactor(["", "short"])
    assert not redactor
    value = {"a": [API_KEY]}
    assert redactor.redact_json(value) is value
    assert redactor.redact(API_KEY) is API_KEY
    assert repr(redactor) == "Redactor(0 secrets)"


def test_current_redactor_is_cached_until_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MERLIN_TEST_API_KEY", API_KEY)
    reset_redactor()
    try:
        first = current_redactor()
        assert current_redactor() is first
        assert API_KEY in first.values
        monkeypatch.delenv("MERLIN_TEST_API_KEY")
        assert current_redactor() is first
        reset_redactor()
        assert API_KEY not in current_redactor().values
    finally:
        reset_redactor()


# Through the store


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("MERLIN_TEST_API_KEY", API_KEY)
    monkeypatch.setenv("MERLIN_DATABASE_URL", DB_URL)
    reset_redactor()
    yield
    monkeypatch.undo()
    reset_redactor()


@pytest.fixture
def db(store: Database) -> Database:
    """The migrated store of each backend (``store``, tests/unit/conftest.py)."""
    return store


def _rows(db: Database, sql: str) -> list[str]:
    """Every row of ``sql`` as text, read without the ORM."""
    with db.engine.connect() as connection:
        return [repr(tuple(row)) for row in connection.execute(text(sql))]


def _assert_clean(db: Database, table: str, expected_redactions: int = 1) -> str:
    dump = "\n".join(_rows(db, f"SELECT * FROM {table}"))
    assert dump
    for secret in (API_KEY, DB_PASSWORD, DB_URL):
        assert secret not in dump, f"{table} holds a secret"
    assert dump.count(REDACTED) >= expected_redactions, dump
    return dump


def _job_step(db: Database) -> tuple[str, int]:
    with db.session() as session:
        job = Job(
            id="job1",
            title=f"deploy with {API_KEY}",
            repo="/repo",
            status="running",
            branch="merlin/job1",
            base_commit="0" * 40,
            head_commit="0" * 40,
            tasklist={"title": "t", "steps": [{"id": "a", "env": {"TOKEN": API_KEY}}]},
            config={},
        )
        step = Step(
            job=job,
            position=0,
            key="a",
            step_type="Debug",
            description="x",
            exit_command="pytest",
            status="running",
        )
        session.add(job)
        session.flush()
        return job.id, step.id


def test_store_redacts_new_rows(db: Database, secret_env: None) -> None:
    job_id, step_id = _job_step(db)
    with db.session() as session:
        session.add(
            Event(
                job_id=job_id,
                step_key="a",
                kind="attempt_failed",
                message=f"connect {DB_URL} failed",
                data={"output": f"OPENAI_API_KEY={API_KEY}", "nested": [{"pw": DB_PASSWORD}]},
            )
        )
        attempt = Attempt(
            step_id=step_id,
            number=1,
            kind="execute",
            tier="local",
            model="scripted/x",
            status="failed",
            start_commit="0" * 40,
            output_tail=f"psql: password {DB_PASSWORD} rejected",
            error=f"AuthenticationError: bad key {API_KEY}",
            transcript=[
                {"role": "user", "content": "print the environment"},
                {"role": "tool", "content": f"MERLIN_TEST_API_KEY={API_KEY}\nURL={DB_URL}"},
            ],
        )
        session.add(attempt)
        session.flush()
        session.add(
            LlmCall(
                job_id=job_id,
                step_id=step_id,
                attempt_id=attempt.id,
                seq=1,
                tier="local",
                model="scripted/x",
                request_hash="h",
                response={"content": f"the key is {API_KEY}"},
            )
        )
    _assert_clean(db, "jobs", expected_redactions=2)
    _assert_clean(db, "events", expected_redactions=3)
    attempts = _assert_clean(db, "attempts", expected_redactions=4)
    assert f"URL={REDACTED}" in attempts  # the URL whole, not with its password cut out
    _assert_clean(db, "llm_calls")
    # What the ORM reads back is the redacted text too.
    with db.reader() as session:
        stored = session.scalars(select(Attempt)).one()
        assert stored.transcript is not None
        assert stored.transcript[1]["content"] == f"MERLIN_TEST_API_KEY={REDACTED}\nURL={REDACTED}"
        assert stored.error == f"AuthenticationError: bad key {REDACTED}"


def test_store_redacts_changed_columns(db: Database, secret_env: None) -> None:
    _, step_id = _job_step(db)
    with db.session() as session:
        session.add(
            Attempt(
                step_id=step_id,
                number=1,
                kind="execute",
                tier="local",
                model="scripted/x",
                status="running",
                start_commit="0" * 40,
                transcript=[],
            )
        )
    with db.session() as session:
        attempt = session.scalars(select(Attempt)).one()
        attempt.status = "error"
        attempt.error = f"gave up: {API_KEY}"
        assert attempt.transcript is not None
        attempt.transcript.append({"role": "tool", "content": DB_URL})
        flag_modified(attempt, "transcript")
        step = session.get_one(Step, step_id)
        step.result = f"done with {DB_PASSWORD}"
    dump = _assert_clean(db, "attempts", expected_redactions=2)
    assert "'error'" in dump
    _assert_clean(db, "steps")


def test_store_leaves_other_text_alone(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MERLIN_TEST_API_KEY", raising=False)
    reset_redactor()
    try:
        _, step_id = _job_step(db)
        with db.session() as session:
            step = session.get_one(Step, step_id)
            step.result = f"ok {API_KEY}"  # not a secret of this environment
        assert _rows(db, "SELECT result FROM steps") == [repr((f"ok {API_KEY}",))]
    finally:
        reset_redactor()


def test_a_user_name_alone_is_not_a_secret_outside_http() -> None:
    env = {"MERLIN_TEST_POSTGRES_URL": "postgresql://postgres@127.0.0.1:5432/test"}
    assert secret_values(env) == []


# an exit command the user wrote with a secret in it


def test_a_secret_in_a_command_is_stored_as_a_reference_and_filled_in_to_run() -> None:
    env = {"OPENAI_API_KEY": API_KEY, "SHORT_TOKEN": "abc", "HOME": "/home/u"}
    command = f"sh -c 'test \"$0\" = {API_KEY}' {API_KEY}"
    stored = refer_to_secrets(command, env)
    assert API_KEY not in stored
    assert stored == (
        "sh -c 'test \"$0\" = ${merlin-secret:OPENAI_API_KEY}' ${merlin-secret:OPENAI_API_KEY}"
    )
    assert fill_secrets(stored, env) == command
    assert refer_to_secrets("python -m pytest -q", env) == "python -m pytest -q"


def test_a_worker_without_the_secret_says_which_variable_it_lacks() -> None:
    from merlin_flow.errors import ConfigError

    with pytest.raises(ConfigError, match=r"\$OPENAI_API_KEY .* has no OPENAI_API_KEY"):
        fill_secrets("check ${merlin-secret:OPENAI_API_KEY}", {"HOME": "/"})


def test_a_secret_that_reads_like_merlins_own_names_leaves_them_whole(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """POSTGRES_PASSWORD=merlin (compose's old default) turned the branch merlin/<job>
    into [REDACTED]/<job>, and every job failed; identifiers are never redacted."""
    monkeypatch.setenv("MERLIN_DATABASE_URL", "postgresql://merlin:merlin@db:5432/merlin")
    reset_redactor()
    try:
        job_id, step_id = _job_step(db)
        with db.session() as session:
            step = session.get_one(Step, step_id)
            step.result = "merlin/job1 moved"  # free text: redacted
            step.lease_owner = "merlin-llm@host"
        assert _rows(db, "SELECT id, repo, branch FROM jobs") == [
            repr((job_id, "/repo", "merlin/job1"))
        ]
        assert _rows(db, "SELECT result, lease_owner FROM steps") == [
            repr((f"{REDACTED}/job1 moved", "merlin-llm@host"))
        ]
    finally:
        reset_redactor()
