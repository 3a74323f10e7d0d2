"""Chat models from the config's allowlist.

``use: scripted`` is the bundled deterministic model (a fresh ``ScriptSession`` per run, so every run
replays its script from turn 1); ``use: "<provider>:<model>"`` goes through LangChain's
``init_chat_model`` with the API key read from the named environment variable.
"""

from __future__ import annotations

import os
from typing import Any

from langchain_core.language_models import BaseChatModel

from agentkeel.config import KeelConfig, ModelConfig
from agentkeel.harness.scripted import Script, ScriptedChatModel, ScriptSession, load_script


class ModelNotAllowed(ValueError):
    """The requested model is not in the configuration's allowlist."""


class ModelLoader:
    """Loads (and validates) every configured model's definition once, at start-up."""

    def __init__(self, config: KeelConfig) -> None:
        self._config = config
        self._scripts: dict[str, Script] = {}
        for model in config.models:
            if model.use == "scripted":
                if not model.script:
                    raise ValueError(f"models.{model.name}: a scripted model needs `script:`")
                self._scripts[model.name] = load_script(config.resolve_path(model.script))
            elif ":" not in model.use:
                raise ValueError(
                    f"models.{model.name}.use: {model.use!r} must be 'scripted' or '<provider>:<model>'"
                )

    @property
    def names(self) -> list[str]:
        return [m.name for m in self._config.models]

    def check(self, name: str) -> ModelConfig:
        try:
            return self._config.model(name)
        except KeyError:
            raise ModelNotAllowed(
                f"model {name!r} is not in the configured model allowlist {self.names}"
            ) from None

    def strict(self, name: str) -> bool:
        """Whether ``name`` is a scripted model in strict mode (its chain then fails loudly on a
        request that breaks the provider grammar, naming the middleware that broke it)."""
        script = self._scripts.get(name)
        return bool(script is not None and script.strict)

    def build(self, name: str, run_key: str | None = None, turns_done: int = 0) -> BaseChatModel:
        """A new lead model instance for one run.

        Scripted: a fresh session, so every run replays its script from turn 1 — or, for a run
        resumed after its worker was lost, from the turn after the ``turns_done`` its lost attempts
        made; keyed by the run id so message ids are reproducible and never collide with an earlier
        run's on the thread. Subagent models come from the lead's ``for_agent`` so they share that
        session.
        """
        model = self.check(name)
        if model.use == "scripted":
            session = ScriptSession(key=run_key and run_key[:8], lead_turns_done=turns_done)
            return ScriptedChatModel(script=self._scripts[name], session=session, model_name=name)
        return _provider_model(model)


def _provider_model(model: ModelConfig) -> BaseChatModel:
    from langchain.chat_models import init_chat_model

    kwargs: dict[str, Any] = {}
    if model.api_key_env:
        key = os.environ.get(model.api_key_env)
        if not key:
            raise ModelNotAllowed(f"model {model.name!r}: environment variable {model.api_key_env} is not set")
        kwargs["api_key"] = key
    if model.base_url:
        kwargs["base_url"] = model.base_url
    if model.temperature is not None:
        kwargs["temperature"] = model.temperature
    return init_chat_model(model.use, **kwargs)
