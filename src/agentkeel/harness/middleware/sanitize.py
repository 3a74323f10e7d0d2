"""Making untrusted text inert before a model reads it: one implementation for every guard.

Models give tag-shaped text such as ``<system-reminder>`` or ``<instructions>`` the authority of the
framework that normally writes it. A user prompt or a fetched web page that contains such a tag
can therefore pose as the system. The defence is cheap and lossless to a human reader: the ``<``
and ``>`` of every *authority* tag are HTML-escaped, so the text still reads the same but no
longer parses as a tag. Ordinary markup (``<b>``, ``<div>``) is left alone so code and HTML stay
usable.

The user's own message is additionally fenced with boundary lines; a literal boundary line inside
untrusted text is replaced by an inert look-alike so nobody can close the fence early.

Everything here is pure and idempotent: applying it twice gives the same text as applying it once,
so a retried request, or a message that already went through once, is never escaped twice.
"""

from __future__ import annotations

import re
from typing import Any

BLOCKED_TAGS: frozenset[str] = frozenset({
    # Framework authority blocks: what an agent framework itself injects into a conversation.
    "system", "system-reminder", "system_reminder", "developer", "assistant", "user", "human",
    "tool", "tool_result", "tool_use", "function_results", "function_calls", "memory",
    "context", "durable_context", "current_date", "user_input", "think", "thinking",
    "current_uploads", "todo_list",
    # The blocks of the compaction summary's request (Summarization), so a message being
    # summarised cannot close its block and pose as the instructions around it.
    "existing_summary", "new_messages",
    # Classic prompt-injection wrappers.
    "instruction", "instructions", "important", "override", "ignore", "prompt",
})
"""Tag names (compared case-insensitively) whose ``<``/``>`` are escaped in untrusted text."""

BLOCKED_PREFIXES: tuple[str, ...] = ("agentkeel",)
"""Any tag whose name starts with one of these is blocked too (AgentKeel's own blocks)."""

BEGIN_USER_INPUT = "--- BEGIN USER INPUT ---"
END_USER_INPUT = "--- END USER INPUT ---"
_OPEN = BEGIN_USER_INPUT + "\n"
_CLOSE = "\n" + END_USER_INPUT

# ``<`` or ``</``, a tag name, then everything up to and including the next ``>`` unless another
# ``<`` comes first. The name is matched greedily, so ``<systemd>`` is the tag ``systemd`` (not
# blocked), while ``<system:x>`` and ``<system.x>`` are ``system``; a name with no ``>`` after it
# (``<system`` at the end) is the bare-prefix form. ``< system>`` is not a tag and stays as is.
_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9_\-]*)([^<>]*)(>?)")
_BOUNDARY = re.compile(r"-{3,}[ \t]*(BEGIN|END)[ \t]+USER[ \t]+INPUT[ \t]*-{3,}", re.IGNORECASE)
# A text block ending in ``<`` or ``</`` could join the next block into a tag.
_DANGLING_OPEN = re.compile(r"</?\Z")


def is_blocked_tag(name: str) -> bool:
    lowered = name.lower()
    return lowered in BLOCKED_TAGS or lowered.startswith(BLOCKED_PREFIXES)


def _escape_tag(match: re.Match[str]) -> str:
    slash, name, rest, close = match.groups()
    if not is_blocked_tag(name):
        return match.group(0)
    return f"&lt;{slash}{name}{rest}{'&gt;' if close else ''}"


def _inert_boundary(match: re.Match[str]) -> str:
    return f"[{match.group(1).upper()} USER INPUT marker]"


def neutralize(text: str) -> str:
    """``text`` with every blocked tag escaped and every boundary line made inert (idempotent)."""
    if "<" in text:
        text = _TAG.sub(_escape_tag, text)
    if "-" in text:
        text = _BOUNDARY.sub(_inert_boundary, text)
    return text


def wrap_user_input(text: str) -> str:
    """``text`` neutralised and fenced with the user-input boundary lines.

    Text that is already exactly fenced keeps its one fence; its inside is neutralised again (a
    no-op for text this function produced), so wrapping is idempotent.
    """
    return _OPEN + neutralize(_unwrapped(text)) + _CLOSE


def _unwrapped(text: str) -> str:
    if len(text) >= len(_OPEN) + len(_CLOSE) and text.startswith(_OPEN) and text.endswith(_CLOSE):
        return text[len(_OPEN) : len(text) - len(_CLOSE)]
    return text


# -- message content (a string, or a list of blocks) ----------------------------------------------
def block_text(block: Any) -> str | None:
    """The text of a content block (a bare string or a text block), None for any other block."""
    if isinstance(block, str):
        return block
    if isinstance(block, dict) and block.get("type") in ("text", "output_text") and isinstance(block.get("text"), str):
        return str(block["text"])
    return None


def _with_text(block: Any, text: str) -> Any:
    return text if isinstance(block, str) else {**block, "text": text}


def neutralize_content(content: Any) -> Any:
    """``content`` with its text neutralised; non-text blocks (images, files) stay in place."""
    if isinstance(content, str):
        return neutralize(content)
    if not isinstance(content, list):
        return content
    out = []
    for block in content:
        text = block_text(block)
        if text is not None:
            text = _DANGLING_OPEN.sub(lambda m: "&lt;" + m.group(0)[1:], neutralize(text))
            block = _with_text(block, text)
        out.append(block)
    return out


def wrap_content(content: Any) -> Any:
    """``content`` neutralised and fenced: the fence opens in the first text block and closes in
    the last, so images between them stay where the user put them. Image-only content is
    returned unchanged (there is no text to fence)."""
    if isinstance(content, str):
        return wrap_user_input(content)
    if not isinstance(content, list):
        return content
    positions = [i for i, block in enumerate(content) if block_text(block) is not None]
    if not positions:
        return content
    first, last = positions[0], positions[-1]
    texts = {i: str(block_text(content[i])) for i in positions}
    if first == last:
        texts[first] = _unwrapped(texts[first])
    elif texts[first].startswith(_OPEN) and texts[last].endswith(_CLOSE):
        texts[first] = texts[first][len(_OPEN) :]
        texts[last] = texts[last][: len(texts[last]) - len(_CLOSE)]
    blocks = neutralize_content([_with_text(content[i], texts[i]) if i in texts else b for i, b in enumerate(content)])
    blocks[first] = _with_text(blocks[first], _OPEN + str(block_text(blocks[first])))
    blocks[last] = _with_text(blocks[last], str(block_text(blocks[last])) + _CLOSE)
    return blocks




__all__ = [
    "BEGIN_USER_INPUT",
    "BLOCKED_PREFIXES",
    "BLOCKED_TAGS",
    "END_USER_INPUT",
    "block_text",
    "is_blocked_tag",
    "neutralize",
    "neutralize_content",
    "wrap_content",
    "wrap_user_input",
]
