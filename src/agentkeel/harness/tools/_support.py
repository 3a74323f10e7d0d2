"""What every workspace tool shares: the trusted context, error reporting, change reporting.

Errors are reported one way only: the tool raises :class:`ToolException` and is built with
``handle_tool_error=True``, so the model receives a ``ToolMessage`` with ``status="error"`` and a
one-line message. Host paths never appear in those messages; the model only knows ``/workspace``
(and ``/skills``, the read-only skills mount, when the run has one).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal, TypeAlias

from langchain.tools import ToolRuntime
from langchain_core.tools import StructuredTool, ToolException

from agentkeel.harness.context import RunContext
from agentkeel.harness.skills import SKILLS_ROOT
from agentkeel.sandbox.workspace import PathOutsideWorkspace, ReadOnlyMount, Workspace

Runtime: TypeAlias = ToolRuntime[Any, Any]
"""How tools declare their injected runtime.

The context is typed ``Any`` on purpose: LangChain builds a pydantic model from the tool signature,
and a bare ``ToolRuntime`` makes pydantic expect ``context=None`` (warning on every call) while
``ToolRuntime[RunContext, ...]`` makes it try to build a validator for RunContext's protocol
fields. :func:`run_context` checks the type instead.
"""


def run_context(runtime: Runtime) -> RunContext:
    """The run's trusted context (a graph without ``context_schema=RunContext`` is a bug)."""
    ctx = runtime.context
    if not isinstance(ctx, RunContext):
        raise ToolException("internal error: this tool was invoked without a run context")
    return ctx


def workspace(runtime: Runtime) -> Workspace:
    return Workspace(run_context(runtime).workspace_root)


def filesystem(ctx: RunContext, path: str) -> Workspace:
    """Where ``path`` lives: the skills mount for ``/skills`` and below (when the run has one),
    else the workspace. Both confine the path the same way (:meth:`Workspace.resolve`)."""
    if ctx.skills_root is not None:
        mount = ReadOnlyMount(ctx.skills_root, SKILLS_ROOT)
        if mount.contains(path):
            return mount
    return Workspace(ctx.workspace_root)


def writable(ctx: RunContext, path: str) -> Workspace:
    """:func:`filesystem` for a tool that changes ``path``; a tool error if it is read-only."""
    fs = filesystem(ctx, path)
    if not fs.writable:
        raise ToolException(
            f"{path}: {fs.virtual_root} is read-only (skills can be read, not changed); "
            "write to /workspace instead"
        )
    return fs


def report_touch(runtime: Runtime, virtual_path: str, tool_name: str, after_sha256: str | None = None) -> None:
    """Tell the run's change ledger that this tool call changed ``virtual_path`` (and, when known,
    the file's sha256 afterwards)."""
    touches = run_context(runtime).touches
    if touches is not None:
        touches.touched(virtual_path, runtime.tool_call_id, tool_name, after_sha256)


@contextmanager
def tool_errors(virtual_path: str) -> Iterator[None]:
    """Turn path and filesystem failures into tool errors that name the virtual path only."""
    try:
        yield
    except PathOutsideWorkspace as exc:
        raise ToolException(str(exc)) from None
    except FileNotFoundError:
        raise ToolException(f"{virtual_path}: no such file or directory") from None
    except IsADirectoryError:
        raise ToolException(f"{virtual_path}: is a directory") from None
    except NotADirectoryError:
        raise ToolException(f"{virtual_path}: a parent of this path is not a directory") from None
    except UnicodeDecodeError:
        raise ToolException(f"{virtual_path}: not a UTF-8 text file") from None
    except OSError as exc:
        raise ToolException(f"{virtual_path}: {exc.strerror or type(exc).__name__}") from None
    except ValueError as exc:
        raise ToolException(f"{virtual_path!r}: {exc}") from None


def make_tool(
    func: Callable[..., Any],
    name: str,
    response_format: Literal["content", "content_and_artifact"] = "content",
) -> StructuredTool:
    """A LangChain tool whose model-facing description and argument docs come from ``func``'s
    Google-style docstring, with tool errors reported to the model instead of raised.

    The argument schema (a pydantic model built from the signature and docstring) is made once
    per function definition: tools made per run (the ``task`` tool closes over the run's
    executor) are closures of one ``def``, which share a code object, and building the schema
    again cost about 16 ms of every run's start.
    """
    is_async = inspect.iscoroutinefunction(func)
    key = _schema_key(func, name)
    schema = _SCHEMAS.get(key) if key is not None else None
    tool = StructuredTool.from_function(
        func=None if is_async else func,
        coroutine=func if is_async else None,
        name=name,
        parse_docstring=True,
        response_format=response_format,
        handle_tool_error=True,
        args_schema=schema,
    )
    if key is not None and schema is None and isinstance(tool.args_schema, type):
        _SCHEMAS[key] = tool.args_schema
    return tool


_SCHEMAS: dict[tuple[Any, ...], type] = {}


def _schema_key(func: Callable[..., Any], name: str) -> tuple[Any, ...] | None:
    """What a generated schema depends on: the definition (code, docstring, annotations) and the
    defaults evaluated when the ``def`` ran; None for a callable that is not a plain function or
    has an unhashable default (not cached)."""
    code = getattr(func, "__code__", None)
    if code is None:
        return None
    key = (code, name, func.__doc__, getattr(func, "__defaults__", None),
           tuple(sorted((getattr(func, "__kwdefaults__", None) or {}).items())))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def is_binary(data: bytes) -> bool:
    """Whether file content looks binary (a NUL byte early on), as text tools should not show it."""
    return b"\0" in data[:8192]
