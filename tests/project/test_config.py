"""Configuration: YAML + environment overrides, strict validation with key paths."""

from pathlib import Path

import pytest

from agentkeel.config import ConfigError, KeelConfig, load_config


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "keel.yaml"
    path.write_text(text)
    return path


def test_defaults_without_a_file_use_the_bundled_scripted_model(tmp_path: Path) -> None:
    config = load_config(None, env={})
    assert [m.name for m in config.models] == ["demo"]
    assert config.models[0].use == "scripted" and Path(config.models[0].script).is_file()
    assert [a.assistant_id for a in config.assistants] == ["lead"]
    assert config.database_url.backend == "sqlite" and config.database_url.target.endswith("keel.db")
    assert config.db.pool.size == 10
    assert config.stream == "memory" and config.checkpoint_mode == "full"


def test_unknown_keys_and_wrong_types_name_the_key_path(tmp_path: Path) -> None:
    path = _write(tmp_path, "limits: {run_timeout_s: soon, bogus: 1}\nmodels: [{name: m, use: scripted, script: s.yaml, colour: red}]\nextra_top: 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    text = str(info.value)
    assert str(path) in text
    for key in ("limits.run_timeout_s", "limits.bogus", "models.0.colour", "extra_top"):
        assert key in text, key


def test_semantic_errors_name_the_key(tmp_path: Path) -> None:
    path = _write(tmp_path, "assistants: [{assistant_id: lead, model: nope}]\n")
    with pytest.raises(ConfigError, match=r"assistants\.0\.model: 'nope' is not in models"):
        load_config(path, env={})
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(_write(tmp_path, "limits: [\n"), env={})
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(_write(tmp_path, "- a\n"), env={})
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml", env={})


def test_environment_overrides_the_file_and_paths_resolve_against_it(tmp_path: Path) -> None:
    path = _write(tmp_path, "data_dir: data\ndatabase: sqlite:///x.db\nstream: memory\n")
    env = {
        "AGENTKEEL_CONFIG": str(path),
        "AGENTKEEL_DATABASE_URL": "postgresql://u@127.0.0.1:5432/db",
        "AGENTKEEL_REDIS_URL": "redis://127.0.0.1:6379/3",
    }
    config = load_config(None, env=env)
    assert str(config.database_url) == "postgresql://u@127.0.0.1:5432/db"
    assert config.stream == "redis://127.0.0.1:6379/3"
    assert config.data_path == (tmp_path / "data").resolve()
    del env["AGENTKEEL_DATABASE_URL"]
    assert load_config(None, env=env).database_url.target == str(tmp_path / "x.db")


def test_lead_uses_the_first_model_and_graph_names_must_not_clash(tmp_path: Path) -> None:
    config = KeelConfig(
        models=[{"name": "a", "use": "scripted", "script": "a.yaml"}, {"name": "b", "use": "openai:gpt-4.1-mini"}],
        base_dir=tmp_path,
    )
    lead = config.assistant("lead")
    assert lead is not None and config.default_model_for(lead) == "a"
    with pytest.raises(ValueError, match="clash"):
        KeelConfig(graphs={"lead": "./g.py:graph"}, base_dir=tmp_path)


def test_subagent_summarization_is_on_by_default_and_cannot_be_turned_off(tmp_path: Path) -> None:
    summarization = load_config(None, env={}).subagents.summarization
    assert (summarization.enabled, summarization.trigger_tokens, summarization.keep_messages) == (True, 64_000, 20)
    raised = load_config(_write(tmp_path, "subagents: {summarization: {trigger_tokens: 120000}}\n"), env={})
    assert raised.subagents.summarization.enabled and raised.subagents.summarization.trigger_tokens == 120_000
    path = _write(tmp_path, "subagents: {summarization: {enabled: false}}\n")
    with pytest.raises(ConfigError, match=r"subagents\.summarization\.enabled: summarization is mandatory for "
                       r"subagents .*raise subagents\.summarization\.trigger_tokens instead"):
        load_config(path, env={})
    with pytest.raises(ConfigError, match=r"subagents\.summarization\.model: 'nope' is not in models"):
        load_config(_write(tmp_path, "subagents: {summarization: {model: nope}}\n"), env={})
