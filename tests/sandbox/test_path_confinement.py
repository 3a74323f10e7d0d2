"""Path confinement as a property: whatever path the model sends, nothing outside the workspace is
resolved to, read, or changed.

The generated paths mix ``..``, absolute host paths (the workspace's own host path, its parent, a
sibling whose name shares its prefix, the host root), ``/workspace`` prefixes, repeated slashes,
unicode look-alikes and normalisation variants (NFC/NFD/NFKC/NFKD, fullwidth and leader dots),
NUL bytes, and the links an agent could plant itself: symlinks to outside directories and files
(absolute, relative, dangling, looping) and a hard link to a host file. Each example may also
plant a fresh symlink of its own choosing before the tools run. An escape is a resolved path
outside the real root, a read that returns a host file's content, or any change outside the
workspace.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.tools import ToolException

from agentkeel.harness.context import RunContext
from agentkeel.harness.tools import files
from agentkeel.harness.tools.bounds import Deadline
from agentkeel.harness.tools.files import read_file, str_replace, write_file
from agentkeel.sandbox.workspace import PathOutsideWorkspace, Workspace

T = TypeVar("T")
HOST_SECRET = "HOSTSECRET"
EXAMPLES = int(os.environ.get("CONFINEMENT_EXAMPLES", "10000"))
PATHS_PER_EXAMPLE = 25  # a batch per example: hypothesis's own overhead is per example
COUNTED: list[str] = []  # every path the property tried (hypothesis may stop early on a duplicate space)


@dataclass
class Setup:
    base: Path
    ws: Workspace
    root: Path
    outside: Path
    runtime: Any
    loop: asyncio.AbstractEventLoop

    def outside_fingerprint(self) -> set[tuple[str, int, int, int]]:
        """Every entry outside the workspace under ``base``: path, inode, size, mtime."""
        seen: set[tuple[str, int, int, int]] = set()
        for directory, dirs, names in os.walk(self.base):
            if Path(directory) == self.root:
                dirs.clear()
                continue
            for name in dirs + names:
                entry = os.path.join(directory, name)
                if Path(entry) == self.root:  # its own mtime changes with what is written inside
                    continue
                info = os.lstat(entry)
                seen.add((entry, info.st_ino, info.st_size, info.st_mtime_ns))
        return seen


@pytest.fixture(scope="module")
def setup() -> Iterator[Setup]:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp).resolve()
        outside = base / "outside"
        outside.mkdir()
        (outside / "secret.txt").write_text(f"{HOST_SECRET} host\n")
        (outside / "host.txt").write_text(f"{HOST_SECRET} hard-linked host\n")
        ws = Workspace.for_thread(base / "data", "t1")
        root = ws.real_root
        sibling = root.parent / "workspace2"  # shares the root's name as a prefix
        sibling.mkdir()
        (sibling / "secret.txt").write_text(f"{HOST_SECRET} sibling\n")
        (root / "a").mkdir()
        (root / "a" / "note.txt").write_text("inside host\n")
        (root / "out_dir").symlink_to(outside)
        (root / "out_file").symlink_to(outside / "secret.txt")
        (root / "out_rel").symlink_to("../../../../outside")
        (root / "a" / "up").symlink_to("../..")
        (root / "dangling").symlink_to(outside / "new.txt")
        (root / "to_root").symlink_to("/")
        (root / "loop").symlink_to("loop")
        (root / "sib").symlink_to(sibling)
        os.link(outside / "host.txt", root / "hard")
        loop = asyncio.new_event_loop()
        ctx = RunContext(thread_id="t1", run_id="r1", workspace_root=ws.root)
        runtime = SimpleNamespace(context=ctx, tool_call_id="call-1")
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(files, "off_loop", inline)
            try:
                yield Setup(base, ws, root, outside, runtime, loop)
            finally:
                loop.close()


async def inline(tool: str, limit_s: float, work: Callable[[Deadline], T]) -> T:
    """The tools' work run in place: the file-system code under test is the same, and 10,000
    paths are tried in seconds instead of paying a thread start per call."""
    return work(Deadline(tool, limit_s))


SEGMENTS = [
    "..", ".", "", "a", "note.txt", "out_dir", "out_file", "out_rel", "up", "dangling", "to_root",
    "loop", "sib", "hard", "agent_link", "secret.txt", "host.txt", "workspace", "workspace2", "data",
    "threads", "t1", "outside", "etc", "\uff0e\uff0e", "\uff0e", "\u2024\u2024", "\u2025", ".\u0301",
    "e\u0301", "\u00e9", "%2e%2e", "..\\..", "\u202e..", "\uff0f", "a\0b", "~", "new.txt",
]
PIECES = [segment + separator for segment in SEGMENTS for separator in ("/", "//", "/./")]
TARGETS = ["/", "..", "../..", "../../../..", "../../../../outside", "out_dir/secret.txt", "a", "agent_link"]


def prefixes(setup: Setup) -> list[str]:
    root = str(setup.root)
    return [
        "", "./", "/", "//", "/workspace", "/workspace/", "//workspace//", "/workspace/../",
        "/workspace/./", "/workspace2/", "/WORKSPACE/", root + "/", root + "//", root + "2/",
        str(setup.root.parent) + "/", str(setup.outside) + "/", str(setup.base) + "/", "/tmp/", "\0/",
    ]


@st.composite
def paths(draw: st.DrawFn, setup: Setup) -> str:
    prefix = draw(st.sampled_from(prefixes(setup)))
    path = prefix + "".join(draw(st.lists(st.sampled_from(PIECES), max_size=8))).rstrip("/")
    form = draw(st.sampled_from([None, "NFC", "NFD", "NFKC", "NFKD"]))
    return unicodedata.normalize(form, path) if form else path


def plant_agent_link(setup: Setup, target: str | None) -> None:
    """The symlink an agent could create with bash before calling a file tool."""
    link = setup.root / "agent_link"
    if link.is_symlink() or link.is_file():
        link.unlink()
    if target is not None and not link.exists():  # an earlier write may have made it a directory
        link.symlink_to(target)


def check_resolve(setup: Setup, path: str) -> None:
    try:
        real = setup.ws.resolve(path)
    except (PathOutsideWorkspace, ValueError):
        return
    assert real.is_relative_to(setup.root), f"{path!r} resolved outside: {real}"
    assert Path(os.path.realpath(real)) == real, f"{path!r} resolved to a path with links: {real}"


async def run_tools(setup: Setup, paths: list[str], append: bool) -> list[Any]:
    """read_file's result (None for a tool error) for every path, after which write_file and
    str_replace are tried on each."""

    async def attempt(tool: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await tool(*args, runtime=setup.runtime, **kwargs)
        except ToolException:
            return None

    reads = [await attempt(read_file, path) for path in paths]
    for path in paths:
        await attempt(write_file, path, "agent wrote this\n", append=append)
        await attempt(str_replace, path, "host", "HACKED", replace_all=True)
    return reads


@settings(
    max_examples=EXAMPLES // PATHS_PER_EXAMPLE,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_no_generated_path_escapes_the_workspace(setup: Setup, data: st.DataObject) -> None:
    plant_agent_link(setup, data.draw(st.sampled_from([None, *TARGETS]), label="agent link"))
    batch = data.draw(st.lists(paths(setup), min_size=PATHS_PER_EXAMPLE, max_size=PATHS_PER_EXAMPLE), label="paths")
    before = setup.outside_fingerprint()
    for path in batch:
        check_resolve(setup, path)
    append = data.draw(st.booleans(), label="append")
    reads = setup.loop.run_until_complete(run_tools(setup, batch, append))
    for path, read in zip(batch, reads, strict=True):
        assert read is None or HOST_SECRET not in read[0], f"read_file({path!r}) returned a host file"
    assert setup.outside_fingerprint() == before, f"a tool call on one of {batch!r} changed a file outside"
    COUNTED.extend(batch)


def test_the_hard_link_and_host_files_are_untouched_after_all_examples(setup: Setup) -> None:
    """Runs after the property (same module fixture): every generated path was tried, the planted
    hard link still shares the host file, and no example changed a host file's content."""
    assert len(COUNTED) >= EXAMPLES
    assert (setup.outside / "host.txt").read_text() == f"{HOST_SECRET} hard-linked host\n"
    assert (setup.outside / "secret.txt").read_text() == f"{HOST_SECRET} host\n"
    assert os.stat(setup.root / "hard").st_nlink == 2
