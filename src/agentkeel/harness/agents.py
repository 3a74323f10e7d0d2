"""Building the graph a run executes: an AgentKeel assistant or a user graph.

The harness owns agent building; the runtime asks for a graph by assistant id and never looks
inside. Everything that can be checked without running is checked by ``resolve`` (before a run is
admitted), so a request naming an unknown assistant or a model outside the allowlist leaves no run
behind.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.pregel import Pregel

from agentkeel.config import AssistantConfig, KeelConfig
from agentkeel.harness import langsmith_inline
from agentkeel.harness.context import RunContext
from agentkeel.harness.graphs import GraphLoadError, load_graph_target, load_reference, materialize_graph
from agentkeel.harness.middleware.catalog import build_agent_chain
from agentkeel.harness.middleware.chain import Chain
from agentkeel.harness.middleware.llm_error_handling import ModelRef
from agentkeel.harness.middleware.summarization import SUMMARY_AGENT, Summarization
from agentkeel.harness.models import ModelLoader, ModelNotAllowed, ModelUnavailable, StateOnlyModel
from agentkeel.harness.run_scope import RunScope, ScopeTemplate, stand_ins
from agentkeel.harness.scripted import ScriptedChatModel
from agentkeel.harness.skills import Skill, load_skills, skills_prompt
from agentkeel.harness.state import agent_state_schema
from agentkeel.harness.subagents import (
    MAX_DEPTH,
    TASK_TOOL,
    Capacity,
    ChildAgent,
    SubagentExecutor,
    SubagentType,
    resolve_types,
    task_tool,
)
from agentkeel.harness.tools import WORKSPACE_TOOL_NAMES, build_tools
from agentkeel.limits import TurnLimits

log = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful agent working in the directory /workspace. Deliverables go to "
    "/workspace/outputs. Read a file before you change it, and finish with a short summary."
)


# Run-config metadata key: model turns the lead already made in earlier attempts of the run (a
# resumed run); a scripted model continues its script there instead of replaying it from turn 1.
TURNS_DONE_KEY = "agentkeel_turns_done"


class UnknownAssistant(LookupError):
    """No assistant or graph of that id is configured."""


@dataclass(frozen=True)
class ResolvedAssistant:
    assistant_id: str
    kind: Literal["agent", "graph"]
    model_name: str | None  # None for user graphs


@dataclass(frozen=True)
class AgentBuild:
    """What :meth:`Harness.build` gives a run: the graph to execute and, when it is the assistant's
    shared graph, the run's scope, which must be the run's ``RunContext.run_scope``."""

    graph: Pregel
    scope: RunScope | None = None


class Harness:
    def __init__(self, config: KeelConfig, checkpoint_mode: Literal["full", "delta"] = "full") -> None:
        self._config = config
        self._mode = checkpoint_mode
        langsmith_inline.install()  # untraced middleware calls stay on the loop (langsmith_inline.py)
        self.models = ModelLoader(config)
        # Skills too: a SKILL.md with bad front matter stops start-up (SkillError names the file).
        self.skills_root = config.skills_path
        self.skills: list[Skill] = load_skills(self.skills_root) if self.skills_root else []
        self._skills_section = skills_prompt(self.skills)
        # Import user graphs at start-up: a broken reference stops start-up, not the first run.
        self._graphs = {
            name: load_graph_target(name, ref, config.base_dir) for name, ref in config.graphs.items()
        }
        self._extra_middleware = {
            a.assistant_id: [
                _middleware_factory(f"assistants.{i}.middleware.{j}", ref, config)
                for j, ref in enumerate(a.middleware)
            ]
            for i, a in enumerate(config.assistants)
        }
        # Subagent types are checked now too (an unknown tool name is a start-up error), and the
        # process's subagent capacity is shared by every run this harness builds.
        self.subagent_types: dict[str, SubagentType] = resolve_types(
            config.subagents, [t for t in WORKSPACE_TOOL_NAMES if config.tools.bash or t != "bash"]
        )
        self.subagent_capacity = Capacity(config.subagents.process_capacity)
        # Compile every assistant's shared graph (``harness/run_scope.py``) for its default model
        # now: a chain that breaks a contract stops start-up, and the first run does not pay for it.
        self._shared: dict[tuple[str, str], tuple[Pregel, ScopeTemplate]] = {}
        for assistant in config.assistants:
            self._shared_graph(self.resolve(assistant.assistant_id))

    @property
    def assistant_ids(self) -> list[str]:
        return [a.assistant_id for a in self._config.assistants] + list(self._graphs)

    def resolve(self, assistant_id: str, model_name: str | None = None) -> ResolvedAssistant:
        if assistant_id in self._graphs:
            if model_name is not None:
                self.models.check(model_name)
            return ResolvedAssistant(assistant_id, "graph", model_name)
        assistant = self._config.assistant(assistant_id)
        if assistant is None:
            raise UnknownAssistant(
                f"assistant {assistant_id!r} not found; configured: {self.assistant_ids}"
            )
        name = model_name or self._config.default_model_for(assistant)
        self.models.check(name)
        return ResolvedAssistant(assistant_id, "agent", name)

    def chain(self, resolved: ResolvedAssistant) -> Chain:
        """A fresh, checked middleware chain for one run of an agent assistant (its guards keep
        per-run state, so a chain is never shared between runs)."""
        if resolved.kind != "agent" or resolved.model_name is None:
            raise ValueError(f"{resolved.assistant_id!r} is a user graph; it has no middleware chain")
        limits = self._config.limits
        assistant = self._config.assistant(resolved.assistant_id)
        return build_agent_chain(
            "lead",
            limits,
            strict_grammar=self._strict(resolved.model_name),
            extra=[factory() for factory in self._extra_middleware.get(resolved.assistant_id, [])],
            model=self.model_ref(resolved.model_name),
            delegation=self._config.subagents if assistant is not None and _delegates(assistant.tools) else None,
        )

    def _strict(self, model_name: str) -> bool:
        return self._config.limits.request_grammar.mode == "strict" or self.models.strict(model_name)

    def model_ref(self, name: str) -> ModelRef:
        """What the retry layer needs to know of a configured model: its names for error messages,
        its key variable, and one call's bound (``models[].timeout_s``)."""
        model = self.models.check(name)
        return ModelRef(name=model.name, use=model.use, key_env=model.api_key_env,
                        timeout_s=self.models.call_timeout_s(name))

    async def build(self, resolved: ResolvedAssistant, config: RunnableConfig, chain: Chain | None = None) -> AgentBuild:
        """What one run executes: the assistant's shared graph and the run's scope (a fresh model,
        guard state and ``task`` executor; ``harness/run_scope.py``), or a user graph. No
        checkpointer is attached.

        ``chain``: the run's chain from :meth:`chain`, when the caller also needs its manifest; by
        default a fresh one is built. A chain whose LangChain middleware does not have the shape
        the shared graph was compiled for (a factory of ``assistants[].middleware`` that returns
        other classes from run to run) gets a graph built for this run alone.
        """
        if resolved.kind == "graph":
            return AgentBuild(await materialize_graph(resolved.assistant_id, self._graphs[resolved.assistant_id], config))
        assistant = self._config.assistant(resolved.assistant_id)
        assert assistant is not None and resolved.model_name is not None
        metadata = config.get("metadata") or {}
        run_key = metadata.get("run_id")
        model = self.models.build(resolved.model_name, run_key=run_key,
                                  turns_done=int(metadata.get(TURNS_DONE_KEY) or 0))
        chain = chain or self.chain(resolved)
        self._bind_summarizers(chain, resolved.model_name, model, run_key)
        executor = self._executor(resolved.model_name, model, run_key, 0) if _delegates(assistant.tools) else None
        middleware = tuple(chain.for_agent())
        graph, template = self._shared_graph(resolved)
        if template.fits(middleware):
            return AgentBuild(graph, RunScope(model, middleware, executor))
        log.debug("assistant %r: this run's middleware differs from the shared graph's; building its own",
                  resolved.assistant_id)
        task = [task_tool(executor, self._config.subagents.max_per_run)] if executor is not None else []
        return AgentBuild(self._compile(resolved.assistant_id, assistant, model, list(middleware), task))

    async def state_graph(self, resolved: ResolvedAssistant, config: RunnableConfig) -> Pregel:
        """A graph to read a thread's state and history with, never to run: an agent's shared
        graph (its placeholder model needs no provider package or key), or the user graph."""
        if resolved.kind == "graph":
            return await materialize_graph(resolved.assistant_id, self._graphs[resolved.assistant_id], config)
        return self._shared_graph(resolved)[0]

    def _shared_graph(self, resolved: ResolvedAssistant) -> tuple[Pregel, ScopeTemplate]:
        """The agent graph every run of ``resolved`` shares, compiled on first use."""
        key = (resolved.assistant_id, resolved.model_name or "")
        shared = self._shared.get(key)
        if shared is None:
            assistant = self._config.assistant(resolved.assistant_id)
            assert assistant is not None and resolved.model_name is not None
            middleware = self.chain(resolved).for_agent()
            template = ScopeTemplate.of(middleware)
            task = []
            if _delegates(assistant.tools):  # its description is the configuration's; its executor the run's
                described_by = self._executor(resolved.model_name, StateOnlyModel(), None, 0)
                task = [task_tool(described_by, self._config.subagents.max_per_run, per_run=True)]
            graph = self._compile(resolved.assistant_id, assistant, StateOnlyModel(), stand_ins(middleware), task)
            shared = self._shared[key] = (graph, template)
        return shared

    def _compile(self, assistant_id: str, assistant: AssistantConfig, model: BaseChatModel,
                 middleware: list[Any], task: list[BaseTool]) -> Pregel:
        tools = [*build_tools(bash_enabled=self._config.tools.bash, names=_without_task(assistant.tools)), *task]
        return create_agent(
            model,
            tools,
            system_prompt=self._prompt(assistant.system_prompt or DEFAULT_SYSTEM_PROMPT, tools),
            middleware=middleware,
            state_schema=agent_state_schema(self._mode),
            context_schema=RunContext,
            name=assistant_id,
        )

    def _prompt(self, prompt: str, tools: list[Any]) -> str:
        if self._skills_section and any(tool.name == "read_file" for tool in tools):
            return f"{prompt}\n\n{self._skills_section}"  # an agent that cannot read them is not told
        return prompt

    def _bind_summarizers(self, chain: Chain, model_name: str, model: BaseChatModel, run_key: str | None) -> None:
        """The summary model of each Summarization member: the one its settings name
        (``limits.summarization`` or, for a subagent, ``subagents.summarization``), else the agent's."""
        for member in (m for m in chain.middlewares if isinstance(m, Summarization)):
            name = member.limits.model or model_name
            summary_model = self.summary_model(name, model_name, model, run_key)
            member.bind_model(summary_model, name, self.models.call_timeout_s(name))

    # -- subagents -------------------------------------------------------------------------
    def _executor(
        self, model_name: str, model: BaseChatModel, run_key: str | None, depth: int, levels: int = MAX_DEPTH,
    ) -> SubagentExecutor:
        """The subagent executor of an agent at ``depth`` (0: the lead) calling ``model``, whose
        children may delegate ``levels - 1`` levels further at most."""
        settings = self._config.subagents

        def build_child(spec: SubagentType, depth: int, executor: SubagentExecutor) -> ChildAgent:
            return self._subagent(spec, depth, executor, model_name, model, run_key)

        return SubagentExecutor(
            self.subagent_types, build_child, self.subagent_capacity, settings.max_concurrent, depth, levels,
        )

    def _subagent(
        self, spec: SubagentType, depth: int, executor: SubagentExecutor, parent_model_name: str,
        parent_model: BaseChatModel, run_key: str | None,
    ) -> ChildAgent:
        """A fresh child graph of type ``spec``: the same builder as the lead's, chain kind
        ``subagent`` (so it cannot lack a mandatory guard), no checkpointer of its own (it runs
        inside its parent's tool step), its model claimed now."""
        name = spec.model or parent_model_name
        model: BaseChatModel
        if name == parent_model_name and isinstance(parent_model, ScriptedChatModel):
            model = parent_model.for_agent(spec.name)
        else:
            model = self.models.build(name, run_key=run_key)
            if isinstance(model, ScriptedChatModel):
                model = model.for_agent(spec.name)
        levels = min(spec.delegation_depth, executor.levels - 1)
        delegates = TASK_TOOL in spec.tools and levels >= 1
        limits = self._config.limits.model_copy(update={"turn_limit": TurnLimits(max_turns=spec.max_turns)})
        chain = build_agent_chain(
            "subagent", limits, strict_grammar=self._strict(name), model=self.model_ref(name),
            delegation=self._config.subagents if delegates else None,
            summarization=self._config.subagents.summarization,
        )
        self._bind_summarizers(chain, name, model, run_key)
        tools = build_tools(bash_enabled=self._config.tools.bash, names=_without_task(list(spec.tools)))
        if delegates:
            tools.append(task_tool(self._executor(name, model, run_key, depth, levels), self._config.subagents.max_per_run))
        graph = create_agent(
            model,
            tools,
            system_prompt=self._prompt(spec.system_prompt, tools),
            middleware=chain.for_agent(),
            state_schema=agent_state_schema("full"),
            context_schema=RunContext,
            name=f"subagent:{spec.name}",
            checkpointer=False,
        )
        return ChildAgent(graph=graph, model_name=name)

    def summary_model(self, name: str, run_model_name: str, run_model: BaseChatModel, run_key: str | None) -> BaseChatModel:
        """The model that writes a run's compaction summaries: model ``name`` of the config.

        The run's own scripted model gives its ``summarization`` twin (same session, so the script's
        ``summarization:`` list — or its ``"*"`` list, or the fallback — answers the summary calls);
        any other model is a fresh instance from the loader, so the summary calls never share a
        client (or a scripted cursor) with the agent's own calls."""
        if name == run_model_name and isinstance(run_model, ScriptedChatModel):
            return run_model.for_agent(SUMMARY_AGENT)
        model = self.models.build(name, run_key=run_key)
        return model.for_agent(SUMMARY_AGENT) if isinstance(model, ScriptedChatModel) else model


def _delegates(tools: list[str] | None) -> bool:
    """Whether an agent with this tool list has the ``task`` tool (every tool: yes)."""
    return tools is None or TASK_TOOL in tools


def _without_task(tools: list[str] | None) -> list[str] | None:
    return None if tools is None else [t for t in tools if t != TASK_TOOL]


def _middleware_factory(label: str, ref: str, config: KeelConfig) -> Callable[[], Any]:
    """The zero-argument constructor a ``middleware:`` reference names, checked at start-up."""
    from langchain.agents.middleware import AgentMiddleware

    target = load_reference(label, ref, config.base_dir)
    if not (isinstance(target, type) and issubclass(target, AgentMiddleware)):
        raise GraphLoadError(f"{label}: {ref!r} is not a LangChain AgentMiddleware class")
    try:
        target()
    except Exception as exc:
        raise GraphLoadError(f"{label}: {ref!r} cannot be built without arguments: {exc}") from exc
    return target


__all__ = ["Harness", "ModelNotAllowed", "ModelUnavailable", "ResolvedAssistant", "UnknownAssistant"]
