"""What a run's start reads of its thread: the head, once (the rollback capture's read serves the graph)."""

from __future__ import annotations

from typing import Any

from runtime_support import LIGHT_MATRIX, Keel, backend_matrix, new_thread_id, run_to_end, turn

from agentkeel.runtime.records import RunStatus


@backend_matrix(LIGHT_MATRIX)
async def test_a_run_on_a_thread_with_history_reads_its_head_once_before_writing(keel: Keel) -> None:
    """The rollback capture's read of the head is the one the graph starts from: before the run's
    first checkpoint write, the process's saver is asked for the head once, not twice."""
    config = keel.config({"m": [turn("Noted.")]})
    async with keel.open(config) as rt:
        thread = new_thread_id("head-once")
        assert (await run_to_end(rt, thread, "one")).status is RunStatus.success
        saver = rt.checkpointer
        head_reads: list[int] = []
        writes: list[int] = []
        read, put = saver.aget_tuple, saver.aput

        async def counted_read(config: Any) -> Any:
            given = config["configurable"]
            if given.get("thread_id") == thread and not given.get("checkpoint_ns") and not given.get("checkpoint_id"):
                head_reads.append(len(writes))
            return await read(config)

        async def counted_put(*args: Any, **kwargs: Any) -> Any:
            writes.append(1)
            return await put(*args, **kwargs)

        saver.aget_tuple, saver.aput = counted_read, counted_put  # type: ignore[method-assign]
        try:
            second = await run_to_end(rt, thread, "two")
        finally:
            del saver.aget_tuple, saver.aput
        assert second.status is RunStatus.success
        assert writes, "the run wrote no checkpoint"
        assert head_reads.count(0) == 1, head_reads  # head reads before the first write
        # ...and the run went on from that head: the thread holds both turns, in order.
        state = await (await rt.accessor()).aget(thread)
        assert state is not None
        contents = [m.content for m in state.values["messages"]]
        assert len(contents) == 4 and contents[0::2] == ["one", "two"], contents
