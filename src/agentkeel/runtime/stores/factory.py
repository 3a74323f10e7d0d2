"""Open the stores on what the connection layer opened: runs, journal and assistants, migrated."""

from __future__ import annotations

from typing import NamedTuple

from agentkeel.runtime.connections import Connections
from agentkeel.runtime.stores.assistants import AssistantStore
from agentkeel.runtime.stores.base import JournalStore, RunStore
from agentkeel.runtime.stores.memory import MemoryJournalStore, MemoryRunStore
from agentkeel.runtime.stores.memory_assistants import MemoryAssistantStore
from agentkeel.runtime.stores.sql import SqlRunStore
from agentkeel.runtime.stores.sql_assistants import SqlAssistantStore
from agentkeel.runtime.stores.sql_journal import SqlJournalStore


class Stores(NamedTuple):
    runs: RunStore
    journal: JournalStore
    assistants: AssistantStore


async def open_stores(connections: Connections) -> Stores:
    """The three stores of ``connections``' database, its schema migrated before this returns.

    The SQL stores share one engine, so deleting a run or thread removes its journal in the same
    transaction. Closing them releases nothing: ``open_connections`` owns the connections.
    """
    if connections.sql is None:
        journal = MemoryJournalStore()
        return Stores(MemoryRunStore(journal), journal, MemoryAssistantStore())
    db = connections.sql
    await db.setup()
    return Stores(SqlRunStore(db), SqlJournalStore(db), SqlAssistantStore(db))
