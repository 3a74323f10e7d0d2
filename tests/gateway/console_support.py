"""A project for the console and metrics tests: the gateway tests' project plus a scripted model
``console`` whose run does what the run page must show — a file written then edited (two steps,
one diff each), a read-before-write guard satisfied by a read, a subagent that writes a file of
its own, and a token budget that caps the lead's last turn. Each turn takes a few hundred ms, so
a browser has time to watch the run live.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from server_support import write_project

REPORT = "/workspace/outputs/report.md"
APPENDIX = "/workspace/outputs/appendix.md"
TOKEN_CAP = 1900  # crossed by the lead's fifth turn (turns and the subagent's before it stay under)
CONSOLE_SCRIPT: dict[str, Any] = {"strict": True, "agents": {
    "lead": [
        {"say": "Writing the report.", "delay_ms": 500, "usage": {"input": 200, "output": 40},
         "tool_calls": [{"name": "write_file", "args": {"path": REPORT, "content": "# Report\nline one\nline two\n"}}]},
        {"say": "Reading it back.", "delay_ms": 400, "usage": {"input": 250, "output": 20},
         "tool_calls": [{"name": "read_file", "args": {"path": REPORT}}]},
        {"say": "Fixing a line.", "delay_ms": 400, "usage": {"input": 300, "output": 30},
         "tool_calls": [{"name": "str_replace", "args": {"path": REPORT, "old": "line two", "new": "line 2"}}]},
        {"say": "Delegating the appendix.", "delay_ms": 400, "usage": {"input": 260, "output": 40},
         "tool_calls": [{"name": "task", "args": {"description": "write the appendix", "prompt": f"Write {APPENDIX}",
                                                  "subagent_type": "general-purpose"}}]},
        {"say": "Checking the outputs.", "delay_ms": 400, "usage": {"input": 600, "output": 60},
         "tool_calls": [{"name": "ls", "args": {"path": "/workspace/outputs"}}]},
        {"say": "Done."},
    ],
    "general-purpose": [
        {"delay_ms": 400, "usage": {"input": 150, "output": 30},
         "tool_calls": [{"name": "write_file", "args": {"path": APPENDIX, "content": "appendix\n"}}]},
        {"say": "Appendix written.", "delay_ms": 300, "usage": {"input": 200, "output": 20}},
    ],
}}


def write_console_project(root: Path, **kwargs: Any) -> Path:
    """``write_project(root, **kwargs)`` with the ``console`` model and the token cap."""
    limits = {"token_budget": {"max_tokens": TOKEN_CAP}, **kwargs.pop("limits", {})}
    config_path = write_project(root, limits=limits, **kwargs)
    (root / "console.yaml").write_text(yaml.safe_dump(CONSOLE_SCRIPT, sort_keys=False))
    config = yaml.safe_load(config_path.read_text())
    config["models"].append({"name": "console", "use": "scripted", "script": "console.yaml"})
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    return config_path
