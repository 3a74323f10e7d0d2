"""Watching one model call's callbacks from a middleware.

A model-call wrapper sees the request and the finished response, not what happens in between:
the streamed chunks reach only the callbacks of the runnable config in force. Guards that must see
them (the raw text of streamed tool-call arguments; whether a stream is still producing) add a
handler to that config for the duration of the call — inherited by the chat model, never by the
rest of the graph.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler, BaseCallbackManager
from langchain_core.runnables.config import ensure_config, var_child_runnable_config


class TokenListener(BaseCallbackHandler):
    """A handler that only wants a call's streamed tokens (``on_llm_new_token``), on the loop.

    Why ``ignore_chat_model``: a handler without ``on_chat_model_start`` makes LangChain fall back
    to ``on_llm_start``, rendering every message of the request to one prompt string first — work
    proportional to the history on every model call, for a handler that ignores it.
    ``run_inline``: a synchronous handler is otherwise called in a thread pool.
    """

    run_inline = True

    @property
    def ignore_chat_model(self) -> bool:
        return True


@contextmanager
def listening(handler: BaseCallbackHandler) -> Iterator[None]:
    """Add ``handler`` to the callbacks of every runnable (the chat model) called in this block."""
    config = ensure_config()
    callbacks = config.get("callbacks")
    if isinstance(callbacks, BaseCallbackManager):
        manager = callbacks.copy()
        manager.add_handler(handler, inherit=True)
        added: Any = manager
    else:
        added = [*(callbacks or []), handler]
    token = var_child_runnable_config.set({**config, "callbacks": added})
    try:
        yield
    finally:
        var_child_runnable_config.reset(token)


__all__ = ["TokenListener", "listening"]
