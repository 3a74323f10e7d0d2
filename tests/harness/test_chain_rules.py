"""The chain builder's five rules, each with a chain that breaks it, on small synthetic members.

Every error must name both middlewares, the axis, the resource and the rule.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents.middleware import AgentMiddleware

from agentkeel.harness.middleware.base import KeelMiddleware
from agentkeel.harness.middleware.chain import ChainError, build_chain, derive_order
from agentkeel.harness.middleware.contracts import Contract, on


async def _passthrough_model(self: Any, request: Any, handler: Any) -> Any:
    return await handler(request)


async def _passthrough_tool(self: Any, request: Any, handler: Any) -> Any:
    return await handler(request)


class MetaStamper(KeelMiddleware):
    contract = Contract(axes={"tool": on(provides={"tool_result.meta"}, mutates={"tool_result"})})
    awrap_tool_call = _passthrough_tool


class MetaReader(KeelMiddleware):
    contract = Contract(axes={"tool": on(requires={"tool_result.meta"}, reads={"tool_result.meta"})})
    awrap_tool_call = _passthrough_tool


class CallStripper(KeelMiddleware):
    contract = Contract(axes={"model": on(mutates={"model_response.tool_calls"})})
    awrap_model_call = _passthrough_model


class CallCounter(KeelMiddleware):
    contract = Contract(axes={"model": on(observes_final={"model_response.tool_calls"})})
    awrap_model_call = _passthrough_model


class Validator(KeelMiddleware):
    contract = Contract(axes={"model": on(observes_final={"model_request.messages"}, slot="innermost")})
    awrap_model_call = _passthrough_model


class OtherInnermost(KeelMiddleware):
    contract = Contract(axes={"model": on(slot="innermost")})
    awrap_model_call = _passthrough_model


class HintInjector(KeelMiddleware):
    contract = Contract(axes={"model": on(mutates={"model_request.messages"})})
    awrap_model_call = _passthrough_model


class Guard(KeelMiddleware):
    contract = Contract(axes={"model": on(reads={"model_response"})}, mandatory_for=frozenset({"subagent"}))
    awrap_model_call = _passthrough_model


class ReasonWriterA(KeelMiddleware):
    contract = Contract(axes={"model": on(mutates={"run.stop_reasons"})})
    awrap_model_call = _passthrough_model


class ReasonWriterB(KeelMiddleware):
    contract = Contract(axes={"model": on(mutates={"run.stop_reasons"})})
    awrap_model_call = _passthrough_model


class ThirdParty(AgentMiddleware):
    async def awrap_model_call(self, request: Any, handler: Any) -> Any:
        return await handler(request)


def _error(members: list[Any], kind: str = "lead", **kwargs: Any) -> str:
    with pytest.raises(ChainError) as info:
        build_chain(kind, members, **kwargs)  # type: ignore[arg-type]
    return str(info.value)


def test_rule_1_requirement_on_a_response_resource_needs_the_provider_inner() -> None:
    # tool results travel inner -> outer: the meta stamper must be inner (later in the list).
    build_chain("lead", [MetaReader(), MetaStamper()])
    message = _error([MetaStamper(), MetaReader()])
    assert "rule 1 (requires)" in message
    assert "MetaReader" in message and "MetaStamper" in message
    assert "axis tool" in message and "tool_result.meta" in message


def test_rule_1_missing_provider() -> None:
    message = _error([MetaReader()])
    assert "rule 1 (requires)" in message and "MetaReader" in message and "no middleware" in message


def test_rule_2_observer_must_see_every_mutation() -> None:
    build_chain("lead", [CallCounter(), CallStripper()])  # response: stripper (inner) runs first
    message = _error([CallStripper(), CallCounter()])
    assert "rule 2 (observes_final)" in message
    assert "CallCounter" in message and "CallStripper" in message
    assert "axis model" in message and "model_response.tool_calls" in message


def test_rule_2_on_the_request_path_is_direction_aware() -> None:
    # Requests travel outer -> inner: the request validator must be inner of every mutator.
    build_chain("lead", [HintInjector(), Validator()])
    message = _error([Validator(), HintInjector()])
    assert "rule" in message and "Validator" in message and "HintInjector" in message


def test_rule_3_slot_violated_and_slot_claimed_twice() -> None:
    message = _error([Validator(), CallCounter()])
    assert "rule 3 (slot)" in message and "Validator" in message and "CallCounter" in message
    message = _error([Validator(), OtherInnermost()])
    assert "rule 3 (slot)" in message and "Validator" in message and "OtherInnermost" in message
    assert "innermost" in message


def test_rule_4_mandatory_member_missing() -> None:
    build_chain("lead", [CallCounter()], catalog=[Guard])  # only subagent chains must have it
    message = _error([CallCounter()], kind="subagent", catalog=[Guard])
    assert "rule 4 (mandatory_for)" in message and "Guard" in message and "subagent" in message


def test_rule_5_single_writer_resource() -> None:
    message = _error([ReasonWriterA(), ReasonWriterB()])
    assert "rule 5 (single_writer)" in message
    assert "ReasonWriterA" in message and "ReasonWriterB" in message and "run.stop_reasons" in message


def test_third_party_is_treated_conservatively() -> None:
    # It mutates everything on the model axis, so an observer of final responses must wrap it.
    build_chain("lead", [CallCounter(), ThirdParty()])
    message = _error([ThirdParty(), CallCounter()])
    assert "ThirdParty" in message and "CallCounter" in message
    manifest = build_chain("lead", [CallCounter(), ThirdParty()]).manifest()
    assert any("ThirdParty declares no contract" in note for note in manifest["notes"])


def test_derived_order_satisfies_every_rule_from_any_input_order() -> None:
    members = [Validator, HintInjector, CallStripper, CallCounter, MetaReader, MetaStamper, ThirdParty]
    orders = {
        tuple(type(m).__name__ for m in derive_order("lead", [cls() for cls in perm]))
        for perm in (members, members[::-1], members[2:] + members[:2])
    }
    assert len(orders) == 1  # derived, not dependent on how the list was written
    built = build_chain("lead", [cls() for cls in members], derive=True)
    names = [type(m).__name__ for m in built.middlewares]
    assert names.index("CallCounter") < names.index("CallStripper") < names.index("Validator")
    assert names.index("MetaReader") < names.index("MetaStamper")


def test_contradictory_contracts_cannot_be_ordered() -> None:
    class Outer(KeelMiddleware):
        contract = Contract(axes={"model": on(slot="outermost", observes_final={"model_request.messages"})})
        awrap_model_call = _passthrough_model

    with pytest.raises(ChainError, match="no order satisfies"):
        derive_order("lead", [Outer(), HintInjector()])


def test_a_contract_must_match_the_hooks_implemented() -> None:
    class Liar(KeelMiddleware):
        contract = Contract(axes={"tool": on(reads={"tool_result"})})
        awrap_model_call = _passthrough_model

    with pytest.raises(ValueError, match="declares axes"):
        build_chain("lead", [Liar()])
