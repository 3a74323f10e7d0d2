"""Property: restoring the "before" snapshot brings back every path it could, and exactly "before"
whenever nothing was unrestorable — for random small trees of files, links and directories."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from agentkeel.runtime.snapshots import capture_snapshot, restore_snapshot

Tree = tuple[dict[str, bytes | str], set[str]]  # files (bytes) and links (str target), empty dirs

segments = st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3).map("/".join)
entry = st.one_of(st.binary(max_size=24), st.sampled_from(["a", "../b", "/etc/hosts"]))


@st.composite
def trees(draw: st.DrawFn) -> Tree:
    files = draw(st.dictionaries(segments, entry, max_size=6))
    # A path cannot be both a file and a directory: drop files that are parents of others.
    files = {p: v for p, v in files.items() if not any(o.startswith(p + "/") for o in files)}
    dirs = {
        d
        for d in draw(st.sets(segments, max_size=3))
        if not any(f == d or f.startswith(d + "/") or d.startswith(f + "/") for f in files)
    }
    return files, dirs


def materialize(root: Path, tree: Tree) -> None:
    if root.exists():
        shutil.rmtree(root)
    root.mkdir()
    files, dirs = tree
    for d in dirs:
        (root / d).mkdir(parents=True, exist_ok=True)
    for rel, value in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(value, str):
            os.symlink(value, path)
        else:
            path.write_bytes(value)


@settings(max_examples=120, deadline=None)
@given(
    before=trees(),
    after=trees(),
    max_file_bytes=st.sampled_from([0, 8, 1 << 10]),
    pass_after=st.booleans(),
)
def test_restore_returns_to_before(before: Tree, after: Tree, max_file_bytes: int, pass_after: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ws"
        materialize(root, before)
        snap_before = capture_snapshot(root, max_file_bytes, 1 << 20)
        materialize(root, after)
        snap_after = capture_snapshot(root, 0, 0) if pass_after else None
        report = restore_snapshot(root, snap_before, snap_after)
        now = capture_snapshot(root, 1 << 20, 1 << 20)

        unrestorable = set(report.unrestorable)
        assert unrestorable <= set(snap_before.uncaptured)
        assert not set(now) - set(snap_before)  # everything added was deleted
        for path, state in snap_before.items():
            if path not in unrestorable:
                got = now[path]
                assert (got.sha256, got.symlink) == (state.sha256, state.symlink), path
        if report.complete:
            assert set(now) == set(snap_before)
            assert now.dirs == snap_before.dirs
        assert not any(".keel-restore-" in p for p in now)
