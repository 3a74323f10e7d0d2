"""The database a process uses, parsed once at config load: which backend, where, and how to connect.

One parser for the ``database`` key (and ``AGENTKEEL_DATABASE_URL``), so the run, journal and
assistant stores, LangGraph's checkpointer and its key-value store cannot disagree about a URL:
a URL that cannot work stops start-up with ``database:`` in the message instead of failing later in
whichever opener happens to parse it first. Accepted spellings:

* ``memory://`` (any case): everything in the process, for tests.
* ``sqlite:///relative/path`` or ``sqlite:////absolute/path`` (also ``sqlite+aiosqlite://``), without
  query parameters; a relative path resolves against the config file's folder.
* ``postgresql://``, ``postgres://`` or ``postgresql+psycopg://`` — a libpq URL; its query
  parameters (``?connect_timeout=5``, ``?sslmode=require``, ``?application_name=...``) reach libpq
  unchanged and win over the defaults of ``database_pool``. libpq itself validates them here, so
  ``?timeout=5`` is refused at start-up. Other drivers (``postgresql+asyncpg://``) are refused: the
  one pool is psycopg 3's, which LangGraph's PostgreSQL savers require.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field

Backend = Literal["memory", "sqlite", "postgres"]
SQLITE_SCHEMES = ("sqlite", "sqlite+aiosqlite")
POSTGRES_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")
SPELLINGS = "memory://, sqlite:///path or postgresql://user@host:5432/db"


class DatabasePool(BaseModel):
    """The ``database_pool:`` section: the one connection pool of a process and its timeouts.

    ``size`` bounds every connection the process holds to ``database`` (stores, checkpointer and
    key-value store share the pool; on SQLite it bounds the stores' engine). The timeouts apply to
    PostgreSQL, so a half-open connection or a stuck backend fails a call instead of hanging it
    (and with it, shutdown).
    """

    model_config = ConfigDict(extra="forbid")

    # At least 2: LangGraph's checkpointer serialises its calls and may hold its one connection
    # while its caller reads the other stores, so a second keeps everything else moving.
    size: Annotated[int, Field(ge=2, le=1000)] = 10
    # libpq counts whole seconds and treats anything under 2 as 2.
    connect_timeout_s: Annotated[int, Field(ge=2)] = 5
    # A statement running longer is cancelled by the server; 0 disables. Migrations are exempt.
    statement_timeout_s: Annotated[float, Field(ge=0)] = 30.0
    # TCP keepalive after this much silence, then 3 probes 5 s apart: a dead peer is noticed in
    # keepalive_idle_s + 15 s, and unacknowledged writes give up after the same time.
    keepalive_idle_s: Annotated[int, Field(ge=1)] = 15
    # How long a caller waits for a free connection before the call fails (psycopg PoolTimeout).
    acquire_timeout_s: Annotated[float, Field(gt=0)] = 30.0


@dataclass(frozen=True)
class DatabaseUrl:
    """A parsed ``database`` URL: ``target`` is the SQLite file path or a ``postgresql://`` URL."""

    backend: Backend
    target: str = ""

    def __str__(self) -> str:
        """For logs and the CLI: the URL with any password masked."""
        if self.backend == "memory":
            return "memory://"
        if self.backend == "sqlite":
            return f"sqlite:///{self.target}"
        parts = urlsplit(self.target)
        if parts.password is None:
            return self.target
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
        return urlunsplit(parts._replace(netloc=netloc))

    def resolved(self, base_dir: Path) -> DatabaseUrl:
        """A relative SQLite path made absolute against ``base_dir``; anything else unchanged."""
        if self.backend != "sqlite":
            return self
        path = Path(self.target).expanduser()
        return replace(self, target=str(path if path.is_absolute() else (base_dir / path).resolve()))


def parse_database_url(value: str) -> DatabaseUrl:
    """Parse one ``database`` URL; ``ValueError`` saying what is wrong and what would work."""
    scheme, sep, rest = value.strip().partition("://")
    scheme = scheme.lower()
    if not sep:
        raise ValueError(f"not a database URL: {value!r} (use {SPELLINGS})")
    if scheme == "memory":
        if rest:
            raise ValueError(f"memory:// takes no path, got {value!r}")
        return DatabaseUrl("memory")
    if scheme in SQLITE_SCHEMES:
        return DatabaseUrl("sqlite", _sqlite_path(value, rest))
    if scheme in POSTGRES_SCHEMES:
        return DatabaseUrl("postgres", _postgres_target(value, rest))
    if scheme.startswith("postgres"):
        raise ValueError(
            f"unsupported PostgreSQL driver {scheme!r} in {value!r}: AgentKeel connects with "
            "psycopg 3 (use postgresql://...)"
        )
    raise ValueError(f"unsupported database scheme {scheme!r} in {value!r} (use {SPELLINGS})")


def _sqlite_path(value: str, rest: str) -> str:
    # sqlite:///<path>: an empty host, then the path (absolute paths keep their leading "/").
    if not rest.startswith("/") or len(rest) < 2:
        raise ValueError(f"expected sqlite:///<path>, got {value!r}")
    if "?" in rest:
        raise ValueError(f"sqlite URLs take no query parameters, got {value!r}")
    path = rest[1:]
    if path == ":memory:":
        raise ValueError("an in-memory SQLite database is not shared between connections; use memory://")
    return path


def _postgres_target(value: str, rest: str) -> str:
    from psycopg import Error
    from psycopg.conninfo import conninfo_to_dict

    target = f"postgresql://{rest}"
    try:
        conninfo_to_dict(target)  # libpq's own parser: unknown parameters, bad ports, bad escapes
    except Error as exc:
        raise ValueError(f"invalid PostgreSQL URL {value!r}: {str(exc).strip()}") from None
    return target


def as_database_url(value: object) -> DatabaseUrl:
    """The config field's validator: a string is parsed, a parsed value kept."""
    if isinstance(value, DatabaseUrl):
        return value
    if not isinstance(value, str):
        raise ValueError(f"must be a database URL string ({SPELLINGS})")  # noqa: TRY004 - pydantic reports only ValueError
    return parse_database_url(value)


@dataclass(frozen=True)
class Database:
    """What every opener of the connection layer takes: the parsed URL and the pool settings."""

    url: DatabaseUrl
    pool: DatabasePool = field(default_factory=DatabasePool)

    @classmethod
    def parse(cls, url: str, pool: DatabasePool | None = None) -> Database:
        return cls(parse_database_url(url), pool or DatabasePool())
