"""Ownership: which threads, runs, assistants and store namespaces a caller may see.

With authentication on, every resource belongs to a user:

- a **thread** to the user in its ``owner`` metadata, stamped from the caller's identity when the
  thread is created (by ``POST /threads``, by a run with ``if_not_exists=create``, by a stateless
  run, by a copy); a caller cannot set or change another user's name there;
- a **run** to the owner of its thread;
- an **assistant** to the ``owner`` in its metadata; an assistant without one is shared (system
  assistants, one per configured graph, and those made without authentication): visible to
  everyone, changed by admins only;
- a **store namespace** to the user named by its first label (``["alice", "memories"]``); a search
  or namespace listing without a prefix covers the caller's own namespaces.

Another user's resource is *not found* (404, the same answer as a missing one), on every route:
reads, writes, streams, joins, cancels, history, searches and counts. A caller with the ``admin``
permission sees every resource (explicitly: the permission comes from its key entry, token or
LangGraph handler). With ``auth.mode: none`` there are no users and nothing is checked.

Every route reaches threads, runs, assistants and namespaces through ``Access`` (the ``Caller``
dependency), so one place decides, and the ``@auth.on`` rules of ``auth.mode: langgraph``
(``auth_rules.py``) are applied on top at the same place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request

from agentkeel.gateway.auth import Identity, current_user
from agentkeel.gateway.auth_rules import AuthRules, AuthUser, Filter, matches
from agentkeel.gateway.errors import NotFound
from agentkeel.runtime.assistants import assistant_key
from agentkeel.runtime.records import RunRecord, ThreadRecord
from agentkeel.runtime.runtime import Runtime
from agentkeel.runtime.stores.assistants import OWNER_KEY, Assistant, visible_to
from agentkeel.runtime.threads import is_valid_thread_id

OWNER = OWNER_KEY


class Access:
    """One request's view of the resources (see the module docstring)."""

    def __init__(self, runtime: Runtime, identity: Identity | None, rules: AuthRules | None = None) -> None:
        self.runtime = runtime
        self.identity = identity
        self._rules = rules

    @property
    def user_id(self) -> str | None:
        return self.identity.user_id if self.identity is not None else None

    @property
    def scoped(self) -> bool:
        """Whether ownership limits this caller (authenticated and not an admin)."""
        return self.identity is not None and not self.identity.is_admin

    def owns(self, metadata: Mapping[str, Any]) -> bool:
        return not self.scoped or metadata.get(OWNER) == self.user_id

    def sees(self, metadata: Mapping[str, Any], found: Filter | None = None) -> bool:
        """Owned by the caller (or the caller is unscoped) and passing the rules' filter."""
        return self.owns(metadata) and matches(metadata, found)

    async def authorize(self, resource: str, action: str, value: dict[str, Any]) -> Filter | None:
        """The ``@auth.on`` rule's filter for this request (None: no rule, or no filter)."""
        if self._rules is None or self.identity is None:
            return None
        return await self._rules.authorize(self.identity, resource, action, value)

    def configurable(self) -> dict[str, Any]:
        """What a run's ``config.configurable`` says about its caller, under the keys LangGraph
        graphs read (``langgraph_auth_user`` and friends); nothing without authentication. The
        user holds what ``ctx.user`` holds, never a credential."""
        if self.identity is None:
            return {}
        return {"langgraph_auth_user": dict(AuthUser(self.identity)), "langgraph_auth_user_id": self.identity.user_id,
                "langgraph_auth_permissions": list(self.identity.permissions)}

    # -- metadata the caller writes -------------------------------------------------------------
    def owned(self, metadata: Mapping[str, Any] | None, field: str = "metadata") -> dict[str, Any]:
        """Metadata of a resource the caller creates, with its ``owner``. A scoped caller may not
        name another owner; an admin may (creating on someone's behalf)."""
        stamped = dict(metadata or {})
        if self.identity is None:
            return stamped
        if self.scoped:
            self.check_owner_change(stamped, {}, field)
            stamped[OWNER] = self.identity.user_id
        elif not isinstance(stamped.get(OWNER), str) or not stamped[OWNER]:
            stamped[OWNER] = self.identity.user_id
        return stamped

    def check_owner_change(self, patch: Mapping[str, Any], current: Mapping[str, Any], field: str = "metadata") -> None:
        """A scoped caller's metadata may carry ``owner`` only as its own (or the current) value."""
        if not self.scoped or OWNER not in patch:
            return
        if patch[OWNER] not in (self.user_id, current.get(OWNER, self.user_id)):
            raise HTTPException(422, f"{field}.{OWNER}: set by the server to the caller's user id; "
                                     "it cannot name another user")

    # -- threads and runs ---------------------------------------------------------------------------
    async def thread(self, thread_id: str, action: str = "read", **value: Any) -> ThreadRecord:
        """The thread, if it exists and the caller may ``action`` it; else ``NotFound``."""
        found = await self.authorize("threads", action, {"thread_id": thread_id, **value})
        thread = await self.runtime.store.get_thread(thread_id) if is_valid_thread_id(thread_id) else None
        if thread is None or not self.sees(thread.metadata, found):
            raise NotFound(f"Thread with ID {thread_id} not found")
        return thread

    async def run(self, run_id: str, thread_id: str | None = None, action: str = "read") -> RunRecord:
        """The run (of ``thread_id`` when given), if the caller may ``action`` its thread."""
        record = await self.runtime.store.get(run_id)
        if record is None or thread_id is not None and record.thread_id != thread_id:
            raise NotFound(f"Run {run_id} not found")
        try:
            await self.thread(record.thread_id, action, run_id=run_id)
        except NotFound:
            raise NotFound(f"Run {run_id} not found") from None
        return record

    def run_filter(self, action: str, search: dict[str, Any] | None = None) -> RunFilter:
        """A test of runs across threads (a bulk cancel, the console's runs list); see ``RunFilter``."""
        return RunFilter(self, action, search)

    async def visible_threads(self, threads: list[ThreadRecord], value: dict[str, Any]) -> list[ThreadRecord]:
        """The threads of a search the caller may see (``value``: the search, for the rule)."""
        found = await self.authorize("threads", "search", value)
        return [t for t in threads if self.sees(t.metadata, found)]

    # -- assistants ---------------------------------------------------------------------------------
    @property
    def assistants_visible_to(self) -> str | None:
        """``AssistantQuery.visible_to`` for this caller."""
        return self.user_id if self.scoped else None

    def sees_assistant(self, assistant: Assistant, found: Filter | None = None) -> bool:
        return visible_to(assistant, self.assistants_visible_to) and matches(assistant.metadata, found)

    async def assistant(self, assistant_id: str, action: str = "read", **value: Any) -> Assistant:
        """The assistant (an id or a configured name), if the caller may ``action`` it. A shared
        assistant (no ``owner``: system assistants, those made without authentication) is read by
        everyone and changed by admins only."""
        found = await self.authorize("assistants", action, {"assistant_id": assistant_id, **value})
        assistant = await self.runtime.assistants.get(assistant_key(assistant_id))
        if assistant is None or not self.sees_assistant(assistant, found):
            raise HTTPException(404, f"Assistant {assistant_id} not found")
        if action != "read" and self.scoped and OWNER not in assistant.metadata:
            raise HTTPException(403, f"Assistant {assistant_id} is shared: only an admin may {action} it")
        return assistant

    # -- store namespaces ---------------------------------------------------------------------------
    async def namespace(self, action: str, value: dict[str, Any], field: str) -> tuple[str, ...]:
        """The namespace (``value["namespace"]``) after the rules, if it is the caller's: its
        first label is the caller's user id (an empty prefix means the caller's own)."""
        if await self.authorize("store", action, value) is not None:
            raise TypeError(f"the @auth.on handler of store.{action} returned a filter; store rules "
                            "change value['namespace'] or refuse (False, an exception)")
        labels = tuple(value.get("namespace") or ())
        if not self.scoped:
            return labels
        if not labels and action in ("search", "list_namespaces"):
            return (str(self.user_id),)
        if not labels or labels[0] != self.user_id:
            raise NotFound(f"{field}: namespace {list(labels)} not found (a user's namespaces start with its user id)")
        return labels


class RunFilter:
    """Whether the caller may ``action`` a run's thread, each thread decided once. With ``search``
    (a listing's query) the rule is asked once for the whole listing, as for a search; without, it
    is asked per thread, as ``Access.thread`` asks it. Without authentication every run passes."""

    def __init__(self, access: Access, action: str, search: dict[str, Any] | None) -> None:
        self._access = access
        self._action = action
        self._search = search
        self._decided: dict[str, bool] = {}
        self._rule: Filter | None = None
        self._asked = False

    async def __call__(self, record: RunRecord) -> bool:
        if self._access.identity is None:
            return True
        if record.thread_id not in self._decided:
            self._decided[record.thread_id] = await self._may(record.thread_id)
        return self._decided[record.thread_id]

    async def _may(self, thread_id: str) -> bool:
        access = self._access
        if self._search is None:
            try:
                await access.thread(thread_id, self._action)
            except NotFound:
                return False
            return True
        if not self._asked:
            self._rule, self._asked = await access.authorize("threads", self._action, self._search), True
        thread = await access.runtime.store.get_thread(thread_id)
        return thread is not None and access.sees(thread.metadata, self._rule)


def _app_runtime(request: Request) -> Runtime:
    """``create_app`` keeps the runtime inside its ``Gateway`` (``app.state.gateway.runtime``); an
    app that needs nothing else may set ``app.state.runtime`` directly (the route tests do)."""
    state = request.app.state
    found = getattr(state, "runtime", None) or getattr(getattr(state, "gateway", None), "runtime", None)
    if found is None:
        raise RuntimeError("no runtime on app.state (neither app.state.runtime nor app.state.gateway)")
    return found


async def caller(request: Request) -> Access:
    """FastAPI dependency: the request's ``Access`` (identity from ``Authentication``, rules
    from ``auth.mode: langgraph``), the way every route reaches the runtime's resources. A
    coroutine for the same reason as ``deps.gateway``: no worker-thread hand-off per request."""
    rules = getattr(request.app.state, "auth_rules", None)
    return Access(_app_runtime(request), current_user(request), rules if isinstance(rules, AuthRules) else None)


Caller = Annotated[Access, Depends(caller)]
