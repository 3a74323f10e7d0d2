"""Synthetic ``subagent.start`` / ``subagent.end`` journal records, shaped as the executor writes
them, for the tests of a run's children (ledger, CLI, run resource).

Four children: ``t-done`` (completed, clean), ``t-capped`` (completed with ``loop_capped``; it
ends before ``t-done`` although it started after it, so start order and end order differ),
``t-cancel`` (cancelled) and ``t-open`` (started, no end).
"""

from __future__ import annotations

from typing import Any

from agentkeel.runtime.stores.base import JournalEvent

# task id -> what the tests expect of its item (status when the run has ended)
EXPECTED = {
    "t-done": {"subagent_type": "researcher", "status": "completed", "stop_reason": None, "turns": 3},
    "t-capped": {"subagent_type": "coder", "status": "completed", "stop_reason": "loop_capped", "turns": 9},
    "t-cancel": {"subagent_type": "researcher", "status": "cancelled", "stop_reason": "cancelled", "turns": 1},
    "t-open": {"subagent_type": "coder", "status": "unfinished", "stop_reason": None, "turns": None},
}
START_ORDER = ["t-done", "t-capped", "t-cancel", "t-open"]


def usage(inp: int, out: int, calls: int) -> dict[str, int]:
    return {"input_tokens": inp, "output_tokens": out, "total_tokens": inp + out, "calls": calls}


def reason(code: str, klass: str, seq: int, detail: str) -> dict[str, Any]:
    return {"code": code, "class": klass, "source": "LoopDetection", "seq": seq, "detail": detail, "data": {}}


def start(task_id: str, kind: str, description: str) -> tuple[str, str, dict[str, Any]]:
    return ("subagent.start", f"subagent:{kind}", {
        "task_id": task_id, "subagent_type": kind, "description": description, "model": "fast",
        "depth": 1, "queued_s": 0.01,
    })


def end(task_id: str, kind: str, description: str, status: str, **fields: Any) -> tuple[str, str, dict[str, Any]]:
    reasons = fields.pop("stop_reasons", [])
    return ("subagent.end", f"subagent:{kind}", {
        "task_id": task_id, "subagent_type": kind, "description": description, "status": status,
        "stop_reason": reasons[0]["code"] if reasons else None, "stop_reasons": reasons,
        "usage": usage(100, 20, 1), "model": "fast", "files_changed": [], "brief": f"{description}: done",
        "sha256": "ab" * 32, "turns": 1, "duration_s": 0.5, "error": None, **fields,
    })


def child_records() -> list[tuple[str, str, dict[str, Any]]]:
    """``(kind, caller, data)`` in journal order, with unrelated records between them."""
    return [
        start("t-done", "researcher", "Find the sources"),
        start("t-capped", "coder", "Fix the parser"),
        ("model.call", "subagent:researcher", {"model": "fast", "input_tokens": 5, "output_tokens": 1}),
        ("file.changed", "worker", {"path": "/workspace/src/parser.py", "change": "modified",
                                    "agent": "subagent:coder/t-capped"}),
        end("t-capped", "coder", "Fix the parser", "completed", turns=9, usage=usage(1200, 300, 9),
            files_changed=["/workspace/src/parser.py"],
            stop_reasons=[reason("loop_capped", "loop", 4, "the same edit repeated 5 times")]),
        end("t-done", "researcher", "Find the sources", "completed", turns=3, usage=usage(800, 150, 3)),
        start("t-cancel", "researcher", "Look further"),
        end("t-cancel", "researcher", "Look further", "cancelled", turns=1, error="cancelled by the parent run",
            stop_reasons=[reason("cancelled", "cancellation", 2, "the parent run was cancelled")]),
        start("t-open", "coder", "Write the tests"),
    ]


def events(run_id: str, thread_id: str, records: list[tuple[str, str, dict[str, Any]]] | None = None,
           first_seq: int = 1) -> list[JournalEvent]:
    """The records as journal events of one run, seqs from ``first_seq``."""
    return [
        JournalEvent(run_id=run_id, thread_id=thread_id, seq=first_seq + index, kind=kind, data=data, caller=caller)
        for index, (kind, caller, data) in enumerate(records if records is not None else child_records())
    ]
