"""The scripted chat model (``use: scripted``): deterministic, offline, provider-shaped.

See ``docs/scripted-model.md`` for the script format and ``shared/spec/scripted-model.md`` for the
contract it implements.
"""

from agentkeel.harness.scripted.errors import (
    ScriptedBadRequestError,
    ScriptedProviderError,
    ScriptedRateLimitError,
    ScriptedServerError,
    ScriptedTimeoutError,
    ScriptError,
    ScriptExhaustedError,
    ScriptExpectationError,
    StrictRequestError,
)
from agentkeel.harness.scripted.model import AgentCursor, ScriptedChatModel, ScriptSession
from agentkeel.harness.scripted.script import Script, Turn, load_script, parse_script
from agentkeel.harness.scripted.strict import check_request

__all__ = [
    "AgentCursor",
    "Script",
    "ScriptError",
    "ScriptExhaustedError",
    "ScriptExpectationError",
    "ScriptSession",
    "ScriptedBadRequestError",
    "ScriptedChatModel",
    "ScriptedProviderError",
    "ScriptedRateLimitError",
    "ScriptedServerError",
    "ScriptedTimeoutError",
    "StrictRequestError",
    "Turn",
    "check_request",
    "load_script",
    "parse_script",
]
