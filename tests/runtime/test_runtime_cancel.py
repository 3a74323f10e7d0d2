"""Cancelling runs: a slow shell command is killed with its process group, cancel is idempotent,
and ``action=rollback`` undoes what the run did."""

from __future__ import annotations

import os

from runtime_support import (
    FAST,
    FULL_MATRIX,
    UNGATED,
    Keel,
    backend_matrix,
    call,
    data_events,
    describe,
    finished,
    finished_and_deleted,
    new_thread_id,
    poll_gone,
    run_to_end,
    start,
    stored,
    stream_events,
    thread_messages,
    thread_status,
    turn,
    wait_status,
    wait_until,
    workspace,
)

from agentkeel.runtime.bridge import EventKind
from agentkeel.runtime.manager import CancelOutcome
from agentkeel.runtime.records import RunStatus

pytestmark = backend_matrix(FULL_MATRIX)

# The shell records its own pid (the process group leader: every command runs in a new session)
# and then sleeps far longer than the test.
SLOW_BASH = [
    turn("Running the long job.", call("bash", "call_sleep", command="echo started > pid; sleep 31.5")),
    turn("Never said."),
]


def host_pid_of(argv: bytes) -> int | None:
    """The host pid of the process running exactly ``argv`` (NUL-separated): a sandboxed command
    only knows its pid inside its own pid namespace."""
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and open(f"/proc/{entry}/cmdline", "rb").read() == argv:
                return int(entry)
        except OSError:
            continue
    return None


async def test_cancel_during_a_slow_bash_command_kills_its_process_group(keel: Keel) -> None:
    config = keel.config({"bash": SLOW_BASH}, tools={"bash": True})
    thread = new_thread_id("cancel")
    pid_file = workspace(config, thread) / "pid"
    async with keel.open(config) as rt:
        run = await start(rt, thread, "run the job")
        await wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the pid file")
        pid = await wait_until(lambda: host_pid_of(b"sleep\x0031.5\x00"), what="the sleeping command")
        os.kill(pid, 0)  # alive: the command is running
        assert (await stored(rt, run.run_id)).status == RunStatus.running

        assert await rt.manager.cancel(run.run_id) == CancelOutcome.cancelled
        done = await finished(rt, run.run_id)
        assert done.status == RunStatus.interrupted
        assert done.stop_reason == "cancelled"
        (entry,) = done.stop_reasons
        assert (entry["class"], entry["source"], entry["data"]["action"]) == ("cancellation", "manager", "interrupt")
        assert await poll_gone(pid, timeout=2.0) < 2.0
        assert (await thread_status(rt, thread)) == "interrupted"

        items = await stream_events(rt, run.run_id)
        assert items[-1].kind is EventKind.end
        assert [e.data["code"] for e in data_events(items, "stop_reason")] == ["cancelled"]
        assert rt.manager.in_flight == 0


async def test_cancel_is_idempotent_and_answers_for_finished_and_unknown_runs(keel: Keel) -> None:
    config = keel.config({"fast": FAST, "slow": [turn("late", delay_ms=20_000)]})
    thread = new_thread_id("idem")
    async with keel.open(config) as rt:
        ok = await run_to_end(rt, thread, "quick")
        assert ok.status == RunStatus.success
        assert await rt.manager.cancel(ok.run_id) == CancelOutcome.already_finished
        assert (await stored(rt, ok.run_id)).to_dict() == ok.to_dict()  # untouched
        assert await rt.manager.cancel("no-such-run") == CancelOutcome.not_found

        slow = await start(rt, thread, "slow", model_name="slow")
        await wait_status(rt, slow.run_id, RunStatus.running)
        assert await rt.manager.cancel(slow.run_id) == CancelOutcome.cancelled
        # A second request while it is still stopping is the same answer, and changes nothing.
        assert await rt.manager.cancel(slow.run_id, action="rollback") == CancelOutcome.cancelled
        done = await finished(rt, slow.run_id)
        assert done.status == RunStatus.interrupted and done.stop_reason == "cancelled"
        assert len(done.stop_reasons) == 1  # the second cancel did not add a reason...
        assert done.stop_reasons[0]["data"]["action"] == "interrupt"  # ...nor turn it into a rollback
        # And once it has ended.
        assert await rt.manager.cancel(slow.run_id) == CancelOutcome.cancelled
        assert await rt.manager.cancel(slow.run_id, action="rollback") == CancelOutcome.cancelled
        after = await rt.store.get(slow.run_id)
        assert after is not None and after.to_dict() == done.to_dict()
        ends = [i for i in await stream_events(rt, slow.run_id) if i.kind is EventKind.end]
        assert len(ends) == 1


async def test_cancel_with_rollback_restores_files_and_checkpoints_and_deletes_the_run(keel: Keel) -> None:
    config = keel.config({
        "fast": [turn("baseline done")],
        "stuck": [
            turn("Writing.",
                 call("write_file", "call_new", path="/workspace/outputs/new.md", content="new\n"),
                 call("str_replace", "call_edit", path="/workspace/keep.txt", old="original", new="edited")),
            turn("Never said.", delay_ms=20_000),
        ],
    }, limits=UNGATED)
    thread = new_thread_id("cancelrb")
    root = workspace(config, thread)
    (root / "keep.txt").write_text("original\n")
    async with keel.open(config) as rt:
        await run_to_end(rt, thread, "baseline")
        before = await thread_messages(rt, thread)
        run = await start(rt, thread, "doomed", model_name="stuck")

        async def tools_done() -> bool:
            return len(await thread_messages(rt, thread)) >= len(before) + 4

        await wait_until(tools_done, what="the run's tool results")
        assert (root / "keep.txt").read_text() == "edited\n" and (root / "outputs" / "new.md").exists()

        assert await rt.manager.cancel(run.run_id, action="rollback") == CancelOutcome.cancelled
        await finished_and_deleted(rt, run.run_id)
        assert await rt.store.get(run.run_id) is None
        assert await rt.journal.list(run.run_id) == []  # a deleted run takes its journal along
        assert (await thread_status(rt, thread)) == "idle"  # back to its pre-run state
        assert [r.run_id for r in await rt.store.list_runs(thread_id=thread)] != []
        assert run.run_id not in {r.run_id for r in await rt.store.list_runs(thread_id=thread)}
        assert (root / "keep.txt").read_text() == "original\n"
        assert not (root / "outputs" / "new.md").exists()
        after = await thread_messages(rt, thread)
        assert [m.id for m in after] == [m.id for m in before]
        assert describe(after) == describe(before)
        items = await stream_events(rt, run.run_id)
        assert items[-1].kind is EventKind.end
        assert [e.data["code"] for e in data_events(items, "stop_reason")] == ["rolled_back"]
        # The thread is usable afterwards, from the restored state.
        again = await run_to_end(rt, thread, "again")
        assert again.status == RunStatus.success, again.error
        assert describe(await thread_messages(rt, thread)) == [
            *describe(before), ("human", "again"), ("ai", "baseline done"),
        ]
