"""The model configs the README and docs/configuration.md show are valid and fully usable once their
key variables are set: every block loads, and the start-up check finds nothing to report."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from agentkeel.config import KeelConfig
from agentkeel.harness.models import ModelLoader

ROOT = Path(__file__).resolve().parents[2]


def _yaml_blocks(path: str, section: str) -> list[str]:
    text = (ROOT / path).read_text().split(f"\n{section}\n", 1)[1]
    text = text.split("\n## ", 1)[0]
    return re.findall(r"```yaml\n(.*?)```", text, flags=re.S)


BLOCKS = [
    *(("README.md", b) for b in _yaml_blocks("README.md", "## Real models")),
    *(("docs/configuration.md", b) for b in _yaml_blocks("docs/configuration.md", "## Models")),
]


def test_the_docs_show_openai_compatible_and_anthropic_configs() -> None:
    uses = [m["use"] for _, block in BLOCKS for m in yaml.safe_load(block)["models"]]
    assert any(u.startswith("anthropic:") for u in uses) and sum(u.startswith("openai:") for u in uses) >= 4
    assert len(BLOCKS) == 3


@pytest.mark.parametrize(("path", "block"), BLOCKS, ids=[f"{p}-{i}" for i, (p, _) in enumerate(BLOCKS)])
def test_a_documented_model_config_loads_and_passes_the_start_up_check(
    path: str, block: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    raw = yaml.safe_load(block)
    for model in raw["models"]:
        monkeypatch.setenv(model.get("api_key_env") or "OPENAI_API_KEY", "set")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "set")
    loader = ModelLoader(KeelConfig(**raw))
    assert loader.problems == {}
    for name in loader.names:
        loader.build(name)  # the real provider class accepts every documented key and option
