"""Children run under their run's lease and fence: an owner that loses its lease stops them too.

A subagent is a nested graph inside its parent's tool step, so whatever stops the run's task
stops its children with it; this checks the worst moment — children mid-call when the owner can
no longer confirm its lease — ends with no child running, no child result or stream event written
by the fenced attempt, and the run recovered once with the ownership reason.
"""

from __future__ import annotations

from typing import Any

import pytest
from runtime_support import Keel, _param, backend_matrix, call, new_thread_id, start, turn, wait_status, wait_until

from agentkeel.runtime.records import RunStatus

LEAD = [turn("Delegating.", *[call("task", f"t{i}", description=f"part {i}", prompt=f"Do part {i}.",
                                   subagent_type="general-purpose") for i in (1, 2)])]
SLOW_CHILD = [turn("Part done.", delay_ms=6000)]


@backend_matrix([_param("sqlite", "memory")])
async def test_an_owner_that_loses_its_lease_stops_its_children_and_writes_nothing(
    keel: Keel, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = keel.config({"m": {"lead": LEAD, "general-purpose": SLOW_CHILD}}, limits={"lease_ttl_s": 1})
    async with keel.open(cfg) as rt:
        capacity = rt.harness.subagent_capacity
        run = await start(rt, new_thread_id("fenced-children"), "hi")
        await wait_until(lambda: capacity.running == 2, timeout=10)

        async def starts_stored() -> bool:  # flushed by the journal's timer, before the lease is cut:
            # on a stalled loop the lease deadline could otherwise pass before that timer fires
            return len(await rt.journal.list(run.run_id, kinds=["subagent.start"])) == 2

        await wait_until(starts_stored, timeout=10, what="both subagent.start events stored")

        async def unreachable(*_args: Any, **_kwargs: Any) -> None:
            raise ConnectionError("database unreachable")

        monkeypatch.setattr(rt.store, "renew_leases", unreachable)
        record = await wait_status(rt, run.run_id, RunStatus.error, timeout=15)
        assert capacity.running == 0  # both children stopped with their run
        assert record.stop_reason == "worker_lost" and record.attempt == 2
        events = await rt.journal.list(run.run_id)
        # The children started under attempt 1; the fenced attempt recorded neither their end nor
        # their reasons (its journal refuses writes once fenced).
        assert sorted(e.data["task_id"] for e in events if e.kind == "subagent.start") == ["t1", "t2"]
        assert [e for e in events if e.kind == "subagent.end"] == []
        assert not any(r["source"].startswith("subagent:") for r in record.stop_reasons)
