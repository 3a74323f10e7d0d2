"""The README's set-up commands are the ones CI runs; keep them from drifting apart."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bash_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_readme_has_the_two_setup_commands_and_ci_runs_the_test_one() -> None:
    readme = (ROOT / "README.md").read_text()
    setup = readme.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    blocks = _bash_blocks(setup)
    assert len(blocks) == 2, blocks
    demo, tests = blocks
    assert demo.endswith("keel demo") and "pip install" in demo
    assert "pytest" in tests and "pip install" in tests
    ci = (ROOT / ".ci" / "run").read_text()
    match = re.search(r"TEST_COMMAND='(.*)'", ci)
    assert match and match.group(1) == tests
    assert "AGENTKEEL_REQUIRE_SERVICES=1" in ci
