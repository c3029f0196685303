"""Open merlin's database and keep its schema at the Alembic head.

SQLite (the default, at ``$MERLIN_HOME/merlin.db``) runs in WAL mode with a busy timeout
so that several worker processes can share it; it is upgraded automatically on first use.
Any other database must be upgraded explicitly with ``merlin db upgrade``.

Every session redacts the worker's secrets (see :mod:`merlin_flow.store.redaction`) from the
text and JSON values it is about to write, so no call site has to. Bulk ``update()``
statements do not go through a flush and are not covered.
"""

from __future__ import annotations

import ast
import fcntl
import functools
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Engine, String, create_engine, event, inspect, text
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.orm.attributes import instance_state

from merlin_flow.errors import RecordInDoubt, StoreError
from merlin_flow.resources import resource_dir
from merlin_flow.store.fork_gate import SQLITE_CONNECT_ARGS
from merlin_flow.store.wal import enable_wal

if TYPE_CHECKING:
    from merlin_flow.store.redaction import Redactor

SQLITE_BUSY_TIMEOUT_MS = 30_000
VERSION_TABLE = "alembic_version"
"""Where Alembic keeps the revision a database is at."""
T = TypeVar("T")
# Alembic logs every schema check at INFO; worker logs do not need that.
logging.getLogger("alembic").setLevel(logging.WARNING)


class Database:
    """An engine and a session factory for one database URL."""

    def __init__(self, url: str) -> None:
        """Create the engine (no connection is made yet)."""
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        if self.is_sqlite:
            path = _sqlite_path(url)
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
        self.engine: Engine = create_engine(url, **_engine_options(url))
        if self.is_sqlite:
            event.listen(self.engine, "connect", _sqlite_on_connect)
            event.listen(self.engine, "begin", _sqlite_on_begin)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._readers = sessionmaker(
            self.engine.execution_options(merlin_read_only=True), expire_on_commit=False
        )
        for factory in (self._sessions, self._readers):
            event.listen(factory, "before_flush", _redact_before_flush)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in one transaction: committed on success, rolled back on error."""
        with self._sessions.begin() as session:
            yield session

    @contextmanager
    def reader(self) -> Iterator[Session]:
        """A session for reads only: on SQLite it does not take the write lock."""
        with self._readers.begin() as session:
            yield session

    def dispose(self) -> None:
        """Close pooled connections (call after fork, and when done)."""
        self.engine.dispose()


def _redact_before_flush(session: Session, _context: Any, _instances: Any) -> None:
    """Redact secrets from what this flush writes: new rows whole, changed columns of others."""
    from merlin_flow.store.redaction import current_redactor  # its patterns: writes only

    redactor = current_redactor()
    if not redactor:
        return
    for obj in session.new:
        _redact_object(redactor, obj, changed_only=False)
    for obj in session.dirty:
        _redact_object(redactor, obj, changed_only=True)


def _redact_object(redactor: Redactor, obj: object, *, changed_only: bool) -> None:
    """Redact the loaded str and JSON column values of ``obj``, assigning only changes.

    With ``changed_only`` only the columns modified since load are looked at: the others
    are not written by this flush (and rewriting them could undo a concurrent update).
    """
    state = instance_state(obj)
    columns = state.mapper.column_attrs
    keys = [key for key in state.committed_state if key in columns] if changed_only else None
    loaded = state.dict
    for key in columns.keys() if keys is None else keys:
        if not _may_hold_secrets(state.mapper.columns[key]):
            continue
        value = loaded.get(key)
        if isinstance(value, str):
            redacted: Any = redactor.redact(value)
        elif isinstance(value, dict | list):
            redacted = redactor.redact_json(value)
        else:
            continue
        if redacted is not value:
            setattr(obj, key, redacted)


def _may_hold_secrets(column: Any) -> bool:
    """Free text and JSON may; merlin's own identifiers never do, and must stay as written.

    Keys, bounded strings (ids, statuses, names, hashes) and ``Text`` columns marked
    ``identifier`` (a repository's path, a branch, a model) are not redacted: a password
    that happens to read "merlin" would otherwise turn the branch ``merlin/<job>`` into
    ``[REDACTED]/<job>``.
    """
    if column.primary_key or column.foreign_keys or column.info.get("identifier"):
        return False
    return not (isinstance(column.type, String) and column.type.length is not None)


def _engine_options(url: str) -> dict[str, Any]:
    if url.startswith("sqlite"):
        return {
            "connect_args": {
                "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000,
                "isolation_level": None,
                **SQLITE_CONNECT_ARGS,  # a fork never catches a thread inside SQLite
            }
        }
    return {"pool_pre_ping": True}


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    enable_wal(cursor, SQLITE_BUSY_TIMEOUT_MS / 1000)
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _sqlite_on_begin(connection: Any) -> None:
    # Writers take the write lock at BEGIN, so that read-then-write transactions (lease
    # claims) serialize instead of failing with 'database is locked' on upgrade to a
    # writer. Readers (Database.reader) begin deferred and never block a writer (WAL).
    if connection.get_execution_options().get("merlin_read_only"):
        connection.exec_driver_sql("BEGIN")
    else:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def _sqlite_path(url: str) -> Path | None:
    path = url.split(":///", 1)[1] if ":///" in url else ""
    if not path or path.startswith(":memory:"):
        return None
    return Path(path.split("?", 1)[0])


def alembic_config(url: str) -> Any:
    """An Alembic Config pointing at merlin's migrations and the given database."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(resource_dir("alembic")))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(db: Database, revision: str = "head") -> None:
    """Run the Alembic migrations up to ``revision`` on ``db``."""
    from alembic import command

    config = alembic_config(db.url)
    with db.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def current_revision(db: Database) -> str | None:
    """The revision the database is at, or None for an empty database.

    Read as Alembic reads it (its version table, when there is one), with one query and
    without importing Alembic: every command opens the database, few migrate it.
    """
    with db.engine.connect() as connection:
        if not inspect(connection).has_table(VERSION_TABLE):
            return None
        revisions = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
    if len(revisions) > 1:
        raise StoreError(
            f"database schema is at several revisions at once "
            f"({', '.join(row[0] for row in revisions)}): it was not migrated by merlin"
        )
    return revisions[0][0] if revisions else None


@functools.cache
def head_revision() -> str:
    """The newest migration shipped with this version of merlin_flow.

    Read from the migration files (their ``revision`` and ``down_revision``) without
    importing Alembic: the one revision no other revises.
    """
    revised: set[str] = set()
    revisions: set[str] = set()
    for path in (resource_dir("alembic") / "versions").glob("*.py"):
        if path.name.startswith(("__init__", ".#")):
            continue
        names = _revision_names(path)
        revision, down = names.get("revision"), names.get("down_revision")
        if isinstance(revision, str):
            revisions.add(revision)
        revised.update([down] if isinstance(down, str) else down or ())
    heads = revisions - revised
    assert len(heads) == 1, f"the migrations have {len(heads)} heads: {sorted(heads)}"
    return heads.pop()


def _revision_names(path: Path) -> dict[str, Any]:
    """A migration file's ``revision`` and ``down_revision``, as it assigns them."""
    found: dict[str, Any] = {}
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id in ("revision", "down_revision"):
            found[target.id] = ast.literal_eval(value)
    return found


def open_database(url: str) -> Database:
    """Open ``url``, upgrading an embedded SQLite database; refuse an outdated server DB."""
    db = Database(url)
    try:
        if db.is_sqlite:
            _upgrade_sqlite_once(db)
        else:
            current = _patiently(lambda: current_revision(db))
            if current != head_revision():
                raise StoreError(
                    f"database schema is at {current or 'nothing'}, not at "
                    f"{head_revision()}: run `merlin db upgrade`"
                )
    except SQLAlchemyError as exc:
        db.dispose()
        raise StoreError(f"cannot use the database {db.engine.url!r}: {exc}") from None
    except StoreError:
        db.dispose()
        raise
    return db


OPEN_RETRY_DELAYS = (0.5, 1.0, 2.0)
"""Seconds between tries of a server whose connection was cut (a restart, a failover)."""


def _is_cut(exc: DBAPIError) -> bool:
    """Whether ``exc`` is a lost connection (a restart, a failover, an outage)."""
    return exc.connection_invalidated or isinstance(exc, OperationalError)


def _patiently(read: Callable[[], T]) -> T:
    """``read()``, again after each of OPEN_RETRY_DELAYS while its connection is cut."""
    for delay in (*OPEN_RETRY_DELAYS, None):
        try:
            return read()
        except DBAPIError as exc:
            if delay is None or not _is_cut(exc):
                raise
            logging.getLogger(__name__).warning("database connection lost; trying again")
            time.sleep(delay)
    raise AssertionError("unreachable")


def write_patiently(
    db: Database, write: Callable[[Session], None], landed: Callable[[Session], bool], what: str
) -> None:
    """Run ``write`` (recording ``what``) in one transaction; again while its connection is cut.

    A connection cut during the commit leaves it unknown whether the commit landed, so
    after a cut ``landed`` looks (for a row the write adds, by its key), and ``write``
    runs again only once ``landed`` said no: ``what`` is never recorded twice. Tries are
    OPEN_RETRY_DELAYS apart. StoreError when the last try was cut and did not land;
    RecordInDoubt when the last look was cut too (it may have landed).
    """
    tries = (*OPEN_RETRY_DELAYS, OPEN_RETRY_DELAYS[-1])
    in_doubt = False  # a try was cut, and no look since has answered
    for number, delay in enumerate(tries):
        if not in_doubt:
            try:
                with db.session() as session:
                    write(session)
                return
            except DBAPIError as exc:
                if not _is_cut(exc):
                    if number and _look(db, landed):  # an earlier commit, landed late
                        return
                    raise
                cut = exc
        logging.getLogger(__name__).warning("database connection lost while writing")
        time.sleep(delay)
        seen = _look(db, landed)
        if seen:
            return
        in_doubt = seen is None
    if in_doubt:
        raise RecordInDoubt(
            f"the connection to the database {db.engine.url!r} was lost while {what} was "
            f"recorded, and it is not known whether it was ({cut.orig}); "
            "`merlin status` tells once the database answers"
        )
    raise StoreError(
        f"cannot use the database {db.engine.url!r}: its connection was lost "
        f"{len(tries)} times in a row ({cut.orig})"
    )


def _look(db: Database, landed: Callable[[Session], bool]) -> bool | None:
    """Whether the write landed (``landed``); None when the look's connection is cut too."""
    try:
        with db.reader() as session:
            return landed(session)
    except DBAPIError as exc:
        if not _is_cut(exc):
            raise
        return None


def _upgrade_sqlite_once(db: Database) -> None:
    path = _sqlite_path(db.url)
    if path is None:
        upgrade(db)
        return
    if current_revision(db) == head_revision():
        return
    lock_path = path.with_name(path.name + ".migrate.lock")
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if current_revision(db) != head_revision():
                upgrade(db)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def table_names(db: Database) -> list[str]:
    """Names of the tables present (for checks and tests)."""
    return sorted(inspect(db.engine).get_table_names())
