"""Open the stores a database URL names (runs and journal; assistants), ready to use."""

from __future__ import annotations

from agentkeel.runtime.assistants import AssistantStore, MemoryAssistantStore
from agentkeel.runtime.stores.base import JournalStore, RunStore
from agentkeel.runtime.stores.memory import MemoryJournalStore, MemoryRunStore
from agentkeel.runtime.stores.sql import SqlRunStore
from agentkeel.runtime.stores.sql_assistants import SqlAssistantStore
from agentkeel.runtime.stores.sql_engine import SqlDatabase
from agentkeel.runtime.stores.sql_journal import SqlJournalStore

MEMORY_URL = "memory://"


async def open_stores(database_url: str) -> tuple[RunStore, JournalStore]:
    """``memory://``, ``sqlite:///path`` (parent directory created) or ``postgresql://...``.

    The schema is migrated before this returns. Both SQL stores share one engine, so deleting a run
    or thread removes its journal in the same transaction.
    """
    if database_url == MEMORY_URL:
        journal = MemoryJournalStore()
        return MemoryRunStore(journal), journal
    db = SqlDatabase(database_url)
    run_store, journal_store = SqlRunStore(db), SqlJournalStore(db)
    try:
        await run_store.setup()
    except BaseException:
        await db.close()
        raise
    return run_store, journal_store


async def open_assistant_store(database_url: str) -> AssistantStore:
    """The assistant store for ``database_url`` (same URLs as ``open_stores``), migrated.

    It has its own engine (``open_stores`` does not hand out the run stores'); two engines on one
    database are safe, SQLite's ``BEGIN IMMEDIATE`` and busy timeout serialise their writers.
    """
    if database_url == MEMORY_URL:
        return MemoryAssistantStore()
    db = SqlDatabase(database_url)
    store = SqlAssistantStore(db)
    try:
        await store.setup()
    except BaseException:
        await db.close()
        raise
    return store
