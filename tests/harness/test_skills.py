"""Agent Skills: loading and validating SKILL.md files, the prompt listing, the read-only /skills
mount of the file tools, and recognising a skill read from a tool call and its result."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from langchain_core.messages import ToolMessage
from test_tools import call

from agentkeel.config import ConfigError, KeelConfig, load_config
from agentkeel.harness import agents as agents_module
from agentkeel.harness.agents import DEFAULT_SYSTEM_PROMPT, Harness
from agentkeel.harness.context import RunContext
from agentkeel.harness.skills import (
    SkillError,
    load_skills,
    skill_read,
    skills_prompt,
    split_front_matter,
)
from agentkeel.sandbox.workspace import Workspace

PDF = (
    "---\n"
    "name: pdf\n"
    "description: Fill in and merge PDF forms.\n"
    "license: Apache-2.0\n"
    "allowed-tools: read_file bash\n"
    "metadata: {author: ops, version: '1.2'}\n"
    "---\n"
    "# PDF\n\nUse pdftk; never edit the original. See reference.md.\n"
)
REVIEW = (
    "---\nname: code-review\ndescription: >\n  Review a change\n  for bugs first.\n---\n"
    "Read the diff twice.\n"
)


def skill_file(root: Path, directory: str, text: str | bytes) -> Path:
    path = root / directory / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


@pytest.fixture
def skills_dir(tmp_path: Path) -> Path:
    root = tmp_path / "skills"
    skill_file(root, "pdf", PDF)
    skill_file(root, "code-review", REVIEW)
    (root / "pdf" / "reference.md").write_text("pdftk A.pdf B.pdf cat output C.pdf\n")
    (root / "README.md").write_text("not a skill\n")
    (root / ".git").mkdir()
    return root


# -- loading -------------------------------------------------------------------------------------


def test_load_skills_sorted_with_every_field(skills_dir: Path) -> None:
    skills = load_skills(skills_dir)
    assert [s.name for s in skills] == ["code-review", "pdf"]
    pdf = skills[1]
    assert pdf.description == "Fill in and merge PDF forms."
    assert pdf.path == (skills_dir / "pdf" / "SKILL.md").resolve()
    assert pdf.virtual_path == "/skills/pdf/SKILL.md"
    assert pdf.body == "# PDF\n\nUse pdftk; never edit the original. See reference.md.\n"
    assert pdf.sha256 == hashlib.sha256(PDF.encode()).hexdigest()
    assert pdf.front_matter["license"] == "Apache-2.0"
    assert pdf.front_matter["allowed-tools"] == "read_file bash"
    assert pdf.front_matter["metadata"] == {"author": "ops", "version": "1.2"}
    assert skills[0].description == "Review a change for bugs first.\n"


BAD = [
    ("no front matter", "# Just a body\n", "no YAML front matter"),
    ("unclosed", "---\nname: bad\ndescription: x\n", "no YAML front matter"),
    ("yaml", "---\nname: bad\ndescription: a: b\n---\n", "not valid YAML at line 3"),
    ("list", "---\n- name\n- description\n---\n", "must be a YAML mapping, got list"),
    ("empty", "---\n---\nbody\n", "must be a YAML mapping, got NoneType"),
    ("no name", "---\ndescription: x\n---\n", "'name' is required"),
    ("name type", "---\nname: 12\ndescription: x\n---\n", "'name' is required and must be a non-empty string"),
    ("mismatch", "---\nname: other\ndescription: x\n---\n", "must equal its directory name 'bad'"),
    ("no description", "---\nname: bad\n---\n", "'description' is required"),
    ("blank description", "---\nname: bad\ndescription: '  '\n---\n", "'description' is required"),
    ("description type", "---\nname: bad\ndescription: [a]\n---\n", "'description' is required"),
    ("long description", "---\nname: bad\ndescription: " + "x" * 1025 + "\n---\n", "at most 1024"),
]


@pytest.mark.parametrize(("text", "problem"), [(t, p) for _, t, p in BAD], ids=[i for i, _, _ in BAD])
def test_bad_front_matter_is_an_error_naming_the_file(tmp_path: Path, text: str, problem: str) -> None:
    skill_file(tmp_path, "good", "---\nname: good\ndescription: fine\n---\n")
    path = skill_file(tmp_path, "bad", text)
    with pytest.raises(SkillError) as info:
        load_skills(tmp_path)
    assert str(info.value).startswith(f"{path}: ")
    assert problem in str(info.value)


@pytest.mark.parametrize("name", ["PDF", "pdf_forms", "-pdf", "pdf-", "pd--f", "a" * 65])
def test_names_must_be_short_lowercase_and_hyphenated(tmp_path: Path, name: str) -> None:
    path = skill_file(tmp_path, name, f"---\nname: {name}\ndescription: x\n---\n")
    with pytest.raises(SkillError, match="lowercase letters, digits and single hyphens") as info:
        load_skills(tmp_path)
    assert str(path) in str(info.value)


def test_a_name_of_64_characters_is_fine(tmp_path: Path) -> None:
    name = "a" * 30 + "-" + "b" * 33
    skill_file(tmp_path, name, f"---\nname: {name}\ndescription: x\n---\n")
    assert [s.name for s in load_skills(tmp_path)] == [name]


def test_a_directory_without_skill_md_and_a_non_utf8_file_name_the_path(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(SkillError, match=r"empty/SKILL\.md: missing"):
        load_skills(tmp_path)
    (tmp_path / "empty").rmdir()
    path = skill_file(tmp_path, "latin", b"---\nname: latin\ndescription: caf\xe9\n---\n")
    with pytest.raises(SkillError, match="not a UTF-8 text file") as info:
        load_skills(tmp_path)
    assert str(path) in str(info.value)


def test_a_skill_symlinked_from_outside_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    skill_file(outside, "pdf", PDF)
    (tmp_path / "skills").mkdir()
    (tmp_path / "skills" / "pdf").symlink_to(outside / "pdf")
    with pytest.raises(SkillError, match="leads outside the skills directory through a symlink"):
        load_skills(tmp_path / "skills")


@given(body=st.text(), description=st.text(min_size=1))
def test_split_front_matter_returns_the_body_exactly(body: str, description: str) -> None:
    front = yaml.safe_dump({"name": "x", "description": description})
    meta, rest = split_front_matter(f"---\n{front}---\n{body}")
    assert meta == {"name": "x", "description": description} and rest == body


# -- configuration -------------------------------------------------------------------------------


def test_default_skills_dir_is_optional_and_an_explicit_one_must_exist(tmp_path: Path) -> None:
    config = KeelConfig(base_dir=tmp_path)
    assert config.skills_dir is None and config.skills_path is None
    assert Harness(config).skills == [] and Harness(config).skills_root is None
    dumped = tmp_path / "dumped.yaml"  # a dumped config reloads: the default is not "explicit"
    dumped.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    assert load_config(dumped, env={}).skills_path is None
    (tmp_path / "skills").mkdir()
    assert load_config(dumped, env={}).skills_path == tmp_path / "skills"
    (tmp_path / "skills").rmdir()
    (tmp_path / "keel.yaml").write_text("skills_dir: agent-skills\n")
    with pytest.raises(ConfigError, match=r"skills_dir: 'agent-skills' is not a directory") as info:
        load_config(tmp_path / "keel.yaml", env={})
    assert str(tmp_path / "agent-skills") in str(info.value)


def test_skills_dir_resolves_against_the_config_file_folder(
    skills_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "keel.yaml").write_text("skills_dir: skills\n")
    monkeypatch.chdir("/")
    config = load_config(tmp_path / "keel.yaml", env={})
    assert config.skills_path == skills_dir.resolve()
    assert [s.name for s in Harness(config).skills] == ["code-review", "pdf"]


def test_a_bad_skill_stops_the_harness_from_being_built(tmp_path: Path) -> None:
    path = skill_file(tmp_path / "skills", "pdf", "---\nname: PDF\ndescription: x\n---\n")
    with pytest.raises(SkillError, match=str(path)):
        Harness(KeelConfig(base_dir=tmp_path))


# -- the prompt listing --------------------------------------------------------------------------


def test_prompt_listing_is_sorted_and_stable(skills_dir: Path) -> None:
    skills = load_skills(skills_dir)
    section = skills_prompt(skills)
    assert section == (
        "## Skills\n\n"
        "Skills are instructions for particular kinds of task. Before doing a task that one of these "
        "skills is for, read its instructions with read_file at the path given and follow them. "
        "/skills is read-only.\n\n"
        "- code-review: Review a change for bugs first. (/skills/code-review/SKILL.md)\n"
        "- pdf: Fill in and merge PDF forms. (/skills/pdf/SKILL.md)"
    )
    shuffled = list(reversed(skills))
    random.Random(7).shuffle(shuffled)
    assert skills_prompt(shuffled) == section
    assert skills_prompt([]) == ""


async def _built_prompts(config: KeelConfig, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The system prompt each ``Harness.build`` hands to ``create_agent``."""
    prompts: list[str] = []
    real = agents_module.create_agent

    def spy(*args: Any, **kwargs: Any) -> Any:
        prompts.append(kwargs["system_prompt"])
        return real(*args, **kwargs)

    monkeypatch.setattr(agents_module, "create_agent", spy)
    for _ in range(2):  # two processes building the same agent
        harness = Harness(config)
        await harness.state_graph(harness.resolve("lead"), {"metadata": {}})
    return prompts


async def test_the_agent_prompt_gets_the_listing_byte_identically(
    skills_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = await _built_prompts(KeelConfig(base_dir=tmp_path), monkeypatch)
    assert prompts[0] == prompts[1] == f"{DEFAULT_SYSTEM_PROMPT}\n\n{skills_prompt(load_skills(skills_dir))}"


async def test_an_agent_without_read_file_is_not_told_of_skills(
    skills_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = KeelConfig(base_dir=tmp_path, assistants=[{"assistant_id": "lead", "tools": ["ls"]}])
    assert await _built_prompts(config, monkeypatch) == [DEFAULT_SYSTEM_PROMPT] * 2


# -- the /skills mount ---------------------------------------------------------------------------


@pytest.fixture
def ctx(tmp_path: Path, skills_dir: Path) -> RunContext:
    ws = Workspace.for_thread(tmp_path / "data", "t1")
    (ws.real_root / "notes.md").write_text("mine\n")
    return RunContext(thread_id="t1", run_id="r1", workspace_root=ws.root, skills_root=skills_dir)


async def test_read_file_returns_a_skill_and_marks_it_in_the_artifact(ctx: RunContext) -> None:
    result = await call(ctx, "read_file", path="/skills/pdf/SKILL.md")
    assert result.status != "error" and result.content == PDF
    sha = hashlib.sha256(PDF.encode()).hexdigest()
    assert result.artifact == {
        "sha256": sha,
        "path": "/skills/pdf/SKILL.md",
        "skill": {"name": "pdf", "path": "/skills/pdf/SKILL.md", "description": "Fill in and merge PDF forms.",
                  "sha256": sha},
    }


@pytest.mark.parametrize(
    ("args", "artifact_path"),
    [
        ({"path": "/skills/pdf/reference.md"}, "/skills/pdf/reference.md"),  # not a SKILL.md
        ({"path": "/skills/pdf/SKILL.md", "start_line": 2, "end_line": 3}, "/skills/pdf/SKILL.md"),  # a part
        ({"path": "/workspace/notes.md"}, "/workspace/notes.md"),
    ],
)
async def test_other_reads_carry_no_skill(ctx: RunContext, args: dict[str, Any], artifact_path: str) -> None:
    result = await call(ctx, "read_file", **args)
    assert result.status != "error" and result.artifact["path"] == artifact_path
    assert "skill" not in result.artifact


async def test_ls_glob_and_grep_see_the_skills(ctx: RunContext) -> None:
    listing = await call(ctx, "ls", path="/skills")
    assert listing.content.splitlines() == [".git/", "README.md  (12 bytes)", "code-review/", "pdf/"]
    globbed = await call(ctx, "glob", pattern="/skills/**/*.md")
    assert globbed.content.splitlines() == [
        "/skills/README.md", "/skills/code-review/SKILL.md", "/skills/pdf/SKILL.md", "/skills/pdf/reference.md",
    ]
    grepped = await call(ctx, "grep", pattern="pdftk", path="/skills")
    assert grepped.content.splitlines() == [
        "/skills/pdf/SKILL.md:10:Use pdftk; never edit the original. See reference.md.",
        "/skills/pdf/reference.md:1:pdftk A.pdf B.pdf cat output C.pdf",
    ]
    workspace = await call(ctx, "glob", pattern="**/*.md")  # the workspace is still the default
    assert workspace.content == "/workspace/notes.md"


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("write_file", {"path": "/skills/pdf/SKILL.md", "content": "pwned"}),
        ("write_file", {"path": "/skills/new/SKILL.md", "content": "pwned"}),
        ("write_file", {"path": "/skills/pdf/SKILL.md", "content": "more", "append": True}),
        ("str_replace", {"path": "/skills/pdf/SKILL.md", "old": "pdftk", "new": "rm -rf"}),
    ],
)
async def test_writes_under_skills_are_refused(
    ctx: RunContext, skills_dir: Path, tool: str, args: dict[str, Any]
) -> None:
    result = await call(ctx, tool, **args)
    assert result.status == "error"
    assert f"{args['path']}: /skills is read-only" in str(result.content)
    assert (skills_dir / "pdf" / "SKILL.md").read_text() == PDF
    assert not (skills_dir / "new").exists()


async def test_escapes_from_skills_are_refused(ctx: RunContext, skills_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("TOPSECRET\n")
    (skills_dir / "pdf" / "leak").symlink_to(tmp_path / "secret.txt")
    for path in ("/skills/../workspace/notes.md", "/skills/pdf/../../secret.txt", "/skills/pdf/leak"):
        result = await call(ctx, "read_file", path=path)
        assert result.status == "error" and "access refused" in str(result.content), path
        assert "(only /skills is allowed)" in str(result.content)
        assert "TOPSECRET" not in str(result.content) and str(tmp_path) not in str(result.content)
    assert (await call(ctx, "glob", pattern="/skills/../*")).status == "error"
    assert "TOPSECRET" not in str((await call(ctx, "grep", pattern="TOP", path="/skills")).content)


async def test_without_a_skills_dir_skills_paths_are_outside(ctx: RunContext) -> None:
    from dataclasses import replace

    result = await call(replace(ctx, skills_root=None), "read_file", path="/skills/pdf/SKILL.md")
    assert result.status == "error" and "outside /workspace" in str(result.content)


# -- recognising a skill read --------------------------------------------------------------------


async def test_skill_read_recognises_a_complete_skill_read(ctx: RunContext) -> None:
    args = {"path": "/skills/pdf/./SKILL.md"}
    read = skill_read("read_file", args, await call(ctx, "read_file", **args))
    assert read is not None
    assert (read.name, read.path, read.description) == ("pdf", "/skills/pdf/SKILL.md", "Fill in and merge PDF forms.")
    assert read.sha256 == hashlib.sha256(PDF.encode()).hexdigest()
    assert read.body == "# PDF\n\nUse pdftk; never edit the original. See reference.md.\n"


async def test_skill_read_ignores_everything_else(ctx: RunContext) -> None:
    args = {"path": "/skills/pdf/SKILL.md"}
    good = await call(ctx, "read_file", **args)
    assert skill_read("read_file", args, good) is not None
    ranged = {**args, "start_line": 1, "end_line": 3}
    assert skill_read("read_file", ranged, await call(ctx, "read_file", **ranged)) is None
    other = {"path": "/skills/pdf/reference.md"}
    assert skill_read("read_file", other, await call(ctx, "read_file", **other)) is None
    assert skill_read("read_file", {"path": "/workspace/notes.md"}, good) is None  # not this call's result
    assert skill_read("grep", args, good) is None
    assert skill_read("read_file", {}, good) is None
    assert skill_read("read_file", args, good.model_copy(update={"status": "error"})) is None
    assert skill_read("read_file", args, good.model_copy(update={"content": PDF[:40] + "[... cut]"})) is None
    assert skill_read("read_file", args, good.model_copy(update={"artifact": None})) is None
    forged = {**good.artifact, "skill": {**good.artifact["skill"], "sha256": 7}}
    assert skill_read("read_file", args, good.model_copy(update={"artifact": forged})) is None
    failed = ToolMessage(content="Error: no such file", tool_call_id="c", status="error")
    assert skill_read("read_file", args, failed) is None
