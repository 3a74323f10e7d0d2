"""Agent Skills: ``<skills_dir>/<name>/SKILL.md`` files, listed in the prompt, read on demand.

A skill is a directory holding a ``SKILL.md`` whose YAML front matter names it and says what it is
for (the Agent Skills layout); the body is the instructions. Only names and descriptions go into
the system prompt: a run pays for a skill's body only when the model reads it, with ``read_file``,
at ``/skills/<name>/SKILL.md`` (a read-only mount of the skills directory, see
:class:`~agentkeel.sandbox.workspace.ReadOnlyMount`).

Why validation is strict and happens at start-up: a skill with broken front matter would otherwise
vanish from the listing without a word, and the agent would improvise the task the skill was
written for. So every problem is a :class:`SkillError` naming the file, raised when the harness is
built, and ``keel serve``/``keel run`` refuse to start.

Why :func:`skill_read` exists: what a run learnt from a skill must survive compaction dropping the
message that carried it. The function recognises, from a tool call and its result alone, a
complete read of a skill file, so middleware can keep it without looking at the disk again.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from langchain_core.messages import ToolMessage

from agentkeel.sandbox.workspace import PathOutsideWorkspace, ReadOnlyMount

SKILLS_ROOT = "/skills"
"""How tools and the model name the skills directory."""

SKILL_FILE = "SKILL.md"
NAME_MAX = 64
DESCRIPTION_MAX = 1024

_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
# The opening line, the YAML, then the closing line (``---`` alone, trailing blanks allowed).
_FRONT_MATTER = re.compile(r"---[ \t]*\r?\n(.*?)^---[ \t]*(?:\r?\n|\Z)", re.DOTALL | re.MULTILINE)


class SkillError(ValueError):
    """A skill file is unusable; the message names the file and the problem."""


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    path: Path  # the real host path of SKILL.md
    virtual_path: str  # /skills/<name>/SKILL.md
    body: str  # the instructions after the front matter
    sha256: str  # of the file's bytes
    front_matter: Mapping[str, Any] = field(default_factory=dict)  # every key, the unknown ones too


@dataclass(frozen=True)
class SkillRead:
    """A complete, successful ``read_file`` of a skill's SKILL.md, as seen in the conversation."""

    name: str
    path: str  # /skills/<name>/SKILL.md
    description: str
    sha256: str
    body: str


def split_front_matter(text: str) -> tuple[dict[str, Any], str]:
    """``(front matter, body)`` of a SKILL.md text; ``ValueError`` saying what is wrong."""
    text = text.removeprefix("\ufeff")
    match = _FRONT_MATTER.match(text)
    if match is None:
        raise ValueError("no YAML front matter (the file must start with a '---' line and close it with another)")
    try:
        meta = yaml.safe_load(match.group(1))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 2}" if mark is not None else ""  # +1 for 0-based, +1 for '---'
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ValueError(f"front matter is not valid YAML{where}: {problem}") from None
    if not isinstance(meta, dict):
        raise ValueError(f"front matter must be a YAML mapping, got {type(meta).__name__}")
    return meta, text[match.end() :]


def check_front_matter(meta: Mapping[str, Any], directory: str) -> tuple[str, str]:
    """``(name, description)`` when the front matter is valid for a skill in ``directory``."""
    name, description = meta.get("name"), meta.get("description")
    if not isinstance(name, str) or not name:
        raise ValueError("'name' is required and must be a non-empty string")
    if len(name) > NAME_MAX or not _NAME.fullmatch(name):
        raise ValueError(
            f"'name' {name!r} must be at most {NAME_MAX} lowercase letters, digits and single "
            "hyphens, not starting or ending with a hyphen"
        )
    if name != directory:
        raise ValueError(f"'name' {name!r} must equal its directory name {directory!r}")
    if not isinstance(description, str) or not description.strip():
        raise ValueError("'description' is required and must be a non-empty string")
    if len(description) > DESCRIPTION_MAX:
        raise ValueError(f"'description' has {len(description)} characters; at most {DESCRIPTION_MAX}")
    return name, description


def load_skills(directory: Path) -> list[Skill]:
    """Every skill under ``directory``, sorted by name; :class:`SkillError` on the first bad one.

    Each sub-directory (hidden ones aside) is a skill and must hold a valid ``SKILL.md``; plain
    files beside them (a README) are ignored. Paths go through the same confinement as the
    ``/skills`` mount, so a skill the loader accepts is one the tools can read.
    """
    mount = ReadOnlyMount(directory, SKILLS_ROOT)
    try:
        with os.scandir(mount.real_root) as scan:
            names = sorted(e.name for e in scan if e.is_dir() and not e.name.startswith("."))
    except OSError as exc:
        raise SkillError(f"skills_dir {directory}: {exc.strerror or exc}") from None
    return [_load_one(mount, name) for name in names]


def _load_one(mount: ReadOnlyMount, name: str) -> Skill:
    virtual = f"{SKILLS_ROOT}/{name}/{SKILL_FILE}"
    shown = mount.root / name / SKILL_FILE
    try:
        real = mount.resolve(virtual)
        data = real.read_bytes()
        text = data.decode("utf-8")
        meta, body = split_front_matter(text)
        description = check_front_matter(meta, name)[1]
    except PathOutsideWorkspace:
        raise SkillError(f"{shown}: leads outside the skills directory through a symlink") from None
    except FileNotFoundError:
        raise SkillError(f"{shown}: missing (every directory in the skills directory is a skill)") from None
    except UnicodeDecodeError:
        raise SkillError(f"{shown}: not a UTF-8 text file") from None
    except OSError as exc:
        raise SkillError(f"{shown}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise SkillError(f"{shown}: {exc}") from None
    return Skill(name, description, real, virtual, body, hashlib.sha256(data).hexdigest(), meta)


def skills_prompt(skills: Sequence[Skill]) -> str:
    """The system-prompt section listing ``skills`` ("" when there are none).

    Byte-stable for the same skills (sorted by name, descriptions on one line), so the prompt
    prefix a provider caches stays the same from run to run.
    """
    if not skills:
        return ""
    lines = [
        "## Skills",
        "",
        "Skills are instructions for particular kinds of task. Before doing a task that one of "
        "these skills is for, read its instructions with read_file at the path given and follow "
        f"them. {SKILLS_ROOT} is read-only.",
        "",
    ]
    for skill in sorted(skills, key=lambda s: s.name):
        lines.append(f"- {skill.name}: {' '.join(skill.description.split())} ({skill.virtual_path})")
    return "\n".join(lines)


def skill_artifact(virtual_path: str, text: str, sha256: str) -> dict[str, str] | None:
    """What ``read_file`` adds to its artifact (key ``skill``) when it returned the whole of a
    skill's SKILL.md: ``{name, path, description, sha256}``; None for any other read.

    The front matter is parsed from the bytes just read, not taken from start-up, so a skill
    edited since then is described as it now is (and one broken since then is just a file).
    """
    directory, _, file = virtual_path.removeprefix(SKILLS_ROOT + "/").partition("/")
    if not virtual_path.startswith(SKILLS_ROOT + "/") or not directory or file != SKILL_FILE:
        return None
    if hashlib.sha256(text.encode("utf-8")).hexdigest() != sha256:
        return None  # a ranged or cut read: not the skill's instructions
    try:
        name, description = check_front_matter(split_front_matter(text)[0], directory)
    except ValueError:
        return None
    return {"name": name, "path": virtual_path, "description": description, "sha256": sha256}


def skill_read(tool_name: str, args: Mapping[str, Any], message: ToolMessage) -> SkillRead | None:
    """The skill a tool call read, or None when it was not a complete, successful skill read.

    ``tool_name`` and ``args`` are the call's; ``message`` its result. Recognised: a ``read_file``
    of a ``/skills/...`` path whose result is not an error, whose artifact carries ``skill`` (set
    by ``read_file`` only for a whole SKILL.md, see :func:`skill_artifact`), and whose content
    still hashes to the file's sha256 (no guard cut or rewrote it since). Pure: it reads neither
    the disk nor the run, so it works the same on a message restored from a checkpoint.
    """
    path = args.get("path")
    if tool_name != "read_file" or message.status == "error" or not isinstance(path, str):
        return None
    if not posixpath.normpath(path).startswith(SKILLS_ROOT + "/"):
        return None
    artifact = message.artifact
    skill = artifact.get("skill") if isinstance(artifact, Mapping) else None
    if not isinstance(skill, Mapping):
        return None
    fields = {key: skill.get(key) for key in ("name", "path", "description", "sha256")}
    content = message.content
    if not all(isinstance(value, str) for value in fields.values()) or not isinstance(content, str):
        return None
    if hashlib.sha256(content.encode("utf-8")).hexdigest() != fields["sha256"]:
        return None
    try:
        body = split_front_matter(content)[1]
    except ValueError:
        return None
    return SkillRead(body=body, **{key: str(value) for key, value in fields.items()})


__all__ = [
    "SKILLS_ROOT",
    "Skill",
    "SkillError",
    "SkillRead",
    "load_skills",
    "skill_artifact",
    "skill_read",
    "skills_prompt",
]
