"""What a compiled graph says about itself: its drawable structure and its JSON schemas.

Each schema is computed independently and is ``null`` when the graph cannot produce it (a channel
type pydantic cannot describe, say) -- the SDK documents every schema as optional, and one
undescribable channel must not hide the others.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

from langgraph.channels.base import BaseChannel
from langgraph.pregel import Pregel
from pydantic import ConfigDict, create_model

from agentkeel.runtime.serialization import to_jsonable

log = logging.getLogger(__name__)


def _optional(what: str, build: Callable[[], dict[str, Any] | None]) -> dict[str, Any] | None:
    try:
        return build()
    except Exception as exc:  # any failure means "not describable", never a failed request
        log.debug("no %s: %s", what, exc)
        return None


def _state_schema(graph: Pregel) -> dict[str, Any]:
    """Every public channel with the type of its value (LangGraph has no state-schema helper)."""
    fields: dict[str, Any] = {
        name: (channel.ValueType, None)
        for name, channel in graph.channels.items()
        if isinstance(channel, BaseChannel) and not name.startswith("_") and ":" not in name
    }
    model = create_model(
        graph.get_name("State"), __config__=ConfigDict(arbitrary_types_allowed=True), **fields
    )
    return model.model_json_schema()


def _config_schema(graph: Pregel) -> dict[str, Any]:
    # Deprecated in LangGraph in favour of the context schema, but still part of the API's shape.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return graph.get_config_jsonschema()


def graph_schemas(graph_id: str, graph: Pregel) -> dict[str, Any]:
    return {
        "graph_id": graph_id,
        "input_schema": _optional("input schema", graph.get_input_jsonschema),
        "output_schema": _optional("output schema", graph.get_output_jsonschema),
        "state_schema": _optional("state schema", lambda: _state_schema(graph)),
        "config_schema": _optional("config schema", lambda: _config_schema(graph)),
        "context_schema": _optional("context schema", graph.get_context_jsonschema),
    }


async def graph_structure(graph: Pregel, xray: bool | int) -> dict[str, Any]:
    """``{nodes: [{id, type, data}], edges: [{source, target, conditional?, data?}]}``."""
    drawable = await graph.aget_graph(xray=xray)
    return to_jsonable(drawable.to_json())


async def subgraph_schemas(
    graph_id: str, graph: Pregel, namespace: str | None, recurse: bool
) -> dict[str, Any]:
    """``{namespace: schemas}`` of the graph's subgraphs (``parent|child`` for nested ones)."""
    return {
        ns: graph_schemas(graph_id, subgraph)  # type: ignore[arg-type]
        async for ns, subgraph in graph.aget_subgraphs(namespace=namespace, recurse=recurse)
    }
