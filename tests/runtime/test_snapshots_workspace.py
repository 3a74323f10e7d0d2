"""Workspace snapshots: capture limits, diffs, restore, and change attribution."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from agentkeel.harness.context import FileTouchRecorder
from agentkeel.runtime.snapshots import (
    ChangeTracker,
    FileDiff,
    acapture_snapshot,
    arestore_snapshot,
    capture_snapshot,
    diff_snapshots,
    restore_snapshot,
)
from agentkeel.sandbox.workspace import to_relpath

BIG = 1 << 20


def write(root: Path, rel: str, data: bytes | str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): (os.readlink(p).encode() if p.is_symlink() else p.read_bytes())
        for p in root.rglob("*")
        if p.is_symlink() or p.is_file()
    }


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    write(root, "notes.md", "hello\n")
    write(root, "src/app/main.py", "print('v1')\n")
    write(root, "src/app/util.py", "X = 1\n")
    write(root, "data/blob.bin", bytes(range(256)) * 4)
    write(root, "outputs/report.txt", "draft")
    return root


def test_capture_hashes_and_keeps_content(ws: Path) -> None:
    snap = capture_snapshot(ws, BIG, BIG)
    assert sorted(snap) == [
        "data/blob.bin", "notes.md", "outputs/report.txt", "src/app/main.py", "src/app/util.py"
    ]
    state = snap["data/blob.bin"]
    assert state.size == 1024 and state.content == bytes(range(256)) * 4
    assert state.sha256 == hashlib.sha256(state.content).hexdigest()
    assert snap.dirs == {"data", "outputs", "src", "src/app"}
    assert snap.uncaptured == []


def test_capture_limits_keep_hashes_drop_content(ws: Path) -> None:
    per_file = capture_snapshot(ws, max_file_bytes=100, max_total_bytes=BIG)
    assert per_file["data/blob.bin"].content is None
    assert per_file["data/blob.bin"].sha256 == hashlib.sha256(bytes(range(256)) * 4).hexdigest()
    assert per_file["notes.md"].content == b"hello\n"
    total = capture_snapshot(ws, max_file_bytes=BIG, max_total_bytes=1030)
    # Sorted order: data/blob.bin (1024) fits, notes.md (6) fits exactly, the rest does not.
    assert total.uncaptured == ["outputs/report.txt", "src/app/main.py", "src/app/util.py"]


def test_missing_root_is_an_empty_workspace(tmp_path: Path) -> None:
    snap = capture_snapshot(tmp_path / "nope", BIG, BIG)
    assert len(snap) == 0 and snap.dirs == frozenset()


def test_symlinks_are_recorded_not_followed(ws: Path, tmp_path: Path) -> None:
    outside = tmp_path / "secret"
    outside.mkdir()
    write(outside, "key", "s3cret")
    os.symlink(outside, ws / "escape")
    os.symlink("notes.md", ws / "alias")
    snap = capture_snapshot(ws, BIG, BIG)
    assert "escape/key" not in snap
    assert snap["escape"].symlink and snap["escape"].content == str(outside).encode()
    assert snap["alias"].symlink and snap["alias"].content == b"notes.md"


def test_diff_reports_added_modified_deleted_sorted(ws: Path) -> None:
    before = capture_snapshot(ws, BIG, BIG)
    write(ws, "src/app/main.py", "print('v2')\n")
    (ws / "notes.md").unlink()
    write(ws, "outputs/new/chart.png", b"\x89PNG\x00\x01")
    after = capture_snapshot(ws, BIG, BIG)
    diffs = diff_snapshots(before, after)
    assert [(d.path, d.change) for d in diffs] == [
        ("notes.md", "deleted"),
        ("outputs/new/chart.png", "added"),
        ("src/app/main.py", "modified"),
    ]
    assert diffs[0].after_sha256 is None and diffs[1].before_sha256 is None
    assert diffs[2].before_sha256 == before["src/app/main.py"].sha256
    assert diffs[2].after_sha256 == after["src/app/main.py"].sha256
    assert diff_snapshots(after, after) == []


async def test_restore_round_trip(ws: Path) -> None:
    original = tree(ws)
    before = await acapture_snapshot(ws, BIG, BIG)
    mode = (ws / "src/app/util.py").stat().st_mode
    write(ws, "src/app/main.py", "print('v2')\n")
    write(ws, "data/blob.bin", b"\x00" * 10)
    (ws / "notes.md").unlink()
    (ws / "outputs/report.txt").unlink()
    (ws / "outputs").rmdir()
    write(ws, "new/deep/dir/file.txt", "added")
    write(ws, "src/extra.py", "pass")
    os.symlink("/etc/passwd", ws / "src/app/util.py.lnk")
    (ws / "src/app/util.py").unlink()
    os.symlink("/etc/hosts", ws / "src/app/util.py")  # a file replaced by a link
    report = await arestore_snapshot(ws, before)
    assert report.complete
    assert sorted(report.deleted) == ["new/deep/dir/file.txt", "src/app/util.py.lnk", "src/extra.py"]
    assert sorted(report.restored) == [
        "data/blob.bin", "notes.md", "outputs/report.txt", "src/app/main.py", "src/app/util.py"
    ]
    assert tree(ws) == original
    assert not (ws / "new").exists() and (ws / "outputs").is_dir()
    assert not (ws / "src/app/util.py").is_symlink() and (ws / "src/app/util.py").stat().st_mode == mode
    assert not [p for p in ws.rglob(".keel-restore-*")]


def test_restore_file_dir_swaps(ws: Path) -> None:
    original = tree(ws)
    before = capture_snapshot(ws, BIG, BIG)
    (ws / "notes.md").unlink()
    write(ws, "notes.md/inner.txt", "now a directory")
    for p in (ws / "src/app").iterdir():
        p.unlink()
    (ws / "src/app").rmdir()
    write(ws, "src/app", "now a file")
    report = restore_snapshot(ws, before)
    assert report.complete and tree(ws) == original


def test_over_limit_content_is_unrestorable(ws: Path) -> None:
    before = capture_snapshot(ws, max_file_bytes=100, max_total_bytes=BIG)
    write(ws, "data/blob.bin", b"changed")
    write(ws, "notes.md", "changed")
    dry = restore_snapshot(ws, before, dry_run=True)
    assert dry.unrestorable == ["data/blob.bin"] and dry.restored == ["notes.md"]
    assert (ws / "notes.md").read_text() == "changed"  # a dry run touches nothing
    report = restore_snapshot(ws, before)
    assert not report.complete and report.unrestorable == ["data/blob.bin"]
    assert (ws / "notes.md").read_text() == "hello\n"
    assert (ws / "data/blob.bin").read_bytes() == b"changed"  # left alone, flagged


def test_restore_does_not_write_through_a_planted_link(ws: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    before = capture_snapshot(ws, BIG, BIG)
    after = capture_snapshot(ws, BIG, BIG)
    # After ``after`` was taken, the outputs directory is swapped for a link out of the workspace.
    (ws / "outputs/report.txt").unlink()
    (ws / "outputs").rmdir()
    os.symlink(outside, ws / "outputs")
    stale_after = dict(after)
    del stale_after["outputs/report.txt"]
    report = restore_snapshot(ws, before, type(after)(stale_after, after.dirs))
    assert report.unrestorable == ["outputs/report.txt"]
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize(
    ("path", "rel"),
    [
        ("/workspace/a/b.txt", "a/b.txt"),
        ("/workspace//a/./b.txt", "a/b.txt"),
        ("a/b.txt", "a/b.txt"),
        ("/workspace/a/../b.txt", "b.txt"),
        ("/workspace/../etc/passwd", None),
        ("/etc/passwd", None),
        ("../x", None),
        ("/workspace", None),
    ],
)
def test_virtual_path_normalisation(path: str, rel: str | None) -> None:
    assert to_relpath(path) == rel


def test_change_tracker_lists_every_touch_and_heads_with_the_last() -> None:
    tracker = ChangeTracker()
    recorder: FileTouchRecorder = tracker  # satisfies the harness protocol
    recorder.touched("/workspace/outputs/report.md", "call_1", "write_file")
    recorder.touched("outputs/report.md", "call_5", "str_replace", "h5")  # the last touch heads the record
    recorder.touched("outputs/report.md", "call_5", "str_replace", "bb")  # the same step again: one step
    recorder.touched("/workspace/src/./a.py", "call_2", "write_file")
    recorder.touched("/etc/passwd", "call_3", "write_file")  # outside: ignored
    diffs = [
        FileDiff("outputs/report.md", "modified", "aa", "bb"),
        FileDiff("src/a.py", "added", None, "cc"),
        FileDiff("tmp/made-by-bash.txt", "added", None, "dd"),
    ]
    seqs = {"call_5": 12, "call_2": 7}
    records = tracker.attribute(diffs, seqs.get)
    assert [(r["path"], r["change"], r["before_sha256"], r["after_sha256"]) for r in records] == [
        ("/workspace/outputs/report.md", "modified", "aa", "bb"),
        ("/workspace/src/a.py", "added", None, "cc"),
        ("/workspace/tmp/made-by-bash.txt", "added", None, "dd"),
    ]
    assert [(r["tool_call_id"], r["tool_name"], r["tool_seq"]) for r in records] == [
        ("call_5", "str_replace", 12),
        ("call_2", "write_file", 7),
        (None, None, None),  # changed outside any reporting tool
    ]
    assert [[(s["tool_call_id"], s["tool_seq"], s["before_sha256"], s["after_sha256"]) for s in r["steps"]]
            for r in records] == [
        [("call_1", None, "aa", None), ("call_5", 12, None, "bb")],  # call_1 reported no hash
        [("call_2", 7, None, None)],
        [],
    ]
