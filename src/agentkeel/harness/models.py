"""Chat models from the config's allowlist.

``use: scripted`` is the bundled deterministic model (a fresh ``ScriptSession`` per run, so every run
replays its script from turn 1); ``use: "<provider>:<model>"`` goes through LangChain's
``init_chat_model`` (``harness.providers``: what is checked at start-up and how the client is set up).
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatResult

from agentkeel.config import KeelConfig, ModelConfig
from agentkeel.harness.providers import ModelUnavailable, build_provider_model, check_provider
from agentkeel.harness.scripted import Script, ScriptedChatModel, ScriptSession, load_script


class ModelNotAllowed(ValueError):
    """The requested model is not in the configuration's allowlist."""


class StateOnlyModel(BaseChatModel):
    """The model of a graph that is only read (thread state, history), never run.

    Reading state needs the graph's channels, not its model; building the real one would make
    ``POST /threads`` or ``GET …/state`` depend on a provider's package and key. Calling it is a bug.
    """

    @property
    def _llm_type(self) -> str:
        return "agentkeel-state-only"

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        raise RuntimeError("a state-only graph was asked to run its model")


class ModelLoader:
    """Loads (and validates) every configured model's definition once, at start-up.

    A malformed definition (a scripted model without its script, a ``use`` of neither form) stops
    start-up. A provider model that cannot be used *here* (unknown provider, package missing, key
    variable unset) does not: its problems are kept (:attr:`problems`, reported by the CLI) and
    every run for it is refused before admission (:meth:`ensure_usable`). Checked once — a key
    exported after start-up is seen only by a restart.
    """

    def __init__(self, config: KeelConfig) -> None:
        self._config = config
        self._scripts: dict[str, Script] = {}
        self._problems: dict[str, list[str]] = {}
        for model in config.models:
            if model.use == "scripted":
                if not model.script:
                    raise ValueError(f"models.{model.name}: a scripted model needs `script:`")
                self._scripts[model.name] = load_script(config.resolve_path(model.script))
            elif ":" not in model.use:
                raise ValueError(
                    f"models.{model.name}.use: {model.use!r} must be 'scripted' or '<provider>:<model>'"
                )
            elif problems := check_provider(model):
                self._problems[model.name] = problems

    @property
    def names(self) -> list[str]:
        return [m.name for m in self._config.models]

    @property
    def problems(self) -> dict[str, list[str]]:
        """Model name -> why it cannot be used, for every unusable model (empty: all usable)."""
        return {name: list(problems) for name, problems in self._problems.items()}

    def problem_lines(self) -> list[str]:
        """One line per problem, naming its model — what ``keel serve`` prints at start-up."""
        return [
            f"model {name!r} ({self._config.model(name).use}): {problem}"
            for name, problems in self._problems.items() for problem in problems
        ]

    def check(self, name: str) -> ModelConfig:
        try:
            return self._config.model(name)
        except KeyError:
            raise ModelNotAllowed(
                f"model {name!r} is not in the configured model allowlist {self.names}"
            ) from None

    def ensure_usable(self, name: str) -> None:
        """Raises ``ModelUnavailable`` (with every problem) when start-up found ``name`` unusable."""
        if name in self._problems:
            raise ModelUnavailable(name, self._problems[name])

    def call_timeout_s(self, name: str | None) -> float | None:
        """The bound of one call to model ``name`` (``models[].timeout_s``); None for no model
        or a name outside the allowlist. The LLM error handling abandons (and may retry) a call
        that outlives it; provider clients also get it as their request timeout."""
        if name is None:
            return None
        try:
            return self._config.model(name).timeout_s
        except KeyError:
            return None

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
        self.ensure_usable(name)
        return build_provider_model(model)


__all__ = ["ModelLoader", "ModelNotAllowed", "ModelUnavailable", "StateOnlyModel"]
