"""A bad SKILL.md as a user meets it: ``keel run``, ``keel serve`` and ``keel demo`` refuse to start
with exit 2 and a message naming the file, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cli import keel


@pytest.mark.parametrize(
    "command",
    [
        ["run", "hi", "--config", "keel.yaml"],
        ["serve", "--config", "keel.yaml", "--host", "127.0.0.1", "--port", "0"],
        ["demo"],  # no config: the default ./skills of the working directory
    ],
    ids=["run", "serve", "demo"],
)
def test_a_bad_skill_stops_start_up_naming_the_file(tmp_path: Path, command: list[str]) -> None:
    skill = tmp_path / "skills" / "pdf" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text("---\nname: pdf-forms\ndescription: Fill in PDF forms.\n---\nUse pdftk.\n")
    (tmp_path / "keel.yaml").write_text(f"data_dir: {tmp_path / 'data'}\n")
    result = keel(*command, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    message = " ".join(result.stderr.split())  # the console wraps long lines
    assert f"{skill}: 'name' 'pdf-forms' must equal its directory name 'pdf'" in message
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "data").exists() and not (tmp_path / ".agentkeel").exists()  # nothing started


def test_an_explicit_missing_skills_dir_names_the_key(tmp_path: Path) -> None:
    (tmp_path / "keel.yaml").write_text("skills_dir: nowhere\n")
    result = keel("run", "hi", "--config", "keel.yaml", cwd=tmp_path)
    assert result.returncode == 2 and "skills_dir: 'nowhere' is not a directory" in result.stderr
    assert "Traceback" not in result.stderr
