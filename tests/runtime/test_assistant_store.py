"""The conformance suite every ``AssistantStore`` passes: memory, SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentkeel.database import Database
from agentkeel.runtime.assistants import assistant_key, ensure_system_assistants
from agentkeel.runtime.connections import open_connections
from agentkeel.runtime.stores.assistants import (
    Assistant,
    AssistantExists,
    AssistantPatch,
    AssistantQuery,
    AssistantStore,
    system_assistant_id,
)
from agentkeel.runtime.stores.factory import open_stores

A1 = "00000000-0000-4000-8000-000000000001"
A2 = "00000000-0000-4000-8000-000000000002"
A3 = "00000000-0000-4000-8000-000000000003"


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AssistantStore]:
    if request.param == "memory":
        url = "memory://"
    elif request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/keel.db"
    else:
        url = str(request.getfixturevalue("fresh_pg_url"))
    async with open_connections(Database.parse(url)) as connections:
        yield (await open_stores(connections)).assistants


def make(assistant_id: str, graph_id: str = "echo", **fields: object) -> Assistant:
    return Assistant(assistant_id=assistant_id, graph_id=graph_id, **fields)  # type: ignore[arg-type]


async def test_create_and_get(store: AssistantStore) -> None:
    created = await store.create(
        make(A1, config={"configurable": {"k": 1}}, context={"c": [1, 2]}, metadata={"m": {"n": None}},
             name="First", description="d", version=7)
    )
    assert created.version == 1  # a new assistant always starts at version 1
    assert created.created_at == created.updated_at
    got = await store.get(A1)
    assert got == created
    assert got is not None and got.config == {"configurable": {"k": 1}} and got.metadata == {"m": {"n": None}}
    assert await store.get(A2) is None


async def test_create_an_existing_id(store: AssistantStore) -> None:
    original = await store.create(make(A1, name="original"))
    with pytest.raises(AssistantExists):
        await store.create(make(A1, name="other"))
    kept = await store.create(make(A1, name="other"), if_exists="do_nothing")
    assert kept == original
    assert [v.name for v in await store.versions(A1)] == ["original"]


async def test_update_writes_versions(store: AssistantStore) -> None:
    await store.create(make(A1, config={"a": 1}, metadata={"keep": 1, "over": 1}, name="v1"))
    updated = await store.update(A1, AssistantPatch(config={"b": 2}, metadata={"over": 2, "new": 3}))
    assert updated is not None and updated.version == 2
    assert updated.config == {"b": 2}  # replaced
    assert updated.metadata == {"keep": 1, "over": 2, "new": 3}  # merged
    assert updated.name == "v1"  # untouched
    assert await store.get(A1) == updated
    versions = await store.versions(A1)
    assert [v.version for v in versions] == [2, 1]
    assert versions[1].config == {"a": 1}
    assert await store.update(A2, AssistantPatch(name="x")) is None


async def test_set_latest_and_versions_after_it(store: AssistantStore) -> None:
    created = await store.create(make(A1, name="one"))
    await store.update(A1, AssistantPatch(name="two", graph_id="hitl"))
    latest = await store.set_latest(A1, 1)
    assert latest is not None and latest.version == 1 and latest.name == "one" and latest.graph_id == "echo"
    assert latest.created_at == created.created_at and latest.updated_at >= created.updated_at
    assert await store.get(A1) == latest
    again = await store.update(A1, AssistantPatch(name="three"))
    assert again is not None and again.version == 3  # highest stored + 1, not current + 1
    assert [v.version for v in await store.versions(A1)] == [3, 2, 1]
    assert await store.set_latest(A1, 9) is None
    assert await store.set_latest(A2, 1) is None


async def test_versions_filter_and_page(store: AssistantStore) -> None:
    await store.create(make(A1, metadata={"tag": "a"}))
    await store.update(A1, AssistantPatch(metadata={"tag": "b"}))
    await store.update(A1, AssistantPatch(metadata={"tag": "a"}))
    assert [v.version for v in await store.versions(A1, {"tag": "a"})] == [3, 1]
    assert [v.version for v in await store.versions(A1, limit=1, offset=1)] == [2]
    assert await store.versions(A2) == []


async def test_delete(store: AssistantStore) -> None:
    await store.create(make(A1))
    await store.update(A1, AssistantPatch(name="n"))
    assert await store.delete(A1) is True
    assert await store.get(A1) is None
    assert await store.versions(A1) == []
    assert await store.delete(A1) is False
    assert (await store.create(make(A1))).version == 1  # the id is free again


async def test_visible_to_is_owned_or_shared(store: AssistantStore) -> None:
    """``visible_to``: the user's own assistants and those without an owner, never another's
    (an ``owner`` of JSON null is an owner, not a missing key)."""
    await store.create(make(A1, metadata={"owner": "ada"}))
    await store.create(make(A2, metadata={"owner": "bob"}))
    await store.create(make(A3, metadata={"team": "x"}))
    await store.create(make(str(uuid.uuid4()), metadata={"owner": None}))
    page, total = await store.search(AssistantQuery(visible_to="ada", sort_by="assistant_id", limit=10))
    assert sorted(a.assistant_id for a in page) == sorted([A1, A3]) and total == 2
    assert await store.count(AssistantQuery(visible_to="bob", metadata={"team": "x"})) == 1
    assert await store.count(AssistantQuery(visible_to="eve")) == 1
    assert await store.count(AssistantQuery()) == 4


async def test_search_filters_sort_and_page(store: AssistantStore) -> None:
    await store.create(make(A1, "echo", name="alpha 100%", metadata={"team": "x", "n": 1, "nested": {"a": [1]}}))
    await asyncio.sleep(0.01)
    await store.create(make(A2, "hitl", name="beta_two", metadata={"team": "x", "n": 2, "none": None}))
    await asyncio.sleep(0.01)
    await store.create(make(A3, "echo", name="gamma", metadata={"team": "y"}))

    async def ids(**query: object) -> list[str]:
        page, _ = await store.search(AssistantQuery(**query))  # type: ignore[arg-type]
        return [a.assistant_id for a in page]

    assert await ids() == [A3, A2, A1]  # created_at, newest first
    assert await ids(sort_by="name", sort_order="asc") == [A1, A2, A3]
    assert await ids(graph_id="echo") == [A3, A1]
    assert await ids(name="ALPHA") == [A1]  # case-insensitive substring
    assert await ids(name="100%") == [A1] and await ids(name="a_t") == [A2] and await ids(name="%") == [A1]
    assert await ids(metadata={"team": "x"}) == [A2, A1]
    assert await ids(metadata={"team": "x", "n": 2}) == [A2]
    assert await ids(metadata={"nested": {"a": [1]}}) == [A1]
    assert await ids(metadata={"none": None}) == [A2]
    assert await ids(metadata={"missing": None}) == []
    assert await ids(metadata={"n": "1"}) == []  # types matter
    page, total = await store.search(AssistantQuery(limit=1, offset=1, sort_by="assistant_id", sort_order="asc"))
    assert [a.assistant_id for a in page] == [A2] and total == 3
    assert await store.count(AssistantQuery(metadata={"team": "x"})) == 2
    assert await store.count(AssistantQuery(graph_id="nope")) == 0


async def test_invalid_queries_are_refused(store: AssistantStore) -> None:
    with pytest.raises(ValueError, match="sort_by"):
        AssistantQuery(sort_by="version")
    with pytest.raises(ValueError, match="metadata filter key"):
        AssistantQuery(metadata={'bad"key': 1})
    with pytest.raises(ValueError, match="metadata filter key"):
        await store.versions(A1, {'bad"key': 1})


async def test_system_assistants(store: AssistantStore) -> None:
    await ensure_system_assistants(store, ["lead", "echo"])
    lead = await store.get(system_assistant_id("lead"))
    assert lead is not None and lead.graph_id == "lead" and lead.metadata == {"created_by": "system"}
    assert lead.version == 1 and lead.name == "lead" and lead.is_system
    assert lead.assistant_id == str(uuid.uuid5(uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8"), "lead"))
    await store.update(lead.assistant_id, AssistantPatch(config={"tags": ["x"]}))
    await ensure_system_assistants(store, ["lead", "echo"])  # idempotent; a patch survives
    patched = await store.get(lead.assistant_id)
    assert patched is not None and patched.version == 2 and patched.config == {"tags": ["x"]}
    assert await store.count(AssistantQuery(metadata={"created_by": "system"})) == 2
    assert not make(A1, "lead").is_system


def test_assistant_key() -> None:
    assert assistant_key("lead") == system_assistant_id("lead")
    assert assistant_key(A1.upper()) == A1  # UUIDs are normalized
