"""An Anthropic-compatible Messages stub (``POST /v1/messages``), strict as the real API.

Run: ``python tests/providers/stub_anthropic.py --port 0`` (prints ``PORT <n>``). Scripting and the
control routes: see ``stub_core``. What it answers like Anthropic does:
- streams of named SSE events: ``message_start`` (with the input usage), per content block
  ``content_block_start`` / ``content_block_delta`` (``text_delta``, or ``input_json_delta`` pieces of
  a ``tool_use`` block's raw input) / ``content_block_stop``, a ``ping``, ``message_delta`` (the
  ``stop_reason`` and the cumulative usage) and ``message_stop``;
- non-stream messages with ``content`` blocks, ``stop_reason`` and ``usage``; a tool call whose raw
  arguments do not parse as a JSON object is sent with ``input: {}`` (the API cannot express it);
- errors as ``{"type": "error", "error": {"type", "message"}}``.
Validation (400 ``invalid_request_error``): unknown top-level fields, ``model`` / ``max_tokens`` /
``messages`` required, a ``system`` role inside ``messages``, roles not alternating from ``user``,
empty content or empty text blocks, ``tool_result`` blocks not first in their message or answering
no ``tool_use`` of the previous assistant message, and a ``tool_use`` not answered in the next user
message. A missing key (``x-api-key``, or ``Authorization: Bearer`` as the 2.x SDKs send it) is a 401; a missing ``anthropic-version`` a 400.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from starlette.responses import JSONResponse, Response

sys.path.insert(0, str(Path(__file__).parent))

from stub_core import Provider, Rejected, Step, serve, split, sse  # noqa: E402

FIELDS = frozenset({
    "model", "messages", "max_tokens", "system", "metadata", "stop_sequences", "stream", "temperature",
    "top_p", "top_k", "tools", "tool_choice", "thinking", "service_tier", "container", "mcp_servers",
    "context_management",
})

# preset -> (status, type, message)
PRESETS: dict[str, tuple[int, str, str]] = {
    "rate_limit": (429, "rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit."),
    "overloaded": (529, "overloaded_error", "Overloaded"),
    "server": (500, "api_error", "Internal server error"),
    "auth": (401, "authentication_error", "invalid x-api-key"),
    "invalid_request": (400, "invalid_request_error", "messages.0.content: Input should be a valid list"),
    "context_length": (400, "invalid_request_error", "prompt is too long: 212345 tokens > 200000 maximum"),
    "insufficient_quota": (400, "invalid_request_error",
                           "Your credit balance is too low to access the Anthropic API."),
}


def _blocks(where: str, content: Any, problems: list[str]) -> list[dict[str, Any]]:
    """The content as a block list, with its emptiness problems recorded."""
    if isinstance(content, str):
        if not content.strip():
            problems.append(f"{where}.content: text content blocks must contain non-whitespace text")
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not content:
        problems.append(f"{where}.content: must be a non-empty string or a non-empty list of content blocks")
        return []
    blocks = []
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            problems.append(f"{where}.content.{j}: a content block needs a 'type'")
            continue
        if block["type"] == "text" and (not isinstance(block.get("text"), str) or not block["text"].strip()):
            problems.append(f"{where}.content.{j}: text content blocks must be non-empty")
        blocks.append(block)
    return blocks


def _check_messages(messages: list[Any], problems: list[str]) -> None:
    expected = "user"
    open_calls: set[str] = set()  # tool_use ids of the previous assistant message
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(message, dict):
            problems.append(f"{where}: expected an object")
            continue
        role = message.get("role")
        if role == "system":
            problems.append(f"{where}.role: 'system' is not a message role; use the top-level 'system' parameter")
            continue
        if role not in ("user", "assistant"):
            problems.append(f"{where}.role: must be 'user' or 'assistant'")
            continue
        if role != expected:
            problems.append(f"{where}: roles must alternate between 'user' and 'assistant', starting with 'user'")
        expected = "assistant" if role == "user" else "user"
        blocks = _blocks(where, message.get("content"), problems)
        if role == "user":
            answered = [b for b in blocks if b["type"] == "tool_result"]
            seen_other = False
            for j, block in enumerate(blocks):
                if block["type"] != "tool_result":
                    seen_other = True
                elif seen_other:
                    problems.append(f"{where}.content.{j}: tool_result blocks must come first in the content")
            for block in answered:
                if block.get("tool_use_id") not in open_calls:
                    problems.append(f"{where}: unexpected tool_use_id {block.get('tool_use_id')!r} in tool_result "
                                    "blocks: each must answer a tool_use block of the previous message")
            missing = open_calls - {b.get("tool_use_id") for b in answered}
            if missing:
                problems.append(f"{where}: tool_use ids were found without tool_result blocks immediately after: "
                                f"{sorted(missing)}")
            open_calls = set()
        else:
            if open_calls:
                problems.append(f"{where}: tool_use ids {sorted(open_calls)} are not answered by a user message")
            open_calls = set()
            for j, block in enumerate(blocks):
                if block["type"] == "tool_use":
                    if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) \
                            or not isinstance(block.get("input"), dict):
                        problems.append(f"{where}.content.{j}: tool_use needs id, name and an object input")
                    else:
                        open_calls.add(block["id"])
                elif block["type"] == "tool_result":
                    problems.append(f"{where}.content.{j}: tool_result blocks belong in user messages")
    if open_calls:
        problems.append(f"tool_use ids were found without tool_result blocks immediately after: {sorted(open_calls)}")


class AnthropicStub(Provider):
    path = "/v1/messages"
    name = "anthropic"

    def check_headers(self, headers: dict[str, str]) -> None:
        # The key comes as ``x-api-key`` or, from the 2.x SDKs, as ``Authorization: Bearer``.
        bearer = headers.get("authorization", "")
        if not headers.get("x-api-key", "").strip() and not (bearer.startswith("Bearer ") and bearer[7:].strip()):
            raise Rejected(401, "authentication_error", "x-api-key header is required")
        if not headers.get("anthropic-version", "").strip():
            raise Rejected(400, "invalid_request_error", "anthropic-version: header is required")

    def validate(self, body: dict[str, Any]) -> list[str]:
        problems = [f"{key}: Extra inputs are not permitted" for key in body if key not in FIELDS]
        if not isinstance(body.get("model"), str) or not body.get("model"):
            problems.append("model: Field required")
        tokens = body.get("max_tokens")
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
            problems.append("max_tokens: Field required (a positive integer)")
        system = body.get("system")
        if system is not None and not isinstance(system, str):
            if not isinstance(system, list) or any(
                    not isinstance(b, dict) or b.get("type") != "text" or not str(b.get("text", "")).strip()
                    for b in system):
                problems.append("system: must be a string or a list of non-empty text blocks")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            problems.append("messages: Field required (a non-empty list)")
        else:
            _check_messages(messages, problems)
        if "stream" in body and not isinstance(body["stream"], bool):
            problems.append("stream: Input should be a valid boolean")
        for j, tool in enumerate(body.get("tools") or []):
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or (
                    "type" not in tool and not isinstance(tool.get("input_schema"), dict)):
                problems.append(f"tools.{j}: a custom tool needs name and input_schema")
        return problems

    def error_response(self, status: int, kind: str, message: str, code: str | None = None,
                       headers: dict[str, str] | None = None) -> Response:
        body = {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_stub"}
        return JSONResponse(body, status_code=status, headers={"request-id": "req_stub", **(headers or {})})

    def scripted_error(self, step: Step) -> Response:
        spec = step.error or {}
        status, kind, message = PRESETS[spec.get("preset", "server")]
        headers = {"retry-after": f"{step.retry_after:g}"} if step.retry_after is not None else {}
        return self.error_response(int(spec.get("status", status)), spec.get("type", kind),
                                   spec.get("message", message), headers=headers)

    @staticmethod
    def _stop(step: Step) -> str:
        return step.finish or ("tool_use" if step.tool_calls else "end_turn")

    @staticmethod
    def _input(arguments: str) -> dict[str, Any]:
        try:
            value = json.loads(arguments)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    def complete(self, step: Step, body: dict[str, Any]) -> dict[str, Any]:
        content: list[dict[str, Any]] = [{"type": "text", "text": step.text}] if step.text else []
        content += [{"type": "tool_use", "id": c.id, "name": c.name, "input": self._input(c.arguments)}
                    for c in step.tool_calls]
        return {
            "id": f"msg_stub{id(step)}", "type": "message", "role": "assistant", "model": body["model"],
            "content": content, "stop_reason": self._stop(step), "stop_sequence": None,
            "usage": {"input_tokens": step.usage["input"], "output_tokens": step.usage["output"]},
        }

    def stream(self, step: Step, body: dict[str, Any]) -> list[str]:
        def event(kind: str, **data: Any) -> str:
            return sse({"type": kind, **data}, event=kind)

        frames = [event("message_start", message={
            "id": f"msg_stub{id(step)}", "type": "message", "role": "assistant", "model": body["model"],
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": step.usage["input"], "output_tokens": 1},
        })]
        index = 0
        if step.text:
            frames.append(event("content_block_start", index=index, content_block={"type": "text", "text": ""}))
            frames.append(event("ping"))
            frames += [event("content_block_delta", index=index, delta={"type": "text_delta", "text": piece})
                       for piece in split(step.text, step.chunks)]
            frames.append(event("content_block_stop", index=index))
            index += 1
        for call in step.tool_calls:
            frames.append(event("content_block_start", index=index,
                                content_block={"type": "tool_use", "id": call.id, "name": call.name, "input": {}}))
            frames += [event("content_block_delta", index=index,
                             delta={"type": "input_json_delta", "partial_json": piece})
                       for piece in split(call.arguments, step.arg_chunks)]
            frames.append(event("content_block_stop", index=index))
            index += 1
        frames.append(event("message_delta", delta={"stop_reason": self._stop(step), "stop_sequence": None},
                            usage={"input_tokens": step.usage["input"], "output_tokens": step.usage["output"]}))
        frames.append(event("message_stop"))
        return frames


if __name__ == "__main__":
    serve(AnthropicStub)
