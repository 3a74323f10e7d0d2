"""Provider chat models (``use: "<provider>:<model>"``): what is checked at start-up, and how one is built.

Checked once, at start-up, per configured model: the provider is one LangChain's
``init_chat_model`` knows, its package imports, and its API key variable is set. Each problem is one
message; a model with problems is *unusable* — its runs are refused before admission — but it does
not stop the process, so a server whose other models are fine keeps serving them.

Built with the provider client's own retries off (``max_retries=0``: AgentKeel's LLM error
handling is the one retry layer, so ``limits.llm_retry.max_attempts`` is the true count of requests
per model call), ``timeout_s`` as the client's request timeout, and streaming usage always
requested where the client has the switch (``stream_usage=True``: ``ChatOpenAI`` otherwise asks for
usage in streams only on OpenAI's own URL, so a ``base_url`` deployment would count zero tokens and
its token budget would never bind).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from typing import Any

from langchain_core.language_models import BaseChatModel

from agentkeel.config import ModelConfig

# The variable a provider's client reads its key from when ``api_key_env`` is not given. A
# provider not listed here has its key checked only when ``api_key_env`` names one.
DEFAULT_KEY_ENV = {
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "azure_openai": "AZURE_OPENAI_API_KEY",
}

# The AgentKeel extra that installs a provider's package; other providers name their package.
EXTRAS = {"openai": "openai", "azure_openai": "openai", "anthropic": "anthropic"}


class ModelUnavailable(RuntimeError):
    """A configured model cannot be used (found at start-up); its runs are refused before admission."""

    def __init__(self, name: str, problems: list[str]) -> None:
        super().__init__(f"model {name!r} cannot be used: " + "; ".join(problems))
        self.name = name
        self.problems = problems


@dataclass(frozen=True)
class ProviderSpec:
    """Where ``init_chat_model`` finds a provider's class."""

    provider: str
    model: str
    module: str
    class_name: str

    @property
    def package(self) -> str:
        return self.module.split(".", 1)[0].replace("_", "-")

    @property
    def install_hint(self) -> str:
        extra = EXTRAS.get(self.provider)
        return f"pip install 'agentkeel[{extra}]'" if extra else f"pip install {self.package}"


def _registry() -> dict[str, tuple[str, str, Any]]:
    """LangChain's provider table: the one source of which ``<provider>:`` prefixes
    ``init_chat_model`` accepts and which package and class each one builds."""
    from langchain.chat_models import base

    return base._BUILTIN_PROVIDERS


def known_providers() -> list[str]:
    return sorted(_registry())


def provider_spec(use: str) -> ProviderSpec | None:
    """``"openai:gpt-4.1-mini"`` -> its spec; None when the provider is not one LangChain knows."""
    provider, _, model = use.partition(":")
    entry = _registry().get(provider)
    if entry is None:
        return None
    return ProviderSpec(provider, model, entry[0], entry[1])


def key_env(model: ModelConfig, spec: ProviderSpec) -> str | None:
    """The variable that must hold the model's API key (None: the provider's key is not checked)."""
    return model.api_key_env or DEFAULT_KEY_ENV.get(spec.provider)


def check_provider(model: ModelConfig) -> list[str]:
    """Every reason this provider model cannot be used here, one message each (empty: usable)."""
    spec = provider_spec(model.use)
    if spec is None:
        provider = model.use.partition(":")[0]
        return [f"unknown provider {provider!r} in use: {model.use!r} (known: {', '.join(known_providers())})"]
    problems = []
    if not spec.model:
        problems.append(f"use: {model.use!r} names no model after {spec.provider + ':'!r}")
    cls = _provider_class(spec)
    if cls is None:
        problems.append(f"the {spec.provider} provider needs the {spec.package} package: {spec.install_hint}")
    else:
        accepted = _accepted_kwargs(cls)
        for key, value in (("base_url", model.base_url), ("api_key_env", model.api_key_env)):
            wanted = "api_key" if key == "api_key_env" else key
            if value and wanted not in accepted:
                problems.append(f"{key}: {cls.__name__} takes no {wanted!r}")
    variable = key_env(model, spec)
    if variable and not os.environ.get(variable):
        problems.append(f"environment variable {variable} (the API key) is not set")
    return problems


def build_provider_model(model: ModelConfig) -> BaseChatModel:
    """A new provider chat model for one run. Raises ``ModelUnavailable`` when it cannot be built
    (the start-up check normally refused its runs before they were admitted)."""
    from langchain.chat_models import init_chat_model

    spec = provider_spec(model.use)
    cls = _provider_class(spec) if spec is not None else None
    if spec is None or cls is None:
        raise ModelUnavailable(model.name, check_provider(model))
    kwargs = provider_kwargs(model, spec, _accepted_kwargs(cls))
    return init_chat_model(spec.model, model_provider=spec.provider, **kwargs)


def provider_kwargs(model: ModelConfig, spec: ProviderSpec, accepted: set[str]) -> dict[str, Any]:
    """The constructor keyword arguments: ours (only those the class takes, so nothing unknown
    slips into the request body), then ``options`` verbatim."""
    ours: dict[str, Any] = {"max_retries": 0, "timeout": model.timeout_s, "stream_usage": True}
    variable = key_env(model, spec)
    if variable:
        key = os.environ.get(variable)
        if not key:
            raise ModelUnavailable(model.name, [f"environment variable {variable} (the API key) is not set"])
        ours["api_key"] = key
    if model.base_url:
        ours["base_url"] = model.base_url
    if model.temperature is not None:
        ours["temperature"] = model.temperature
    return {**{k: v for k, v in ours.items() if k in accepted}, **model.options}


def _provider_class(spec: ProviderSpec) -> type[BaseChatModel] | None:
    """The provider's chat model class, or None when its package is not installed."""
    try:
        if importlib.util.find_spec(spec.module.split(".", 1)[0]) is None:
            return None
        module = importlib.import_module(spec.module)
    except ImportError:
        return None
    cls = getattr(module, spec.class_name, None)
    return cls if isinstance(cls, type) and issubclass(cls, BaseChatModel) else None


def _accepted_kwargs(cls: type[BaseChatModel]) -> set[str]:
    """Field names and aliases the class's constructor takes."""
    names: set[str] = set()
    for name, field in cls.model_fields.items():
        names.add(name)
        if field.alias:
            names.add(field.alias)
    return names


__all__ = [
    "DEFAULT_KEY_ENV",
    "ModelUnavailable",
    "ProviderSpec",
    "build_provider_model",
    "check_provider",
    "key_env",
    "known_providers",
    "provider_kwargs",
    "provider_spec",
]
