"""Provider models as the loader builds them: the real ``langchain-openai`` / ``langchain-anthropic``
classes, their client settings, and the start-up check of every configured model."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import yaml
from langchain_anthropic import ChatAnthropic
from langchain_openai import ChatOpenAI

from agentkeel.config import BUNDLED_SCRIPTS, ConfigError, KeelConfig, load_config
from agentkeel.harness.models import ModelLoader, ModelUnavailable
from agentkeel.harness.providers import provider_spec

DEMO = {"name": "demo", "use": "scripted", "script": str(BUNDLED_SCRIPTS / "demo.yaml")}


def loader(*models: dict[str, Any]) -> ModelLoader:
    return ModelLoader(KeelConfig(models=[DEMO, *models]))


@pytest.fixture(autouse=True)
def no_provider_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_BASE", "KEEL_TEST_KEY"):
        monkeypatch.delenv(name, raising=False)


def test_openai_compatible_model_has_no_client_retries_a_timeout_and_streamed_usage_on_a_base_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KEEL_TEST_KEY", "sk-local")
    models = loader({
        "name": "local", "use": "openai:qwen2.5-7b", "api_key_env": "KEEL_TEST_KEY",
        "base_url": "http://127.0.0.1:8000/v1", "temperature": 0, "timeout_s": 7.5,
        "options": {"top_p": 0.25, "presence_penalty": 0.5},
    })
    model = models.build("local")
    assert isinstance(model, ChatOpenAI)
    assert model.model_name == "qwen2.5-7b" and model.openai_api_base == "http://127.0.0.1:8000/v1"
    assert model.openai_api_key is not None and model.openai_api_key.get_secret_value() == "sk-local"  # type: ignore[union-attr]
    # LangChain leaves stream_usage off for a custom base_url; ours is always on.
    assert model.stream_usage is True and model._should_stream_usage() is True
    assert model.max_retries == 0 and model.request_timeout == 7.5 and model.temperature == 0
    assert model.root_async_client.max_retries == 0 and model.root_async_client.timeout == 7.5  # the SDK client itself
    assert model.top_p == 0.25 and model.presence_penalty == 0.5  # options passed through
    assert model.model_kwargs == {}  # nothing unknown slipped into the request body
    assert models.call_timeout_s("local") == 7.5


def test_anthropic_model_has_no_client_retries_and_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant")
    models = loader({"name": "claude", "use": "anthropic:claude-sonnet-4-5", "options": {"max_tokens": 1234}})
    model = models.build("claude")
    assert isinstance(model, ChatAnthropic)
    assert model.model == "claude-sonnet-4-5" and model.anthropic_api_key.get_secret_value() == "sk-ant"
    assert model.max_retries == 0 and model.default_request_timeout == 60.0  # the documented default
    assert model.stream_usage is True and model.max_tokens == 1234
    assert models.call_timeout_s("claude") == 60.0 and models.call_timeout_s("demo") == 60.0
    assert models.call_timeout_s("nope") is None and models.call_timeout_s(None) is None


def test_every_problem_of_every_model_is_listed_and_usable_models_stay_usable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant")
    models = loader(
        {"name": "gpt", "use": "openai:gpt-4.1-mini"},  # no api_key_env: OPENAI_API_KEY is the one checked
        {"name": "local", "use": "openai:llama", "api_key_env": "KEEL_TEST_KEY", "base_url": "http://127.0.0.1:1/v1"},
        {"name": "typo", "use": "opneai:gpt-4.1"},
        {"name": "empty", "use": "openai:", "api_key_env": "KEEL_TEST_KEY"},
        {"name": "claude", "use": "anthropic:claude-haiku-4-5"},
    )
    problems = models.problems
    assert set(problems) == {"gpt", "local", "typo", "empty"}
    assert problems["gpt"] == ["environment variable OPENAI_API_KEY (the API key) is not set"]
    assert problems["local"] == ["environment variable KEEL_TEST_KEY (the API key) is not set"]
    assert problems["typo"][0].startswith("unknown provider 'opneai'") and "openai" in problems["typo"][0]
    assert len(problems["empty"]) == 2 and "names no model" in problems["empty"][0]
    lines = models.problem_lines()
    assert len(lines) == 5 and lines[0].startswith("model 'gpt' (openai:gpt-4.1-mini): ")
    models.ensure_usable("claude")
    models.ensure_usable("demo")
    with pytest.raises(ModelUnavailable, match="model 'gpt' cannot be used: environment variable OPENAI_API_KEY"):
        models.ensure_usable("gpt")
    with pytest.raises(ModelUnavailable, match="OPENAI_API_KEY"):
        models.build("gpt")  # never built, even if asked


@pytest.mark.skipif(importlib.util.find_spec("langchain_groq") is not None, reason="langchain-groq is installed here")
def test_a_provider_whose_package_is_missing_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_TEST_KEY", "k")
    models = loader({"name": "groq", "use": "groq:llama-3.3-70b", "api_key_env": "KEEL_TEST_KEY"})
    assert models.problems == {"groq": ["the groq provider needs the langchain-groq package: pip install langchain-groq"]}


def test_the_install_hint_of_openai_and_anthropic_is_the_agentkeel_extra() -> None:
    openai, anthropic, azure = (provider_spec(u) for u in ("openai:x", "anthropic:y", "azure_openai:z"))
    assert openai is not None and openai.install_hint == "pip install 'agentkeel[openai]'"
    assert anthropic is not None and anthropic.install_hint == "pip install 'agentkeel[anthropic]'"
    assert azure is not None and azure.install_hint == "pip install 'agentkeel[openai]'"
    assert provider_spec("nope:x") is None


def write(tmp_path: Path, models: list[dict[str, Any]]) -> Path:
    path = tmp_path / "keel.yaml"
    path.write_text(yaml.safe_dump({"models": models}))
    return path


@pytest.mark.parametrize(("options", "message"), [
    ({"api_key": "sk"}, "models.0.options: 'api_key' is set by AgentKeel, not through options; use api_key_env"),
    ({"max_retries": 5}, "models.0.options: 'max_retries' is set by AgentKeel, not through options; use limits.llm_retry"),
    ({"base_url": "x"}, "'base_url' is set by AgentKeel, not through options; use base_url"),
    ({"timeout": 3}, "use timeout_s"),
    ({"stream_usage": False}, "'stream_usage' is set by AgentKeel, not through options (AgentKeel always sets it)"),
    ("top_p", "models.0.options: Input should be a valid dictionary"),
])
def test_options_that_would_undo_a_guarantee_stop_start_up_with_the_key_path(
    tmp_path: Path, options: Any, message: str,
) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(write(tmp_path, [{"name": "gpt", "use": "openai:gpt-4.1-mini", "options": options}]))
    assert message in str(raised.value)


@pytest.mark.parametrize(("model", "message"), [
    ({"timeout_s": 0}, "models.0.timeout_s: Input should be greater than 0"),
    ({"timeout_s": "soon"}, "models.0.timeout_s: Input should be a valid number"),
    ({"timeuot_s": 5}, "models.0.timeuot_s: Extra inputs are not permitted"),
    ({"use": "scripted", "script": "s.yaml", "options": {"top_p": 1}}, "models.0: options: only provider models"),
])
def test_model_keys_are_validated_with_their_path(tmp_path: Path, model: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(write(tmp_path, [{"name": "gpt", "use": "openai:gpt-4.1-mini", **model}]))
    assert message in str(raised.value)
