"""The console's step diffs (``gateway/console/diffs.py``): text replayed from the recorded tool
calls, each step checked against its recorded hash, and nothing shown as true that is not."""

from __future__ import annotations

from typing import Any

from agentkeel.gateway.console.diffs import file_diffs, sha256_text

PATH = "/workspace/a.md"


def _step(call_id: str, tool: str, after: str | None) -> dict[str, Any]:
    return {"tool_call_id": call_id, "tool_name": tool, "tool_seq": 1,
            "before_sha256": None, "after_sha256": sha256_text(after) if after is not None else None}


def _change(kind: str, steps: list[dict[str, Any]], after: str | None = None) -> dict[str, Any]:
    return {"path": PATH, "change": kind, "before_sha256": None if kind == "added" else "x" * 64,
            "after_sha256": sha256_text(after) if after is not None else None, "steps": steps, "seq": 9}


def _none(_path: str, _sha: str) -> str | None:
    return None


def test_an_added_file_is_replayed_step_by_step_and_each_step_verified() -> None:
    calls = {"c1": {"name": "write_file", "args": {"path": PATH, "content": "one\ntwo\n"}},
             "c2": {"name": "str_replace", "args": {"path": PATH, "old": "two", "new": "2"}},
             "c3": {"name": "write_file", "args": {"path": PATH, "content": "three\n", "append": True}}}
    change = _change("added", [_step("c1", "write_file", "one\ntwo\n"), _step("c2", "str_replace", "one\n2\n"),
                               _step("c3", "write_file", "one\n2\nthree\n")], after="one\n2\nthree\n")
    (result,) = file_diffs([change], calls, _none)
    assert [s["verified"] for s in result["steps"]] == [True, True, True]
    assert [s["diff_kind"] for s in result["steps"]] == ["full", "full", "full"]
    assert "-two\n+2\n" in result["steps"][1]["diff"] and "+three\n" in result["steps"][2]["diff"]
    assert result["before_known"] and result["after_known"]
    assert "+one\n+2\n+three\n" in result["diff"]


def test_a_replay_that_does_not_match_its_hash_is_not_shown_and_ends_the_known_text() -> None:
    calls = {"c1": {"name": "write_file", "args": {"path": PATH, "content": "what the model sent\n"}},
             "c2": {"name": "str_replace", "args": {"path": PATH, "old": "sent", "new": "meant"}}}
    change = _change("added", [_step("c1", "write_file", "what the file really held\n"),
                               _step("c2", "str_replace", "something else\n")])
    (result,) = file_diffs([change], calls, _none)
    first, second = result["steps"]
    assert first["verified"] is False and first["diff"] is None
    # The text is unknown from there on: the edit is shown as the fragment it replaced, unverified.
    assert second["verified"] is None and second["diff_kind"] == "fragment"
    assert "-what the model sent\n" not in second["diff"] and "-sent\n+meant\n" in second["diff"]
    assert result["diff"] is None and not result["after_known"]


def test_an_unknown_start_shows_fragments_and_whole_writes_and_the_workspace_ends_it() -> None:
    calls = {"c1": {"name": "str_replace", "args": {"path": PATH, "old": "old", "new": "new"}},
             "c3": {"name": "write_file", "args": {"path": PATH, "content": "final\n"}}}
    steps = [_step("c1", "str_replace", "?"), _step("c2", "bash", None), _step("c3", "write_file", "final\n")]
    (result,) = file_diffs([_change("modified", steps, after="final\n")], calls, _none)
    fragment, shell, whole = result["steps"]
    assert fragment["diff_kind"] == "fragment" and fragment["verified"] is None
    assert shell["diff"] is None and shell["verified"] is None
    assert whole["verified"] is True and "(before (not recorded))" in whole["diff"] and "+final\n" in whole["diff"]
    assert not result["before_known"] and result["diff"] is None  # no "before" for the run as a whole

    def workspace(path: str, sha: str) -> str | None:
        return "from disk\n" if sha == sha256_text("from disk\n") else None

    (unreplayed,) = file_diffs([_change("added", [_step("c9", "bash", None)], after="from disk\n")], {}, workspace)
    assert unreplayed["after_known"] and "+from disk\n" in unreplayed["diff"]
    (deleted,) = file_diffs([_change("deleted", [])], {}, _none)
    assert deleted["after_known"] and deleted["diff"] is None  # before unknown: no diff to show
