"""Building a middleware chain: derive an order from the contracts, check it, describe it.

The checks (``shared/spec/middleware-contracts.md``) all reduce to one kind of fact, "A must be
outer of B" (a lower list index), derived from the contracts and LangChain's composition rules:

1. ``requires`` — every provider of a required fact runs before the requirer on its axis;
2. ``observes_final`` — the observer runs after every other mutator of the resource;
3. ``slot`` — an ``outermost`` / ``innermost`` claim on an axis, at most one per slot;
4. ``mandatory_for`` — a chain of a kind contains every middleware that kind requires;
5. single writer — at most one middleware mutates a single-writer resource.

"Runs before" depends on direction: ``before_*`` hooks and wrap requests go down the list,
``after_*`` hooks and wrap responses come back up. :func:`derive_order` sorts a set of middleware
so that every rule 1-3 fact holds (a stable topological sort, ties broken by name, so the order is
never hand-maintained); :func:`build_chain` checks a given order and fails with an error naming
both middlewares, the axis, the resource and the rule.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from agentkeel.harness.middleware.contracts import (
    AXES,
    SINGLE_WRITER,
    Axis,
    ChainKind,
    Contract,
    contract_of,
    flows_outward,
    implemented_axes,
    overlaps,
)

RULES = {
    1: "requires",
    2: "observes_final",
    3: "slot",
    4: "mandatory_for",
    5: "single_writer",
}


class ChainError(ValueError):
    """A chain violates a contract rule; the message names the middlewares, axis, resource, rule."""

    def __init__(self, kind: str, rule: int, message: str) -> None:
        super().__init__(f"chain {kind!r}: rule {rule} ({RULES[rule]}): {message}")
        self.kind = kind
        self.rule = rule


@dataclass(frozen=True)
class Constraint:
    """``outer`` must come before ``inner`` in the list."""

    outer: str
    inner: str
    rule: int
    axis: Axis
    resource: str
    reason: str


def _forward(axis: Axis, resource: str) -> bool:
    """Whether hooks on ``axis`` see ``resource`` in list order (else in reverse)."""
    if axis in ("before_agent", "before_model"):
        return True
    if axis in ("after_model", "after_agent"):
        return False
    return not flows_outward(resource)


def _runs_before(first: str, then: str, axis: Axis, resource: str) -> tuple[str, str]:
    """(outer, inner) such that ``first`` executes before ``then`` on ``axis`` for ``resource``."""
    return (first, then) if _forward(axis, resource) else (then, first)


def _direction(axis: Axis, resource: str) -> str:
    return "runs in list order" if _forward(axis, resource) else "runs in reverse list order"


def _name(middleware: Any) -> str:
    return str(getattr(middleware, "name", type(middleware).__name__))


def _contracts(kind: str, middlewares: Sequence[Any]) -> dict[str, Contract]:
    contracts: dict[str, Contract] = {}
    for mw in middlewares:
        name = _name(mw)
        if name in contracts:
            raise ValueError(f"chain {kind!r}: two middlewares are named {name!r}")
        contract = contract_of(mw)
        if contract.declared:
            declared, actual = set(contract.axes), set(implemented_axes(mw))
            if declared != actual:
                raise ValueError(
                    f"chain {kind!r}: the contract of {name} declares axes {sorted(declared)} "
                    f"but it implements hooks on {sorted(actual)}"
                )
        contracts[name] = contract
    return contracts


def constraints(kind: str, middlewares: Sequence[Any]) -> list[Constraint]:
    """Every rule 1-3 ordering fact among ``middlewares`` (raises on facts no order can satisfy)."""
    contracts = _contracts(kind, middlewares)
    names = list(contracts)
    out: list[Constraint] = []
    for axis in AXES:
        on_axis = {n: contracts[n].axis(axis) for n in names if contracts[n].axis(axis) is not None}
        for name, ac in on_axis.items():
            assert ac is not None
            for fact in sorted(ac.requires):
                providers = [p for p, pc in on_axis.items() if p != name and pc and any(overlaps(f, fact) for f in pc.provides)]
                if not providers:
                    raise ChainError(
                        kind, 1,
                        f"{name} requires {fact} on axis {axis}, and no middleware in the chain provides it",
                    )
                for provider in providers:
                    outer, inner = _runs_before(provider, name, axis, fact)
                    out.append(Constraint(outer, inner, 1, axis, fact,
                        f"{name} requires {fact}, which {provider} provides; the {axis} axis "
                        f"{_direction(axis, fact)} for it, so {provider} must run first"))
            for resource in sorted(ac.observes_final):
                for other, oc in on_axis.items():
                    if other == name or oc is None or not any(overlaps(m, resource) for m in oc.mutates):
                        continue
                    outer, inner = _runs_before(other, name, axis, resource)
                    out.append(Constraint(outer, inner, 2, axis, resource,
                        f"{name} observes {resource} final and {other} mutates it; the {axis} axis "
                        f"{_direction(axis, resource)} for it, so {other} must run first"))
            if ac.slot is not None:
                claims = [n for n, c in on_axis.items() if c and c.slot == ac.slot]
                if len(claims) > 1:
                    raise ChainError(kind, 3, f"{claims[0]} and {claims[1]} both claim the "
                                     f"{ac.slot} slot on axis {axis} (resource: the {axis} hook)")
                for other in on_axis:
                    if other == name:
                        continue
                    pair = (name, other) if ac.slot == "outermost" else (other, name)
                    out.append(Constraint(*pair, 3, axis, f"{axis} hook",
                        f"{name} claims the {ac.slot} slot on axis {axis}, so {other} must be "
                        f"{'inner' if ac.slot == 'outermost' else 'outer'}"))
    return out


def check_membership(kind: ChainKind, middlewares: Sequence[Any], catalog: Iterable[type]) -> None:
    """Rules 4 and 5: mandatory members present, single-writer resources written once."""
    contracts = _contracts(kind, middlewares)
    present = {type(mw) for mw in middlewares}
    for cls in catalog:
        contract = getattr(cls, "contract", None)
        if isinstance(contract, Contract) and kind in contract.mandatory_for:
            if not any(issubclass(p, cls) for p in present):
                raise ChainError(kind, 4, f"{cls.__name__} is mandatory for {kind} chains and is "
                                 f"missing (resource: the chain's guard set; present: {sorted(contracts)})")
    for resource, why in SINGLE_WRITER.items():
        # Wildcards (a third-party middleware's assumed reach) never claim a single-writer resource.
        writers = [
            (name, axis)
            for name, contract in contracts.items()
            for axis, ac in contract.axes.items()
            if any(overlaps(m, resource) and not m.endswith("*") for m in ac.mutates)
        ]
        if len({name for name, _ in writers}) > 1:
            (first, axis), (second, _) = writers[0], next(w for w in writers if w[0] != writers[0][0])
            raise ChainError(kind, 5, f"{first} and {second} both mutate {resource} (axis {axis}); {why}")


def derive_order(kind: ChainKind, middlewares: Sequence[Any]) -> list[Any]:
    """``middlewares`` sorted so that every ordering fact holds; ties broken by name."""
    by_name = {_name(mw): mw for mw in middlewares}
    facts = constraints(kind, middlewares)
    after: dict[str, set[str]] = {n: set() for n in by_name}
    indegree = dict.fromkeys(by_name, 0)
    for fact in facts:
        if fact.inner not in after[fact.outer]:
            after[fact.outer].add(fact.inner)
            indegree[fact.inner] += 1
    ready = [n for n, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        name = heapq.heappop(ready)
        order.append(name)
        for nxt in after[name]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                heapq.heappush(ready, nxt)
    if len(order) != len(by_name):
        stuck = sorted(n for n in by_name if n not in order)
        cycle = [f for f in facts if f.outer in stuck and f.inner in stuck]
        detail = "; ".join(f.reason for f in cycle[:4])
        raise ChainError(kind, cycle[0].rule if cycle else 2,
                         f"no order satisfies the contracts of {stuck}: {detail}")
    return [by_name[n] for n in order]


def check_order(kind: ChainKind, middlewares: Sequence[Any]) -> None:
    """Raise :class:`ChainError` on the first rule 1-3 fact the given order breaks."""
    index = {_name(mw): i for i, mw in enumerate(middlewares)}
    for fact in constraints(kind, middlewares):
        if index[fact.outer] > index[fact.inner]:
            raise ChainError(kind, fact.rule, f"axis {fact.axis}, resource {fact.resource}: "
                             f"{fact.outer} must be outer of {fact.inner} ({fact.reason})")


@dataclass(frozen=True)
class Chain:
    """A checked middleware chain and its manifest."""

    kind: ChainKind
    middlewares: tuple[Any, ...]

    def for_agent(self) -> list[Any]:
        """The list to hand to ``create_agent``: the checked order, with runs of AgentKeel wrappers
        composed into one LangChain middleware each (:mod:`.composed` says why)."""
        from agentkeel.harness.middleware.composed import compose

        return compose(self.middlewares)

    def manifest(self) -> dict[str, Any]:
        """Per axis, the effective execution order, and every member's contract (JSON-ready)."""
        names = [_name(mw) for mw in self.middlewares]
        contracts = {_name(mw): contract_of(mw) for mw in self.middlewares}
        axes: dict[str, Any] = {}
        for axis in AXES:
            members = [n for n in names if contracts[n].axis(axis) is not None]
            if not members:
                continue
            if axis in ("model", "tool"):
                axes[axis] = {"outer_to_inner": members,
                              "note": "requests run outer to inner, responses inner to outer"}
            else:
                forward = axis.startswith("before")
                axes[axis] = {"execution_order": members if forward else members[::-1]}
        notes = [
            f"{n} declares no contract: treated as reading and mutating everything on "
            f"{', '.join(contracts[n].axes) or 'no axis'}"
            for n in names if not contracts[n].declared
        ]
        return {
            "kind": self.kind,
            "order": names,
            "axes": axes,
            "middlewares": [
                {"name": _name(mw), "class": f"{type(mw).__module__}.{type(mw).__qualname__}",
                 "contract": contracts[_name(mw)].as_dict()}
                for mw in self.middlewares
            ],
            "notes": notes,
            "langchain_middleware": [
                {"name": _name(m), "members": [_name(x) for x in getattr(m, "members", (m,))]}
                for m in self.for_agent()
            ],
        }


def build_chain(
    kind: ChainKind, middlewares: Sequence[Any], *, catalog: Iterable[type] = (), derive: bool = False
) -> Chain:
    """Check ``middlewares`` as a chain of ``kind`` (deriving the order first when ``derive``).

    ``catalog`` lists the middleware classes whose ``mandatory_for`` is enforced (rule 4).
    """
    if kind not in ("lead", "subagent"):
        raise ValueError(f"chain kind must be 'lead' or 'subagent', got {kind!r}")
    catalog = tuple(catalog)
    declared = tuple(getattr(type(mw), "contract", None) for mw in middlewares)
    key = _ChainKey(kind, tuple((_name(mw), type(mw), id(c)) for mw, c in zip(middlewares, declared)), catalog, derive)
    positions = _CHECKED.get(key, (None,))[0]
    if positions is None:
        # Membership first: a missing mandatory guard is the root cause of whatever ordering fact
        # its absence breaks (no DurableContext: nothing provides the system authority coalescing
        # needs).
        check_membership(kind, middlewares, catalog)
        ordered = derive_order(kind, middlewares) if derive else list(middlewares)
        check_order(kind, ordered)
        index = {id(mw): i for i, mw in enumerate(middlewares)}
        positions = tuple(index[id(mw)] for mw in ordered)
        if len(_CHECKED) >= _CHECKED_MAX:
            _CHECKED.clear()
        _CHECKED[key] = (positions, declared)  # the contracts kept alive: their ids stay theirs
    return Chain(kind, tuple(middlewares[i] for i in positions))


class _ChainKey(NamedTuple):
    """What a chain's check depends on: its kind, its members' names, classes and declared
    contracts (by identity: a class whose contract is replaced is checked again; a member's axes
    come from the hooks its class overrides), the catalog, whether the order is derived.
    Instances do not enter it: a guard's settings never change its contract."""

    kind: str
    members: tuple[tuple[str, type, int], ...]
    catalog: tuple[type, ...]
    derive: bool


# Checked orders, by what the check depends on. Why: every run builds a fresh chain (its guards
# keep per-run state), and checking one was a tenth of a run's start-up CPU, for an answer that
# only changes with the configuration. Only chains that passed are kept; a failing one is checked,
# and fails, every time.
_CHECKED: dict[_ChainKey, tuple[tuple[int, ...], tuple[Any, ...]]] = {}
_CHECKED_MAX = 256


__all__ = [
    "RULES",
    "Chain",
    "ChainError",
    "Constraint",
    "build_chain",
    "check_membership",
    "check_order",
    "constraints",
    "derive_order",
]
