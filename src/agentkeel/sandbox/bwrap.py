"""The bubblewrap sandbox the ``bash`` tool's commands run in.

A command chosen by a model must not see the server: its environment (API keys), its process tree
(``/proc/$PPID/environ``), the data directory (every other thread's workspace, the database), the
network, or any writable path but its own workspace. bubblewrap gives each command new namespaces:
the host filesystem read-only with the data directory (and configured extra paths) hidden under an
empty read-only tmpfs, the thread's workspace bound read-write at its own host path (so ``pwd`` and
the paths tools report stay the same as without the sandbox), a private ``/tmp``, its own pid
namespace and ``/proc``, no network unless allowed, and a cleared environment.

Resource limits (CPU seconds, address space, processes, file size) are set with ``prlimit`` inside
the sandbox, before the command starts, so the command cannot raise them back. The kernel does not
enforce the process limit for uid 0, so when the server runs as root the command runs as an
unprivileged uid (:attr:`BashSandbox.root_uid`), which is handed the workspace's files first.

bubblewrap's pid namespace makes "every process it started dies with the call" a kernel guarantee:
bwrap's child is the namespace's init, and when it dies every process in the namespace is killed,
whether it detached with ``setsid`` or not.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

BWRAP = "bwrap"

_SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def command_env(home: Path) -> dict[str, str]:
    """The whole environment a command sees: nothing inherited, so host secrets never leak in."""
    return {"PATH": _SAFE_PATH, "HOME": str(home), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def find_bwrap() -> str | None:
    """The bubblewrap executable, or None when it is not installed."""
    return shutil.which(BWRAP)


@dataclass(frozen=True)
class BashSandbox:
    """How one ``bash`` call is confined (built from ``tools.bash_*`` keys)."""

    hidden: tuple[Path, ...] = ()
    """Host paths made invisible: a directory becomes an empty read-only one, a file an empty file
    (the data directory, the config file, secrets); a path that does not exist is left alone."""
    network: bool = False
    cpu_s: int = 60
    memory_mb: int = 2048
    max_processes: int = 256
    max_file_mb: int = 1024
    root_uid: int = 65534
    """The uid commands run as when the server itself runs as root."""

    def argv(self, command: str, workspace: Path) -> list[str]:
        """The full command line: bwrap, then the limits, then ``bash -c command`` in ``workspace``.

        ``workspace`` must be the resolved host path; it is the only writable path inside.
        """
        file_cap = str(self.max_file_mb * 1024 * 1024)
        args = [BWRAP, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        args += ["--perms", "1777", "--size", file_cap, "--tmpfs", "/tmp"]
        hidden = sorted({p.resolve() for p in self.hidden} - {Path("/")}, key=_depth)
        folders = [str(p) for p in hidden if p.is_dir()]
        for folder in folders:
            args += ["--tmpfs", folder]
        for file in hidden:
            if file.exists() and not file.is_dir():
                args += ["--ro-bind", "/dev/null", str(file)]
        args += ["--bind", str(workspace), str(workspace)]
        for folder in folders:  # read-only once the workspace's mount point was made inside it
            args += ["--remount-ro", folder]
        args += ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
        if not self.network:
            args.append("--unshare-net")
        as_root = os.geteuid() == 0
        if not as_root:
            args.append("--unshare-user")
        args += [
            "--die-with-parent",
            "--new-session",
            "--clearenv",
            *[arg for key, value in command_env(workspace).items() for arg in ("--setenv", key, value)],
            "--chdir",
            str(workspace),
            "--",
            "prlimit",
            f"--cpu={self.cpu_s}",
            f"--as={self.memory_mb * 1024 * 1024}",
            f"--nproc={self.max_processes}",
            f"--fsize={file_cap}",
            "--",
        ]
        if as_root:
            uid = str(self.root_uid)
            args += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
            args += ["--inh-caps=-all", "--bounding-set=-all", "--"]
        return [*args, "bash", "-c", command]

    def prepare(self, workspace: Path) -> None:
        """Give the command's uid the workspace's files when it runs as another uid (server is root).

        Walked by directory descriptor, never by path, and never following a symlink: another
        command running in this workspace at the same time could swap a directory for a symlink
        to ``/etc`` mid-walk, and a path-based chown would then hand it a host file. A file with
        more than one hard link is left alone too.
        """
        if os.geteuid() != 0:
            return
        uid = self.root_uid
        for _, dirnames, filenames, dir_fd in os.fwalk(workspace):
            for name in (".", *dirnames, *filenames):
                try:
                    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    if st.st_uid != uid and not (stat.S_ISREG(st.st_mode) and st.st_nlink > 1):
                        os.chown(name, uid, uid, dir_fd=dir_fd, follow_symlinks=False)
                except OSError:
                    continue


def _depth(path: Path) -> int:
    return len(path.parts)
