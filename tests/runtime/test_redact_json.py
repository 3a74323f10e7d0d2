"""``redact_json``: the journal's JSON-clean, redacted copy, the same as the standard library's."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any

import pytest

from agentkeel.runtime import redaction
from agentkeel.runtime.redaction import Redactor, redact_json


class Kind(str, Enum):
    TOOL = "tool"


@dataclass
class Point:
    x: int


def stdlib(data: Any) -> Any:
    """What the journal stored before: the standard library's round trip."""
    return json.loads(redaction._active(json.dumps(data, default=str)))


@pytest.fixture
def secret(monkeypatch: pytest.MonkeyPatch) -> str:
    value = "sk-test-0123456789"
    monkeypatch.setattr(redaction, "_active", Redactor({"OPENAI_API_KEY": value}))
    return value


def test_the_copy_is_what_the_standard_library_gave_with_secrets_replaced(secret: str) -> None:
    data = {
        "text": f"Incorrect API key provided: {secret}", "nested": [{"k": (1, 2.5, None, True)}],
        "at": datetime(2026, 12, 3, 12, 0, tzinfo=UTC), "point": Point(3), "kind": Kind.TOOL,
        7: "int key", "obj": object, "ünïcode": "héllo ✓",
    }
    copy = redact_json(data)
    assert copy == stdlib(data)
    assert secret not in json.dumps(copy) and "[redacted:OPENAI_API_KEY]" in copy["text"]
    assert redact_json({"big": 2**70}) == {"big": 2**70}  # beyond orjson: the standard library's way
    nested = {"a": {"b": ["c"]}}
    copy = redact_json(nested)
    copy["a"]["b"].append("d")
    assert nested == {"a": {"b": ["c"]}}  # a deep copy


def test_a_secret_next_to_non_ascii_text_is_redacted(secret: str) -> None:
    assert redact_json({"m": f"clé: {secret} ✓"}) == {"m": "clé: [redacted:OPENAI_API_KEY] ✓"}
