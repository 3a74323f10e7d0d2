"""Why a runtime could not open, in one line: the setting at fault and what went wrong.

Why a type of its own: start-up fails on the deployment, not on the code -- a database that does
not answer or does not exist, a data directory that cannot be created. Each surfaced as the
library's own exception (psycopg_pool's "pool initialization incomplete after 30.0 sec", a
``FileNotFoundError``) at the bottom of a traceback that named neither the setting nor the cause.
The runtime raises this instead, and every command and the gateway's start-up print its message
and exit non-zero.
"""

from __future__ import annotations


class StartupError(RuntimeError):
    """The runtime cannot open: ``setting`` (a config key) and ``reason``."""

    def __init__(self, setting: str, reason: str) -> None:
        super().__init__(f"{setting}: {reason}")
        self.setting = setting
        self.reason = reason


__all__ = ["StartupError"]
