"""The SQL assistant store: one implementation for SQLite and PostgreSQL.

Filtering, sorting and pagination happen in the database so that ``X-Pagination-Total`` and the
pages agree under concurrent writes. The one dialect difference is the metadata filter (an exact
match per top-level key): PostgreSQL compares ``jsonb`` values, SQLite compares ``json_extract``
results -- equal for scalars, lists and objects alike, except that SQLite compares objects as
text, so a nested object only matches when written with the same key order.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    String,
    Table,
    cast,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from agentkeel.runtime.records import utcnow
from agentkeel.runtime.stores.assistants import (
    OWNER_KEY,
    Assistant,
    AssistantExists,
    AssistantPatch,
    AssistantQuery,
    AssistantStore,
    IfExists,
    check_metadata_filter,
)
from agentkeel.runtime.stores.sql_engine import SqlBacked
from agentkeel.runtime.stores.sql_schema import assistant_versions, assistants

_VERSION_FIELDS = ("graph_id", "config", "context", "metadata", "name", "description")


def _to_assistant(row: Mapping[Any, Any]) -> Assistant:
    return Assistant(
        assistant_id=row["assistant_id"],
        graph_id=row["graph_id"],
        config=row["config"],
        context=row["context"],
        metadata=row["metadata"],
        name=row["name"],
        description=row["description"],
        version=row["version"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _to_version(row: RowMapping) -> Assistant:
    """A stored version as listed: both timestamps are when that version was written."""
    return _to_assistant({**row, "updated_at": row["created_at"]})


def _values(assistant: Assistant) -> dict[str, Any]:
    return {name: getattr(assistant, name) for name in _VERSION_FIELDS}


def _version_row(assistant: Assistant) -> dict[str, Any]:
    return {
        **_values(assistant),
        "assistant_id": assistant.assistant_id,
        "version": assistant.version,
        "created_at": assistant.updated_at,
    }


async def _one(conn: AsyncConnection, statement: Any) -> RowMapping | None:
    return (await conn.execute(statement)).mappings().first()


class SqlAssistantStore(SqlBacked, AssistantStore):
    def _metadata_filter(self, table: Table, metadata: dict[str, Any] | None) -> list[ColumnElement[bool]]:
        check_metadata_filter(metadata)
        column = table.c.metadata
        clauses: list[ColumnElement[bool]] = []
        for key, value in (metadata or {}).items():
            encoded = literal(json.dumps(value), String)
            if self._db.dialect == "postgresql":
                clauses.append(column.op("->")(literal(key, String)) == cast(encoded, JSONB))
                continue
            path = literal(f'$."{key}"', String)
            if value is None:  # json_extract yields SQL NULL for a JSON null and a missing key alike
                clauses.append(func.json_type(column, path) == "null")
            else:
                clauses.append(func.json_extract(column, path) == func.json_extract(encoded, "$"))
        return clauses

    def _where(self, query: AssistantQuery) -> list[ColumnElement[bool]]:
        clauses = self._metadata_filter(assistants, query.metadata)
        if query.graph_id is not None:
            clauses.append(assistants.c.graph_id == query.graph_id)
        if query.name:
            clauses.append(func.lower(assistants.c.name).contains(query.name.lower(), autoescape=True))
        if query.visible_to is not None:
            clauses.append(self._visible_to(query.visible_to))
        return clauses

    def _visible_to(self, user: str) -> ColumnElement[bool]:
        """Owned by ``user``, or shared (no ``owner`` key at all)."""
        column = assistants.c.metadata
        if self._db.dialect == "postgresql":
            key = literal(OWNER_KEY, String)
            return or_(column.op("->")(key).is_(None), column.op("->>")(key) == user)
        path = literal(f'$."{OWNER_KEY}"', String)
        return or_(func.json_type(column, path).is_(None), func.json_extract(column, path) == user)

    async def create(self, assistant: Assistant, if_exists: IfExists = "raise") -> Assistant:
        async def work(conn: AsyncConnection) -> Assistant:
            now = utcnow()
            fresh = replace(assistant, version=1, created_at=now, updated_at=now)
            statement = (
                self._db.insert_ignoring(assistants, "assistant_id")
                .values(**_values(fresh), assistant_id=fresh.assistant_id, version=1, created_at=now, updated_at=now)
                .returning(assistants.c.assistant_id)
            )
            if await _one(conn, statement) is None:  # ignored: the id exists
                if if_exists == "raise":
                    raise AssistantExists(f"assistant {assistant.assistant_id} already exists")
                existing = await _one(conn, self._current(assistant.assistant_id))
                assert existing is not None  # the insert was ignored because the row exists
                return _to_assistant(existing)
            await conn.execute(insert(assistant_versions).values(**_version_row(fresh)))
            return fresh

        return await self._db.transaction(work)

    @staticmethod
    def _current(assistant_id: str) -> Select[Any]:
        return select(assistants).where(assistants.c.assistant_id == assistant_id)

    async def get(self, assistant_id: str) -> Assistant | None:
        found = await self._db.rows(self._current(assistant_id))
        return _to_assistant(found[0]) if found else None

    async def update(self, assistant_id: str, patch: AssistantPatch) -> Assistant | None:
        async def work(conn: AsyncConnection) -> Assistant | None:
            row = await _one(conn, self._current(assistant_id).with_for_update())
            if row is None:
                return None
            latest = await conn.scalar(
                select(func.max(assistant_versions.c.version)).where(
                    assistant_versions.c.assistant_id == assistant_id
                )
            )
            updated = patch.apply(_to_assistant(row), (latest or 0) + 1, utcnow())
            await conn.execute(
                update(assistants)
                .where(assistants.c.assistant_id == assistant_id)
                .values(**_values(updated), version=updated.version, updated_at=updated.updated_at)
            )
            await conn.execute(insert(assistant_versions).values(**_version_row(updated)))
            return updated

        return await self._db.transaction(work)

    async def delete(self, assistant_id: str) -> bool:
        async def work(conn: AsyncConnection) -> bool:
            # Explicit rather than relying on ON DELETE CASCADE alone (SQLite enforces foreign
            # keys only on connections that enabled them).
            await conn.execute(
                delete(assistant_versions).where(assistant_versions.c.assistant_id == assistant_id)
            )
            statement = delete(assistants).where(assistants.c.assistant_id == assistant_id)
            return (await conn.execute(statement)).rowcount > 0

        return await self._db.transaction(work)

    async def search(self, query: AssistantQuery) -> tuple[list[Assistant], int]:
        where = self._where(query)
        column = assistants.c[query.sort_by]
        tiebreak = assistants.c.assistant_id
        order = [column.desc(), tiebreak.desc()] if query.sort_order == "desc" else [column, tiebreak]
        page_query = select(assistants).where(*where).order_by(*order).limit(query.limit).offset(query.offset)

        async def work(conn: AsyncConnection) -> tuple[list[Assistant], int]:
            page = [_to_assistant(r) for r in (await conn.execute(page_query)).mappings()]
            total = await conn.scalar(select(func.count()).select_from(assistants).where(*where))
            return page, int(total or 0)

        return await self._db.transaction(work, read_only=True)

    async def count(self, query: AssistantQuery) -> int:
        found = await self._db.rows(
            select(func.count().label("n")).select_from(assistants).where(*self._where(query))
        )
        return int(found[0]["n"])

    async def versions(
        self, assistant_id: str, metadata: dict[str, Any] | None = None, limit: int = 10, offset: int = 0
    ) -> list[Assistant]:
        query = (
            select(assistant_versions)
            .where(
                assistant_versions.c.assistant_id == assistant_id,
                *self._metadata_filter(assistant_versions, metadata),
            )
            .order_by(assistant_versions.c.version.desc())
            .limit(limit)
            .offset(offset)
        )
        return [_to_version(row) for row in await self._db.rows(query)]

    async def set_latest(self, assistant_id: str, version: int) -> Assistant | None:
        async def work(conn: AsyncConnection) -> Assistant | None:
            chosen = await _one(
                conn,
                select(assistant_versions).where(
                    assistant_versions.c.assistant_id == assistant_id,
                    assistant_versions.c.version == version,
                ),
            )
            if chosen is None:
                return None
            statement = (
                update(assistants)
                .where(assistants.c.assistant_id == assistant_id)
                .values(**{f: chosen[f] for f in _VERSION_FIELDS}, version=version, updated_at=utcnow())
                .returning(assistants)
            )
            row = await _one(conn, statement)
            return _to_assistant(row) if row else None

        return await self._db.transaction(work)
