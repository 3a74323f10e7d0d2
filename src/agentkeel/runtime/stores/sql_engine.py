"""One SQL database shared by the run, journal and assistant stores: transactions, migrations.

Both dialects run on SQLAlchemy's async engine. What differs is how a transaction serialises
admission across processes, and that is decided here once:

* SQLite: every writing transaction starts with ``BEGIN IMMEDIATE``, taking the database's write
  lock up front. A deferred ``BEGIN`` would read first and upgrade later, and two processes that
  both read "no active run" would both insert (or one would die with ``SQLITE_BUSY`` on the
  upgrade, which ``busy_timeout`` does not retry). Read-only transactions keep a plain ``BEGIN`` --
  in WAL mode they never block a writer and never need the upgrade. The connections run on the
  event loop's thread (``runtime/sqlite_inline.py``) with ``busy_timeout = 0``: a lock held by
  another connection fails the statement at once, and ``transaction`` waits for it here, with
  ``asyncio.sleep``, for as long as SQLite's own busy handler would have, then retries with a
  backoff (``retry_while_busy``).
* PostgreSQL: the stores lock the thread row (``SELECT ... FOR UPDATE``) inside the transaction.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Executable, Insert, Table, event, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import RowMapping
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agentkeel.runtime.sqlite_inline import inline_pragmas, retry_while_busy

log = logging.getLogger(__name__)

T = TypeVar("T")

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
READ_ONLY = "agentkeel_read_only"  # execution option (SQLite): open the transaction with a plain BEGIN
SINGLE = "agentkeel_single_statement"  # execution option: one statement, no BEGIN
# An arbitrary constant key for pg_advisory_xact_lock: "run migrations one process at a time".
PG_MIGRATION_LOCK = 0x6B65656C  # "keel"


def is_unique_violation(exc: BaseException) -> bool:
    """A unique index refused the write (psycopg sqlstate 23505, or SQLite's UNIQUE/PK error)."""
    if not isinstance(exc, IntegrityError):
        return False
    orig = exc.orig
    if getattr(orig, "sqlstate", None) == "23505":
        return True
    return getattr(orig, "sqlite_errorname", None) in (
        "SQLITE_CONSTRAINT_UNIQUE",
        "SQLITE_CONSTRAINT_PRIMARYKEY",
    )


def _install_hooks(engine: AsyncEngine) -> None:
    """Who opens a transaction: this hook, never the driver (SQLAlchemy's documented recipe for
    SQLite's ``BEGIN``, used on both dialects), plus SQLite's pragmas.

    The driver's connections stay in autocommit, so a ``single`` statement is sent alone and a
    transaction is the ``BEGIN`` emitted here, ended by the driver's ``commit``/``rollback``
    (both send their command whenever a transaction is open, autocommit or not). On PostgreSQL
    that is what lets a pool connection go from the stores to LangGraph's saver and back without
    switching modes: every switch was a call through psycopg and SQLAlchemy's greenlet bridge,
    six of them around a one-statement write."""
    sqlite = engine.dialect.name == "sqlite"

    if sqlite:
        @event.listens_for(engine.sync_engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None  # the driver must not emit its own BEGIN
            cursor = dbapi_connection.cursor()
            for pragma in inline_pragmas():  # WAL, NORMAL; locks waited for by ``transaction``
                cursor.execute(pragma)
            cursor.execute("PRAGMA foreign_keys = ON")
            cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Connection) -> None:
        options = conn.get_execution_options()
        if options.get(SINGLE, False):
            return  # one statement: the database's own implicit transaction is the transaction
        write = sqlite and not options.get(READ_ONLY, False)  # SQLite takes its write lock up front
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def _upgrade(connection: Connection, config: Config) -> None:
    config.attributes["connection"] = connection
    command.upgrade(config, "head")


class SqlDatabase:
    """The transaction discipline and migrations every SQL store uses, on the engine the
    connection layer (``runtime/connections.py``) opened; that layer owns and disposes it."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        _install_hooks(self.engine)
        # SQLite has one writer at a time anyway. Queueing this process's writers here instead of
        # in SQLite's busy handler (which sleeps up to 100 ms per poll) keeps a burst fast; other
        # processes are still held off by BEGIN IMMEDIATE.
        self._writer = asyncio.Lock() if self.dialect == "sqlite" else None
        self._setup_lock = asyncio.Lock()
        self._migrated = False
        self._inserts: dict[tuple[str, tuple[str, ...]], Insert] = {}

    async def transaction(
        self, work: Callable[[AsyncConnection], Awaitable[T]], *, read_only: bool = False,
        single: bool = False,
    ) -> T:
        """Run ``work`` in one transaction, retrying it whole while SQLite reports busy.

        ``single``: ``work`` executes exactly one statement, which is atomic on its own, so no
        ``BEGIN``/``COMMIT`` is sent around it: on PostgreSQL one round trip instead of three.

        A busy error rolls the transaction back, so running ``work`` again is safe.
        """

        async def attempt() -> T:
            async with self._serialised(read_only), self._connect() as conn:
                options = self._options(read_only, single)
                if options:
                    await conn.execution_options(**options)
                async with conn.begin():
                    return await work(conn)

        return await retry_while_busy(attempt)

    @asynccontextmanager
    async def _connect(self) -> AsyncIterator[AsyncConnection]:
        """A connection of the engine for one transaction, closed (returned to its pool) after it.

        Why not ``async with engine.connect()``: its exit runs the close in a task of its own,
        shielded from cancellation, and waits for it: two turns of the event loop per
        transaction, each behind every other ready task, and on SQLite with this process's
        writer queue (``_writer``) held all the while, so under a burst every write waited for
        unrelated runs' steps. An inline SQLite connection closes without suspending
        (``runtime/sqlite_inline.py``), so no cancellation can cut its close short: it is closed
        in place. A PostgreSQL close goes over the network and may suspend: it keeps the shield.
        """
        if self.dialect != "sqlite":
            async with self.engine.connect() as shielded:
                yield shielded
            return
        conn = await self.engine.connect()
        try:
            yield conn
        finally:
            await conn.close()

    @staticmethod
    def _options(read_only: bool, single: bool) -> dict[str, Any]:
        if single:
            return {SINGLE: True}
        return {READ_ONLY: True} if read_only else {}

    async def rows(self, query: Executable, params: dict[str, Any] | None = None) -> list[RowMapping]:
        """All rows of one read (one statement: it sees one snapshot on its own)."""

        async def work(conn: AsyncConnection) -> list[RowMapping]:
            return list((await conn.execute(query, params)).mappings())

        return await self.transaction(work, read_only=True, single=True)

    async def write(self, statement: Executable, rows: list[dict[str, Any]] | None = None) -> int:
        """One write statement, executed with each of ``rows`` as its parameters if given (more
        than one: all in one transaction; one: a single statement, atomic on its own); the rows
        it matched."""
        params: list[dict[str, Any]] | dict[str, Any] | None = rows[0] if rows and len(rows) == 1 else rows

        async def work(conn: AsyncConnection) -> int:
            return (await conn.execute(statement, params)).rowcount

        return await self.transaction(work, single=not isinstance(params, list))

    def _serialised(self, read_only: bool) -> AbstractAsyncContextManager[object]:
        return self._writer if self._writer is not None and not read_only else nullcontext()

    async def setup(self) -> None:
        """Migrate to the newest revision; idempotent, and safe when processes race on it.

        On SQLite the migration transaction's ``BEGIN IMMEDIATE`` serialises the racers; on
        PostgreSQL a transaction-scoped advisory lock does. Either way the loser then finds the
        schema at head and does nothing.
        """
        async with self._setup_lock:
            if self._migrated:
                return
            config = Config()
            config.set_main_option("script_location", str(MIGRATIONS_DIR))

            async def migrate(conn: AsyncConnection) -> None:
                if self.dialect == "postgresql":
                    # An index build on a large table may outlast the pool's statement timeout.
                    await conn.execute(text("SET LOCAL statement_timeout = 0"))
                    await conn.execute(
                        text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_MIGRATION_LOCK}
                    )
                await conn.run_sync(_upgrade, config)

            await self.transaction(migrate)
            self._migrated = True

    def insert_ignoring(self, table: Table, *keys: str) -> Insert:
        """``INSERT ... ON CONFLICT (keys) DO NOTHING`` in this database's dialect, built once per
        table and keys (a statement is immutable: ``.values()`` and ``.returning()`` copy it), so
        the stores that execute it with parameters share one statement and its compiled form."""
        statement = self._inserts.get((table.name, keys))
        if statement is None:
            insert = pg_insert if self.dialect == "postgresql" else sqlite_insert
            statement = self._inserts[(table.name, keys)] = insert(table).on_conflict_do_nothing(index_elements=list(keys))
        return statement

    def insert_touching(self, table: Table, keys: tuple[str, ...], touched: tuple[str, ...]) -> Insert:
        """``INSERT ... ON CONFLICT (keys) DO UPDATE SET`` each of ``touched`` to the inserted
        value, ``RETURNING`` the row: in one statement the row exists, is locked until the
        transaction ends (the conflict's update takes the row lock on PostgreSQL; SQLite's
        ``BEGIN IMMEDIATE`` already serialises writers) and is read back."""
        insert = pg_insert if self.dialect == "postgresql" else sqlite_insert
        statement = insert(table)
        return statement.on_conflict_do_update(
            index_elements=list(keys), set_={name: statement.excluded[name] for name in touched}
        ).returning(table)


class SqlBacked:
    """What every SQL store shares: the database it runs on and its migrations. ``close()`` stays
    the interface's no-op: the connection layer, not a store, owns the connections."""

    def __init__(self, db: SqlDatabase) -> None:
        self._db = db

    async def setup(self) -> None:
        await self._db.setup()
