"""A chain's check is remembered for its configuration, never for its instances or a changed contract."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from agentkeel.harness.middleware import chain as chain_module
from agentkeel.harness.middleware.catalog import CATALOG, guard_members
from agentkeel.harness.middleware.chain import ChainError, build_chain
from agentkeel.limits import Limits


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The kinds of every order check actually run."""
    seen: list[str] = []
    original = chain_module.check_order

    def counting(kind: str, middlewares: Any) -> None:
        seen.append(kind)
        original(kind, middlewares)

    monkeypatch.setattr(chain_module, "check_order", counting)
    monkeypatch.setattr(chain_module, "_CHECKED", {})
    return seen


def test_a_second_chain_of_the_same_configuration_reuses_the_check_with_its_own_members(checks: list[str]) -> None:
    first_members = guard_members("lead", Limits())
    first = build_chain("lead", first_members, catalog=CATALOG, derive=True)
    second_members = guard_members("lead", Limits())
    second = build_chain("lead", second_members, catalog=CATALOG, derive=True)
    assert checks == ["lead"]
    assert [m.name for m in second.middlewares] == [m.name for m in first.middlewares]
    assert {id(m) for m in second.middlewares} == {id(m) for m in second_members}  # fresh guards, not shared
    reordered = list(reversed(second_members))  # another member order is another key
    assert [m.name for m in build_chain("lead", reordered, catalog=CATALOG, derive=True).middlewares] == [
        m.name for m in first.middlewares
    ]
    assert checks == ["lead", "lead"]


def test_a_failing_chain_fails_every_time_and_a_replaced_contract_is_checked_again(
    checks: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    members = guard_members("lead", Limits())
    ordered = list(build_chain("lead", members, catalog=CATALOG, derive=True).middlewares)
    wrong = [ordered[-1], *ordered[:-1]]  # the innermost guard moved outermost
    for _ in range(2):
        with pytest.raises(ChainError):
            build_chain("lead", wrong, catalog=CATALOG)
    assert build_chain("lead", ordered, catalog=CATALOG).middlewares == tuple(ordered)
    runs = len(checks)
    build_chain("lead", ordered, catalog=CATALOG)
    assert len(checks) == runs  # remembered
    target = type(ordered[0])
    monkeypatch.setattr(target, "contract", replace(target.contract))  # an equal contract, replaced
    build_chain("lead", ordered, catalog=CATALOG)
    assert len(checks) == runs + 1  # checked again
