"""The shared agent graph (``harness/run_scope.py``): one compiled graph per assistant, each run's
model, guards and executor carried by its context — and never one run's state in another's."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml
from langchain.agents.middleware import AgentMiddleware
from langgraph.checkpoint.memory import InMemorySaver

from agentkeel.config import KeelConfig
from agentkeel.harness.agents import Harness
from agentkeel.harness.context import RunContext
from agentkeel.harness.run_scope import HOOKS, MissingRunScope, ScopeEntry, ScopeTemplate, stand_in, stand_ins

LS = {"name": "ls", "args": {"path": "/workspace"}}

# A third-party middleware written to the assistant's config: it counts the calls it sees and the
# model each model call went to, on the instance (what per-run state is).
EXTRA = '''
from langchain.agents.middleware import AgentMiddleware, hook_config

class Seen(AgentMiddleware):
    def __init__(self):
        super().__init__()
        self.models = []
        self.before = 0

    @hook_config(can_jump_to=["end"])
    async def abefore_model(self, state, runtime):
        self.before += 1
        return None

    async def awrap_model_call(self, request, handler):
        self.models.append(request.model)
        return await handler(request)

counter = [0]

class Renamed(AgentMiddleware):
    """A different name on every instance: no shared graph can stand in for it."""

    def __init__(self):
        super().__init__()
        counter[0] += 1
        self._label = f"Renamed{counter[0]}"

    @property
    def name(self):
        return self._label

    async def awrap_tool_call(self, request, handler):
        return await handler(request)
'''


def _config(tmp_path: Path, extra: str = "Seen", turns: int = 2) -> KeelConfig:
    (tmp_path / "extra.py").write_text(EXTRA)
    lead = [*({"say": f"step {i}", "tool_calls": [LS], "usage": {"input": 10, "output": 2}} for i in range(turns)),
            {"say": "done", "usage": {"input": 10, "output": 2}}]
    (tmp_path / "script.yaml").write_text(yaml.safe_dump({"agents": {"lead": lead}}))
    return KeelConfig(
        data_dir=str(tmp_path / "data"), database="memory://",
        models=[{"name": "demo", "use": "scripted", "script": str(tmp_path / "script.yaml")}],
        assistants=[{"assistant_id": "lead", "model": "demo", "middleware": [f"./extra.py:{extra}"]}],
        base_dir=tmp_path,
    )


async def _run(harness: Harness, run_id: str, workspace: Path) -> tuple[Any, dict[str, Any]]:
    """One run of the lead on a graph from ``harness.build``; its scope and final state."""
    config: dict[str, Any] = {"configurable": {"thread_id": run_id}, "metadata": {"run_id": run_id}}
    chain = harness.chain(harness.resolve("lead"))
    built = await harness.build(harness.resolve("lead"), config, chain)  # type: ignore[arg-type]
    graph = built.graph.copy(update={"checkpointer": InMemorySaver()})
    workspace.mkdir(parents=True, exist_ok=True)
    context = RunContext(thread_id=run_id, run_id=run_id, workspace_root=workspace, run_scope=built.scope)
    state = await graph.ainvoke({"messages": [{"role": "user", "content": "go"}]}, config, context=context)
    return built, {"state": state, "chain": chain}


def _seen(chain: Any) -> Any:
    (member,) = [m for m in chain.middlewares if type(m).__name__ == "Seen"]
    return member


async def test_runs_share_one_compiled_graph_and_keep_their_own_guards_and_model(tmp_path: Path) -> None:
    harness = Harness(_config(tmp_path))
    (a, ran_a), (b, ran_b) = await asyncio.gather(
        _run(harness, "run-a", tmp_path / "a"), _run(harness, "run-b", tmp_path / "b")
    )
    assert a.graph is b.graph  # compiled once (at start-up), not per run
    assert a.scope is not None and b.scope is not None and a.scope.model is not b.scope.model
    for built, ran in ((a, ran_a), (b, ran_b)):
        assert ran["state"]["messages"][-1].content == "done"
        seen = _seen(ran["chain"])  # the run's own instance got every call of its run, no other's
        assert seen.before == 3
        assert seen.models == [built.scope.model] * 3  # the run's model, not the placeholder


async def test_a_shared_graph_run_without_its_scope_fails_loudly(tmp_path: Path) -> None:
    harness = Harness(_config(tmp_path))
    config: dict[str, Any] = {"configurable": {"thread_id": "t"}, "metadata": {"run_id": "r"}}
    built = await harness.build(harness.resolve("lead"), config)  # type: ignore[arg-type]
    graph = built.graph.copy(update={"checkpointer": InMemorySaver()})
    (tmp_path / "w").mkdir()
    context = RunContext(thread_id="t", run_id="r", workspace_root=tmp_path / "w")  # no run_scope
    with pytest.raises(MissingRunScope):
        await graph.ainvoke({"messages": [{"role": "user", "content": "go"}]}, config, context=context)


async def test_a_chain_of_another_shape_gets_a_graph_of_its_own(tmp_path: Path) -> None:
    harness = Harness(_config(tmp_path, extra="Renamed"))
    (a, ran_a), (b, _) = [await _run(harness, f"run-{x}", tmp_path / x) for x in "ab"]
    assert a.scope is None and b.scope is None and a.graph is not b.graph
    assert ran_a["state"]["messages"][-1].content == "done"


def test_a_stand_in_looks_to_langchain_like_what_it_stands_in_for(tmp_path: Path) -> None:
    harness = Harness(_config(tmp_path))
    middleware = harness.chain(harness.resolve("lead")).for_agent()
    base = {hook: getattr(AgentMiddleware, hook) for hook in HOOKS}
    for index, member in enumerate(middleware):
        double = stand_in(member, index)
        assert (double.name, double.state_schema) == (member.name, member.state_schema)
        assert [t.name for t in double.tools] == [t.name for t in getattr(member, "tools", [])]
        for hook in HOOKS:
            overridden = getattr(type(member), hook) is not base[hook]
            assert (getattr(type(double), hook) is not base[hook]) == overridden, (member.name, hook)
            if overridden:
                assert getattr(getattr(type(double), hook), "__can_jump_to__", None) == getattr(
                    getattr(type(member), hook), "__can_jump_to__", None
                ), (member.name, hook)
    template = ScopeTemplate.of(middleware)
    doubles = stand_ins(middleware)  # the first model wrapper gives the run's model: no entry
    assert [d.name for d in doubles] == [m.name for m in middleware]
    no_model = [m for m in middleware if not any(
        getattr(type(m), h) is not base[h] for h in ("wrap_model_call", "awrap_model_call"))]
    assert isinstance(stand_ins(no_model)[0], ScopeEntry)
    assert template.fits(harness.chain(harness.resolve("lead")).for_agent())
    assert not template.fits(middleware[:-1])


def test_a_middleware_with_tools_of_its_own_per_instance_does_not_share_a_graph() -> None:
    from langchain_core.tools import tool

    class WithTool(AgentMiddleware):
        def __init__(self) -> None:
            super().__init__()

            @tool
            def lookup(key: str) -> str:
                """Look a key up."""
                return key

            self.tools = [lookup]

    first, second = WithTool(), WithTool()
    assert not ScopeTemplate.of([first]).fits([second])  # same tool name, another object
    assert ScopeTemplate.of([first]).fits([first])


async def test_the_scope_entry_hands_each_model_call_the_runs_model(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from langchain.agents.middleware.types import ModelRequest

    from agentkeel.harness.models import StateOnlyModel
    from agentkeel.harness.run_scope import RunScope

    run_model = StateOnlyModel()
    context = RunContext(thread_id="t", run_id="r", workspace_root=tmp_path, run_scope=RunScope(run_model, ()))
    request = ModelRequest(model=StateOnlyModel(), messages=[], runtime=SimpleNamespace(context=context))  # type: ignore[arg-type]
    seen: list[Any] = []

    async def handler(sent: ModelRequest) -> str:
        seen.append(sent.model)
        return "answered"

    assert await ScopeEntry().awrap_model_call(request, handler) == "answered"
    assert seen == [run_model] and request.model is not run_model
    with pytest.raises(MissingRunScope):
        await ScopeEntry().awrap_model_call(request.override(runtime=SimpleNamespace(context=None)), handler)  # type: ignore[arg-type]
