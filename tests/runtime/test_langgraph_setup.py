"""Processes starting together on a fresh PostgreSQL database all run LangGraph's ``setup()``.

Found by ``benchmarks/workers.py``: a gateway and workers started at once, and one of them died
at start-up with ``deadlock detected`` (concurrent ``CREATE INDEX CONCURRENTLY`` in the
checkpointer's and the key-value store's migrations). Each opener here has its own pool, as each
process does.
"""

from __future__ import annotations

import asyncio

import pytest

from agentkeel.database import Database
from agentkeel.runtime.checkpoints.savers import open_checkpointer
from agentkeel.runtime.connections import open_connections
from agentkeel.runtime.kvstore import open_kv_store

pytestmark = pytest.mark.postgres


async def test_concurrent_setups_on_a_fresh_database_all_succeed(fresh_pg_url: str) -> None:
    async def start_one() -> None:
        async with (
            open_connections(Database.parse(fresh_pg_url)) as connections,
            open_checkpointer(connections),
            open_kv_store(connections),
        ):
            pass

    results = await asyncio.gather(*(start_one() for _ in range(4)), return_exceptions=True)
    assert [r for r in results if r is not None] == []
