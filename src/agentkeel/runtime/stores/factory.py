"""Open the run and journal stores a database URL names, ready to use."""

from __future__ import annotations

from agentkeel.runtime.stores.base import JournalStore, RunStore
from agentkeel.runtime.stores.memory import MemoryJournalStore, MemoryRunStore
from agentkeel.runtime.stores.sql import SqlRunStore
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
