"""``@auth.on`` handlers of a ``langgraph_sdk.Auth``: what an authenticated caller may do.

A deployment that brings its LangGraph auth file (``auth.mode: langgraph``) brings its
authorization too. Each request is mapped to the ``(resource, action)`` the LangGraph server
uses (threads ``create``/``read``/``update``/``delete``/``search``/``create_run``, assistants
``create``/``read``/``update``/``delete``/``search``, store ``put``/``get``/``search``/``delete``/
``list_namespaces``) and the most specific handler answers: ``(resource, action)``, then
``(resource, "*")``, then ``("*", action)``, then the global ``@auth.on`` handler. It is awaited
as ``handler(ctx=AuthContext, value=dict)`` and may:

- return ``None`` or ``True``: allowed;
- return ``False``: 403;
- return a filter (``{"owner": "alice"}``, ``{"k": {"$eq": v}}``, ``{"k": {"$contains": v}}``,
  keys ANDed): the request sees only resources whose metadata match it (others are 404, and absent
  from searches and counts);
- change ``value`` in place: ``value["metadata"]`` of a create becomes the stored metadata, a
  store handler's ``value["namespace"]`` the namespace used;
- raise ``Auth.exceptions.HTTPException`` (its status and detail are the answer) or fail an
  ``assert`` (403).

These rules are applied on top of the built-in ownership (``access.py``), never instead of it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from langgraph_sdk import Auth
from langgraph_sdk.auth.types import AuthContext

from agentkeel.gateway.auth import AuthFailure, Identity

Filter = dict[str, Any]
OPERATORS = frozenset({"$eq", "$contains"})


class AuthUser(Mapping[str, Any]):
    """The caller as handlers see it (``ctx.user``): LangGraph's ``BaseUser`` protocol
    (``identity``, ``display_name``, ``is_authenticated``, ``permissions``) and a mapping of
    those plus whatever else the authenticate handler or token said."""

    def __init__(self, identity: Identity) -> None:
        self._identity = identity
        self._fields: dict[str, Any] = {
            **identity.claims,
            "identity": identity.user_id,
            "display_name": identity.display_name,
            "is_authenticated": True,
            "permissions": list(identity.permissions),
        }

    @property
    def identity(self) -> str:
        return self._identity.user_id

    @property
    def display_name(self) -> str:
        return self._identity.display_name

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def permissions(self) -> list[str]:
        return list(self._identity.permissions)

    def __getitem__(self, key: str) -> Any:
        return self._fields[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)


def check_filter(found: Filter) -> Filter:
    """A handler's filter, refused (``TypeError``: a handler bug) when it is not one."""
    for key, condition in found.items():
        if not isinstance(key, str):
            raise TypeError(f"an @auth.on filter key must be a string, got {key!r}")
        if isinstance(condition, dict) and (not condition or set(condition) - OPERATORS):
            raise TypeError(f"@auth.on filter {key!r}: operators are {sorted(OPERATORS)}, got {sorted(condition)}")
    return found


def matches(metadata: Mapping[str, Any], found: Filter | None) -> bool:
    """Whether a resource with ``metadata`` passes a handler's filter (None passes)."""
    for key, condition in (found or {}).items():
        actual = metadata.get(key)
        if not isinstance(condition, dict):
            condition = {"$eq": condition}
        if "$eq" in condition and (key not in metadata or actual != condition["$eq"]):
            return False
        if "$contains" in condition:
            wanted = condition["$contains"]
            members = actual if isinstance(actual, list) else []
            if not all(w in members for w in (wanted if isinstance(wanted, list) else [wanted])):
                return False
    return True


class AuthRules:
    """The ``@auth.on`` handlers of one ``Auth`` object (see the module docstring)."""

    def __init__(self, auth: Auth) -> None:
        self._auth = auth

    @property
    def empty(self) -> bool:
        return not self._auth._handlers and not self._auth._global_handlers

    def _handler(self, resource: str, action: str) -> Any:
        handlers = self._auth._handlers
        for key in ((resource, action), (resource, "*"), ("*", action)):
            if key in handlers:
                return handlers[key][-1]
        return self._auth._global_handlers[-1] if self._auth._global_handlers else None

    async def authorize(self, identity: Identity, resource: str, action: str, value: dict[str, Any]) -> Filter | None:
        """Ask the handler of ``(resource, action)``; raises ``AuthFailure`` when it refuses."""
        handler = self._handler(resource, action)
        if handler is None:
            return None
        ctx = AuthContext(
            permissions=list(identity.permissions), user=AuthUser(identity),
            resource=resource, action=action,  # type: ignore[arg-type]  # the SDK's literal types
        )
        try:
            result = await handler(ctx=ctx, value=value)
        except Auth.exceptions.HTTPException as exc:
            raise AuthFailure(str(exc.detail), exc.status_code, exc.headers or {}) from None
        except AssertionError as exc:
            raise AuthFailure(str(exc) or "Forbidden", 403, {}) from None
        if result is None or result is True:
            return None
        if result is False:
            raise AuthFailure(f"Forbidden: not allowed to {action} {resource}", 403, {})
        if isinstance(result, dict):
            return check_filter(result)
        raise TypeError(f"the @auth.on handler of {resource}.{action} returned {type(result).__name__}, "
                        "not None, a bool or a filter dict")
