"""An OpenAI-compatible Chat Completions stub (``POST /v1/chat/completions``), strict as the real API.

Run: ``python tests/providers/stub_openai.py --port 0`` (prints ``PORT <n>``). Scripting and the
control routes: see ``stub_core``. What it answers like OpenAI does:
- streams of ``chat.completion.chunk`` objects as SSE ``data:`` lines ending with ``data: [DONE]``;
  the first delta carries the role, a tool call's first delta its id and name, its arguments follow
  over several deltas; a last chunk with empty ``choices`` and the ``usage`` only when the request
  asked for it with ``stream_options.include_usage`` (every earlier chunk then has ``usage: null``);
- non-stream responses always carry ``usage``;
- errors as ``{"error": {"message", "type", "param", "code"}}``.
Validation (400 ``invalid_request_error``): unknown top-level parameters, required fields and
types, ``stream_options`` without ``stream``, an assistant message with neither content nor tool
calls, a ``tool`` message answering no pending tool call, and a tool call left unanswered before
the next non-tool message (or at the end). A missing ``Authorization: Bearer`` is a 401.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from starlette.responses import JSONResponse, Response

sys.path.insert(0, str(Path(__file__).parent))

from stub_core import Provider, Rejected, Step, serve, split, sse  # noqa: E402

PARAMETERS = frozenset({
    "model", "messages", "stream", "stream_options", "tools", "tool_choice", "parallel_tool_calls",
    "temperature", "top_p", "max_tokens", "max_completion_tokens", "n", "stop", "presence_penalty",
    "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "user", "seed", "response_format",
    "service_tier", "store", "metadata", "reasoning_effort", "modalities", "audio", "prediction",
    "web_search_options", "verbosity", "prompt_cache_key", "safety_identifier",
})
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})

# preset -> (status, type, code, message)
PRESETS: dict[str, tuple[int, str, str | None, str]] = {
    "rate_limit": (429, "requests", "rate_limit_exceeded", "Rate limit reached for requests. Please try again later."),
    "insufficient_quota": (429, "insufficient_quota", "insufficient_quota",
                           "You exceeded your current quota, please check your plan and billing details."),
    "server": (500, "server_error", None, "The server had an error while processing your request."),
    "overloaded": (503, "server_error", None, "The engine is currently overloaded, please try again later."),
    "auth": (401, "invalid_request_error", "invalid_api_key", "Incorrect API key provided: sk-stub***."),
    "invalid_request": (400, "invalid_request_error", None, "Invalid value for 'messages'."),
    "context_length": (400, "invalid_request_error", "context_length_exceeded",
                       "This model's maximum context length is 128000 tokens. However, your messages resulted in "
                       "200000 tokens. Please reduce the length of the messages."),
}


def _content_empty(content: Any) -> bool:
    if content is None:
        return True
    if isinstance(content, str):
        return content == ""
    return isinstance(content, list) and len(content) == 0


def _check_content(where: str, content: Any, problems: list[str], nullable: bool = False) -> None:
    if content is None and nullable:
        return
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        problems.append(f"{where}.content: expected a string or an array of content parts")
        return
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            problems.append(f"{where}.content[{j}]: a content part needs a 'type'")
        elif part["type"] == "text" and not isinstance(part.get("text"), str):
            problems.append(f"{where}.content[{j}].text: expected a string")


def _check_messages(messages: list[Any], problems: list[str]) -> None:
    pending: dict[str, int] = {}  # tool_call id -> index of the assistant message that made it

    def unanswered(before: int) -> None:
        for call_id, at in pending.items():
            problems.append(
                f"messages[{at}]: an assistant message with 'tool_calls' must be followed by tool messages "
                f"responding to each 'tool_call_id'; {call_id!r} is not answered before messages[{before}]"
            )
        pending.clear()

    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            problems.append(f"{where}: expected an object")
            continue
        role = message.get("role")
        if role not in ROLES:
            problems.append(f"{where}.role: {role!r} is not one of {sorted(ROLES)}")
            continue
        if role != "tool" and pending:
            unanswered(i)
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                problems.append(f"{where}.tool_call_id: required string")
            elif call_id not in pending:
                problems.append(
                    f"{where}: messages with role 'tool' must be a response to a preceding message with "
                    f"'tool_calls' ({call_id!r} answers none)"
                )
            else:
                del pending[call_id]
            _check_content(where, message.get("content"), problems)
        elif role == "assistant":
            calls = message.get("tool_calls")
            _check_content(where, message.get("content"), problems, nullable=True)
            if not calls and _content_empty(message.get("content")):
                problems.append(f"{where}: an assistant message needs 'content' or 'tool_calls' (it has neither)")
            for j, call in enumerate(calls or []):
                fn = call.get("function") if isinstance(call, dict) else None
                if (not isinstance(call, dict) or not isinstance(call.get("id"), str) or call.get("type") != "function"
                        or not isinstance(fn, dict) or not isinstance(fn.get("name"), str)
                        or not isinstance(fn.get("arguments"), str)):
                    problems.append(f"{where}.tool_calls[{j}]: needs id, type 'function', function.name and "
                                    "function.arguments (a string)")
                    continue
                pending[call["id"]] = i
        else:
            if "content" not in message:
                problems.append(f"{where}.content: required")
            else:
                _check_content(where, message["content"], problems)
    if pending:
        unanswered(len(messages))


class OpenAIStub(Provider):
    path = "/v1/chat/completions"
    name = "openai"

    def check_headers(self, headers: dict[str, str]) -> None:
        auth = headers.get("authorization", "")
        if not auth.startswith("Bearer ") or not auth[7:].strip():
            raise Rejected(401, "invalid_request_error",
                           "You didn't provide an API key. You need to provide your API key in an Authorization "
                           "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")

    def validate(self, body: dict[str, Any]) -> list[str]:
        problems = [f"Unrecognized request argument supplied: {key}" for key in body if key not in PARAMETERS]
        if not isinstance(body.get("model"), str) or not body.get("model"):
            problems.append("model: required string")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            problems.append("messages: required non-empty array")
        else:
            _check_messages(messages, problems)
        if "stream" in body and not isinstance(body["stream"], bool):
            problems.append("stream: expected a boolean")
        if "stream_options" in body and not body.get("stream"):
            problems.append("The 'stream_options' parameter is only allowed when 'stream' is enabled.")
        for key in ("max_tokens", "max_completion_tokens", "n"):
            if key in body and body[key] is not None and (not isinstance(body[key], int) or body[key] < 1):
                problems.append(f"{key}: expected a positive integer")
        if "temperature" in body and body["temperature"] is not None and not (
                isinstance(body["temperature"], int | float) and 0 <= body["temperature"] <= 2):
            problems.append("temperature: expected a number between 0 and 2")
        for j, tool in enumerate(body.get("tools") or []):
            fn = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict) \
                    or not isinstance(fn.get("name"), str):
                problems.append(f"tools[{j}]: needs type 'function' and function.name")
        return problems

    def error_response(self, status: int, kind: str, message: str, code: str | None = None,
                       headers: dict[str, str] | None = None) -> Response:
        if status == 401 and code is None:
            code = "invalid_api_key"
        body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
        return JSONResponse(body, status_code=status, headers=headers)

    def scripted_error(self, step: Step) -> Response:
        spec = step.error or {}
        status, kind, code, message = PRESETS[spec.get("preset", "server")]
        headers = {}
        if step.retry_after is not None:
            headers["retry-after"] = f"{step.retry_after:g}"
            headers["retry-after-ms"] = str(round(step.retry_after * 1000))
        return self.error_response(int(spec.get("status", status)), spec.get("type", kind),
                                   spec.get("message", message), spec.get("code", code), headers)

    @staticmethod
    def _finish(step: Step) -> str:
        return step.finish or ("tool_calls" if step.tool_calls else "stop")

    @staticmethod
    def _usage(step: Step) -> dict[str, int]:
        prompt, completion = step.usage["input"], step.usage["output"]
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def complete(self, step: Step, body: dict[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": step.text or None, "refusal": None}
        if step.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in step.tool_calls
            ]
        answer = {
            "id": f"chatcmpl-stub{id(step)}", "object": "chat.completion", "created": int(time.time()),
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": self._finish(step)}],
            "usage": self._usage(step),
        }
        if step.no_usage:
            del answer["usage"]
        return answer

    def stream(self, step: Step, body: dict[str, Any]) -> list[str]:
        with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        base = {"id": f"chatcmpl-stub{id(step)}", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": body["model"]}

        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            data: dict[str, Any] = {**base, "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            if with_usage:
                data["usage"] = None
            return sse(data)

        frames = [chunk({"role": "assistant", "content": "", "refusal": None})]
        frames += [chunk({"content": piece}) for piece in split(step.text, step.chunks)]
        for index, call in enumerate(step.tool_calls):
            frames.append(chunk({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                                 "function": {"name": call.name, "arguments": ""}}]}))
            frames += [chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                       for piece in split(call.arguments, step.arg_chunks)]
        frames.append(chunk({}, self._finish(step)))
        if with_usage and not step.no_usage:
            frames.append(sse({**base, "choices": [], "usage": self._usage(step)}))
        frames.append(sse("[DONE]"))
        return frames


if __name__ == "__main__":
    serve(OpenAIStub)
