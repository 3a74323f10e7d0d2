"""Path confinement of the per-thread workspace."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentkeel.sandbox.workspace import PathOutsideWorkspace, ReadOnlyMount, Workspace


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    target = tmp_path / "outside"
    target.mkdir()
    (target / "secret.txt").write_text("secret")
    return target


@pytest.fixture
def ws(tmp_path: Path, outside: Path) -> Workspace:
    workspace = Workspace.for_thread(tmp_path / "data", "thread-1")
    root = workspace.real_root
    (root / "a").mkdir()
    (root / "a" / "note.txt").write_text("hello")
    (root / "in_link").symlink_to(root / "a")
    (root / "in_file_link").symlink_to(root / "a" / "note.txt")
    (root / "out_dir").symlink_to(outside)
    (root / "out_file").symlink_to(outside / "secret.txt")
    (root / "dangling_out").symlink_to(outside / "missing.txt")
    (root / "dangling_in").symlink_to(root / "a" / "future.txt")
    (root / "a" / "relative_out").symlink_to("../../../../../outside")
    return workspace


def test_for_thread_layout_and_first_use(tmp_path: Path) -> None:
    ws = Workspace.for_thread(tmp_path, "t1")
    assert ws.root == tmp_path / "threads" / "t1" / "workspace"
    assert not ws.root.exists()
    assert ws.resolve("/workspace") == ws.real_root
    assert (ws.root / "outputs").is_dir() and (ws.root / "uploads").is_dir()


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "../x", ".hidden", "a\0b", "x" * 200])
def test_for_thread_rejects_unsafe_ids(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError):
        Workspace.for_thread(tmp_path, bad)


def test_relative_and_virtual_paths(ws: Workspace) -> None:
    root = ws.real_root
    assert ws.resolve("a/note.txt") == root / "a" / "note.txt"
    assert ws.resolve("/workspace/a/note.txt") == root / "a" / "note.txt"
    assert ws.resolve("./a/../a/./note.txt") == root / "a" / "note.txt"
    assert ws.resolve("outputs/new.md") == root / "outputs" / "new.md"
    assert ws.resolve("") == root
    assert ws.resolve(str(root / "a")) == root / "a"


@pytest.mark.parametrize(
    "path",
    ["..", "../x", "a/../../x", "/workspace/..", "/workspace/../etc/passwd", "a/../.."],
)
def test_dotdot_escapes_are_refused(ws: Workspace, path: str) -> None:
    with pytest.raises(PathOutsideWorkspace, match="workspace"):
        ws.resolve(path)


@pytest.mark.parametrize("path", ["/etc/passwd", "/", "/workspacex/a", "/tmp"])
def test_absolute_host_paths_are_refused(ws: Workspace, path: str) -> None:
    with pytest.raises(PathOutsideWorkspace) as info:
        ws.resolve(path)
    assert repr(path) in str(info.value)
    assert info.value.virtual_path == path


@pytest.mark.parametrize(
    "path",
    ["out_dir", "out_dir/secret.txt", "out_file", "dangling_out", "a/relative_out/secret.txt"],
)
def test_symlinks_pointing_outside_are_refused(ws: Workspace, path: str) -> None:
    with pytest.raises(PathOutsideWorkspace, match="symlink"):
        ws.resolve(path)


def test_symlinks_pointing_inside_are_followed(ws: Workspace) -> None:
    root = ws.real_root
    assert ws.resolve("in_link/note.txt") == root / "a" / "note.txt"
    assert ws.resolve("in_file_link") == root / "a" / "note.txt"
    assert ws.resolve("dangling_in") == root / "a" / "future.txt"


def test_to_virtual(ws: Workspace) -> None:
    assert ws.to_virtual(ws.real_root) == "/workspace"
    assert ws.to_virtual(ws.real_root / "a" / "note.txt") == "/workspace/a/note.txt"
    with pytest.raises(PathOutsideWorkspace):
        ws.to_virtual(Path("/etc/passwd"))


def test_iter_files_lists_regular_files_only(ws: Workspace) -> None:
    (ws.real_root / "outputs" / "r.md").write_text("r")
    assert list(ws.iter_files()) == ["a/note.txt", "outputs/r.md"]


def test_listing_is_bounded(ws: Workspace) -> None:
    listing = ws.listing(max_entries=100)
    assert listing is not None
    assert "a/note.txt" in listing and "out_dir" in listing and "a" not in listing
    assert ws.listing(max_entries=2) is None


_SEGMENTS = st.sampled_from(
    [
        "..",
        ".",
        "",
        "a",
        "workspace",
        "note.txt",
        "in_link",
        "out_dir",
        "out_file",
        "dangling_out",
        "dangling_in",
        "relative_out",
        "loop",
        "etc",
        "passwd",
    ]
)


@pytest.fixture(scope="module")
def shared_ws() -> Iterator[Workspace]:
    """One workspace for all hypothesis examples (function-scoped fixtures are reused anyway)."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        (base / "outside").mkdir()
        ws = Workspace(base / "ws")
        root = ws.real_root
        (root / "a").mkdir()
        (root / "a" / "note.txt").write_text("x")
        (root / "in_link").symlink_to(root / "a")
        (root / "out_dir").symlink_to(base / "outside")
        (root / "out_file").symlink_to("/etc/passwd")
        (root / "dangling_out").symlink_to(base / "outside" / "nope")
        (root / "dangling_in").symlink_to("a/nope")
        (root / "a" / "relative_out").symlink_to("../..")
        (root / "loop").symlink_to("loop")
        yield ws


@settings(max_examples=400, deadline=None)
@given(
    absolute=st.booleans(),
    segments=st.lists(_SEGMENTS, max_size=8),
)
def test_resolved_paths_always_stay_inside(
    shared_ws: Workspace, absolute: bool, segments: list[str]
) -> None:
    path = ("/" if absolute else "") + "/".join(segments)
    try:
        resolved = shared_ws.resolve(path)
    except PathOutsideWorkspace:
        return
    root = shared_ws.real_root
    assert Path(os.path.realpath(resolved)).is_relative_to(root)
    assert resolved.is_relative_to(root)


def test_a_read_only_mount_confines_like_the_workspace_under_its_own_root(tmp_path: Path, outside: Path) -> None:
    mount = ReadOnlyMount(tmp_path / "skills", "/skills")
    with pytest.raises(FileNotFoundError):  # never created: the directory is the deployment's
        mount.resolve("/skills/a")
    assert not (tmp_path / "skills").exists()
    (tmp_path / "skills" / "pdf").mkdir(parents=True)
    (tmp_path / "skills" / "pdf" / "out").symlink_to(outside)
    root = mount.real_root
    assert not mount.writable and Workspace(tmp_path).writable
    assert mount.contains("/skills") and mount.contains("/skills/pdf") and not mount.contains("/skillsx")
    assert mount.resolve("/skills/pdf/SKILL.md") == root / "pdf" / "SKILL.md"
    assert mount.to_virtual(root / "pdf") == "/skills/pdf"
    for path, reason in [("/skills/..", "climbs above /skills"), ("/skills/pdf/out/secret.txt", "symlink"),
                         ("/workspace/a", "outside /skills")]:
        with pytest.raises(PathOutsideWorkspace, match=reason) as info:
            mount.resolve(path)
        assert "(only /skills is allowed)" in str(info.value)
