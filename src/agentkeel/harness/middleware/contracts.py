"""Middleware contracts: what each middleware reads, changes, needs and promises, as plain data.

LangChain composes one middleware list into six hook axes with different directions: ``before_*``
hooks run in list order, ``after_*`` hooks in reverse, and ``wrap_*`` hooks nest with the first
entry outermost — so on a wrap axis the *request* travels down the list and the *response* travels
back up. A single list therefore encodes several orders at once, and every ordering incident in
DeerFlow was one of them being wrong without anything noticing. A contract states the facts the
order must respect; :mod:`agentkeel.harness.middleware.chain` checks them (and derives an order
that satisfies them) at build time.

Resources are dotted names. Their first segment says which way they travel on a wrap axis:
``model_request.*`` / ``tool_request.*`` flow inward (outer middleware see them first),
``model_response.*`` / ``tool_result.*`` flow outward (inner middleware see them first).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

Axis = Literal["before_agent", "before_model", "model", "tool", "after_model", "after_agent"]
AXES: tuple[Axis, ...] = ("before_agent", "before_model", "model", "tool", "after_model", "after_agent")

# The LangChain hook methods (sync and async) that put a middleware on each axis.
AXIS_HOOKS: dict[Axis, tuple[str, str]] = {
    "before_agent": ("before_agent", "abefore_agent"),
    "before_model": ("before_model", "abefore_model"),
    "model": ("wrap_model_call", "awrap_model_call"),
    "tool": ("wrap_tool_call", "awrap_tool_call"),
    "after_model": ("after_model", "aafter_model"),
    "after_agent": ("after_agent", "aafter_agent"),
}

ChainKind = Literal["lead", "subagent"]
CHAIN_KINDS: tuple[ChainKind, ...] = ("lead", "subagent")

Slot = Literal["outermost", "innermost"]

# Resources with exactly one legitimate writer. Stop reasons are recorded through the run's
# collector, never written by a middleware: two writers of one key is how DeerFlow lost reasons
# (last writer wins, and a None-vs-missing run id dropped them altogether).
SINGLE_WRITER: dict[str, str] = {
    "run.stop_reasons": "stop reasons are recorded through the run's collector only",
    "run.status": "the worker alone decides a run's status",
}

# What a middleware without a contract is assumed to touch on each axis it implements.
_WILDCARDS: dict[Axis, frozenset[str]] = {
    "before_agent": frozenset({"state.*"}),
    "before_model": frozenset({"state.*"}),
    "after_model": frozenset({"state.*"}),
    "after_agent": frozenset({"state.*"}),
    "model": frozenset({"model_request.*", "model_response.*"}),
    "tool": frozenset({"tool_request.*", "tool_result.*"}),
}

_OUTWARD_PREFIXES = ("model_response", "tool_result")


def flows_outward(resource: str) -> bool:
    """Whether ``resource`` travels from the inside out on a wrap axis (a response or result)."""
    return resource.split(".", 1)[0] in _OUTWARD_PREFIXES


def overlaps(pattern: str, resource: str) -> bool:
    """Whether two resource names can refer to the same data: ``state.*`` and ``state.messages``,
    or ``model_response`` and ``model_response.tool_calls``."""
    a, b = pattern.removesuffix(".*"), resource.removesuffix(".*")
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


@dataclass(frozen=True)
class AxisContract:
    """What one middleware does on one hook axis."""

    provides: frozenset[str] = frozenset()
    requires: frozenset[str] = frozenset()
    reads: frozenset[str] = frozenset()
    mutates: frozenset[str] = frozenset()
    observes_final: frozenset[str] = frozenset()
    slot: Slot | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            f.name: sorted(getattr(self, f.name)) for f in fields(self) if f.name != "slot"
        }
        out = {k: v for k, v in out.items() if v}
        if self.slot:
            out["slot"] = self.slot
        return out


def on(
    *,
    provides: Iterable[str] = (),
    requires: Iterable[str] = (),
    reads: Iterable[str] = (),
    mutates: Iterable[str] = (),
    observes_final: Iterable[str] = (),
    slot: Slot | None = None,
) -> AxisContract:
    """Shorthand for an :class:`AxisContract` from any iterables."""
    return AxisContract(
        frozenset(provides), frozenset(requires), frozenset(reads), frozenset(mutates),
        frozenset(observes_final), slot,
    )


@dataclass(frozen=True)
class Contract:
    """A middleware's declared behaviour per axis, plus the chain kinds that must contain it."""

    axes: Mapping[Axis, AxisContract] = field(default_factory=dict)
    mandatory_for: frozenset[ChainKind] = frozenset()
    declared: bool = True  # False: inferred for third-party middleware (see ``conservative``)

    def axis(self, axis: Axis) -> AxisContract | None:
        return self.axes.get(axis)

    def as_dict(self) -> dict[str, Any]:
        return {
            "declared": self.declared,
            "mandatory_for": sorted(self.mandatory_for),
            "axes": {axis: self.axes[axis].as_dict() for axis in AXES if axis in self.axes},
        }


def implemented_axes(middleware: Any) -> list[Axis]:
    """The axes a middleware instance takes part in, by the hooks its class overrides."""
    return list(_class_axes(type(middleware)))  # type: ignore[arg-type]  # a class is hashable


@functools.lru_cache(maxsize=512)
def _class_axes(cls: type) -> tuple[Axis, ...]:
    """Per class: every run's chain asks this of each member several times (the check, the
    composition, the manifest), and a class's hooks are fixed once it is defined."""
    from langchain.agents.middleware import AgentMiddleware

    return tuple(axis for axis, hooks in AXIS_HOOKS.items()
                 if any(getattr(cls, h, None) is not getattr(AgentMiddleware, h) for h in hooks))


def conservative(middleware: Any) -> Contract:
    """The contract assumed for middleware that declares none: reads and mutates everything on
    every axis it implements. Safe, and it makes the builder keep it away from guards that must
    see final values."""
    axes = {
        axis: AxisContract(reads=_WILDCARDS[axis], mutates=_WILDCARDS[axis])
        for axis in implemented_axes(middleware)
    }
    return Contract(axes=axes, declared=False)


def contract_of(middleware: Any) -> Contract:
    """The declared contract of ``middleware`` (class attribute ``contract``), else the
    conservative one."""
    declared = getattr(type(middleware), "contract", None)
    return declared if isinstance(declared, Contract) else conservative(middleware)


__all__ = [
    "AXES",
    "AXIS_HOOKS",
    "CHAIN_KINDS",
    "SINGLE_WRITER",
    "Axis",
    "AxisContract",
    "ChainKind",
    "Contract",
    "conservative",
    "contract_of",
    "overlaps",
    "flows_outward",
    "implemented_axes",
    "on",
]
