"""Loading user LangGraph graphs named under ``graphs:`` (langgraph.json style references).

A reference is ``./path/to/file.py:attr`` (relative to the config file) or ``package.module:attr``.
The attribute is a compiled graph, an uncompiled ``StateGraph``, or a factory taking a
``RunnableConfig`` (sync or async) that returns either. The runtime only ever sees a compiled graph.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.graph import StateGraph
from langgraph.pregel import Pregel


class GraphLoadError(ValueError):
    """A ``graphs:`` entry cannot be imported or does not name a graph."""


def load_graph_target(name: str, ref: str, base_dir: Path) -> Any:
    """Import the object a ``graphs:`` reference names (not yet compiled or called)."""
    return load_reference(f"graphs.{name}", ref, base_dir)


def load_reference(label: str, ref: str, base_dir: Path) -> Any:
    """Import the object ``./file.py:attr`` or ``pkg.mod:attr`` names; errors start with ``label``
    (the config key path)."""
    module_ref, sep, attr = ref.rpartition(":")
    if not sep or not module_ref or not attr:
        raise GraphLoadError(f"{label}: {ref!r} must look like './file.py:attr' or 'pkg.mod:attr'")
    try:
        if module_ref.endswith(".py") or "/" in module_ref:
            module = _import_file(label, (base_dir / module_ref).resolve())
        else:
            module = importlib.import_module(module_ref)
    except GraphLoadError:
        raise
    except Exception as exc:  # an import error in user code is a config error, said plainly
        raise GraphLoadError(f"{label}: cannot import {module_ref!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise GraphLoadError(f"{label}: {module_ref!r} has no attribute {attr!r}") from None


def _import_file(label: str, path: Path) -> Any:
    if not path.is_file():
        raise GraphLoadError(f"{label}: file not found: {path}")
    module_name = "agentkeel_user_" + "".join(c if c.isalnum() else "_" for c in label)
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise GraphLoadError(f"{label}: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


async def materialize_graph(name: str, target: Any, config: RunnableConfig) -> Pregel:
    """Turn a loaded target into a compiled graph (calling a factory with the run's config)."""
    value = target
    if not isinstance(value, (Pregel, StateGraph)) and callable(value):
        value = value(config) if _takes_argument(value) else value()
        if inspect.isawaitable(value):
            value = await value
    if isinstance(value, StateGraph):
        value = value.compile()
    if not isinstance(value, Pregel):
        raise GraphLoadError(
            f"graphs.{name}: expected a compiled graph, a StateGraph or a factory returning one, "
            f"got {type(value).__name__}"
        )
    return value


def _takes_argument(factory: Any) -> bool:
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)
