"""The one parser of the ``database`` key: what it accepts, what it refuses, and where it says so."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg.conninfo import conninfo_to_dict

from agentkeel.config import ConfigError, KeelConfig, load_config
from agentkeel.database import Database, DatabasePool, DatabaseUrl, parse_database_url
from agentkeel.runtime.connections import postgres_conninfo


@pytest.mark.parametrize(
    ("url", "backend", "target"),
    [
        ("memory://", "memory", ""),
        ("MEMORY://", "memory", ""),
        ("Memory://", "memory", ""),
        ("sqlite:///rel/keel.db", "sqlite", "rel/keel.db"),
        ("sqlite:////abs/keel.db", "sqlite", "/abs/keel.db"),
        ("SQLite+aiosqlite:///keel.db", "sqlite", "keel.db"),
        ("postgresql://u@h:5432/db", "postgres", "postgresql://u@h:5432/db"),
        ("postgres://u@h/db", "postgres", "postgresql://u@h/db"),
        ("postgresql+psycopg://u@h/db", "postgres", "postgresql://u@h/db"),
        ("postgresql://u@h/db?connect_timeout=5&sslmode=disable", "postgres",
         "postgresql://u@h/db?connect_timeout=5&sslmode=disable"),
    ],
)
def test_accepted_spellings(url: str, backend: str, target: str) -> None:
    assert parse_database_url(url) == DatabaseUrl(backend, target)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgresql+asyncpg://u@h/db", "psycopg"),
        ("postgresql://u@h/db?timeout=5", "timeout"),
        ("mysql://u@h/db", "unsupported database scheme 'mysql'"),
        ("keel.db", "not a database URL"),
        ("sqlite://relative.db", "sqlite:///<path>"),
        ("sqlite:///:memory:", "memory://"),
        ("sqlite:///keel.db?mode=ro", "no query parameters"),
        ("memory://somewhere", "no path"),
    ],
)
def test_refused_urls_are_a_config_error_naming_database(url: str, says: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=says):
        parse_database_url(url)
    with pytest.raises(ConfigError) as from_env:
        load_config(None, env={"AGENTKEEL_DATABASE_URL": url})
    assert "  database: " in str(from_env.value) and says in str(from_env.value)
    file = tmp_path / "keel.yaml"
    file.write_text(f"database: '{url}'\n")
    with pytest.raises(ConfigError, match=r"database: "):
        load_config(file, env={})


@pytest.mark.parametrize("section", ["{size: 1}", "{bogus: 1}", "{statement_timeout_s: -1}"])
def test_the_pool_section_is_validated_with_its_key_path(section: str, tmp_path: Path) -> None:
    file = tmp_path / "keel.yaml"
    file.write_text(f"database_pool: {section}\n")
    key = section.strip("{}").split(":")[0]
    with pytest.raises(ConfigError, match=rf"database_pool\.{key}: "):
        load_config(file, env={})


def test_the_pool_settings_reach_what_the_openers_take(tmp_path: Path) -> None:
    config = KeelConfig(database="memory://", database_pool={"size": 4, "statement_timeout_s": 0}, base_dir=tmp_path)
    assert config.db == Database(DatabaseUrl("memory"), DatabasePool(size=4, statement_timeout_s=0))


def test_relative_sqlite_paths_resolve_against_the_config_folder(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    file = tmp_path / "conf" / "keel.yaml"
    file.write_text("database: sqlite:///data/keel.db\n")
    assert load_config(file, env={}).db.url == DatabaseUrl("sqlite", str(tmp_path / "conf" / "data" / "keel.db"))


def test_a_password_never_reaches_the_display_form() -> None:
    url = parse_database_url("postgresql://keel:s3cret@db.internal:5432/keel?sslmode=require")
    assert str(url) == "postgresql://keel:***@db.internal:5432/keel?sslmode=require"
    assert "s3cret" in url.target  # but the connection still gets it
    assert str(parse_database_url("sqlite:////abs/k.db")) == "sqlite:////abs/k.db"


def test_the_connection_string_carries_the_pool_timeouts() -> None:
    pool = DatabasePool(connect_timeout_s=4, statement_timeout_s=2.5, keepalive_idle_s=10)
    params = conninfo_to_dict(postgres_conninfo("postgresql://u@h/db", pool))
    assert params["connect_timeout"] == "4" and params["keepalives"] == "1"
    assert params["keepalives_idle"] == "10" and params["tcp_user_timeout"] == "25000"
    assert params["options"] == "-c statement_timeout=2500"
    assert params["application_name"] == "agentkeel"


names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=12)


@given(
    scheme=st.sampled_from(["postgresql", "postgres", "postgresql+psycopg"]).map(
        lambda s: "".join(c.upper() if i % 2 else c for i, c in enumerate(s))
    ),
    user=names, host=names, db=names, app=names,
    timeout=st.integers(min_value=2, max_value=600),
    options=st.sampled_from(["", "-c search_path=keel", "-c lock_timeout=100"]),
)
def test_url_parameters_reach_libpq_and_win_over_the_defaults(
    scheme: str, user: str, host: str, db: str, app: str, timeout: int, options: str
) -> None:
    query = f"application_name={app}&connect_timeout={timeout}" + (
        f"&options={options.replace(' ', '%20').replace('=', '%3D')}" if options else ""
    )
    url = Database.parse(f"{scheme}://{user}@{host}/{db}?{query}").url
    params = conninfo_to_dict(postgres_conninfo(url.target, DatabasePool()))
    assert (params["user"], params["host"], params["dbname"]) == (user, host, db)
    assert params["application_name"] == app and params["connect_timeout"] == str(timeout)
    # The pool's statement timeout first, the URL's own settings after it (libpq: the last one wins).
    assert params["options"].startswith("-c statement_timeout=30000")
    assert params["options"].endswith(options)
