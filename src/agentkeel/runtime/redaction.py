"""Keeping the server's secrets out of everything a run leaves behind.

A provider that rejects a key may quote it in its error ("Incorrect API key provided: sk-…"), and
that text travels: into the run record's ``error``, the journal's ``model.error``, the stream's
``error`` event, and the server's log. Every one of those is readable by API clients or operators
who must never see the key. So the values of the server's secrets are replaced by
``[redacted:NAME]`` at the few places text leaves the process's control:

* the journal, as each event is made JSON-safe (:func:`redact_json`);
* the stream bridge, as each event is encoded (``StreamBridge.publish``);
* the run record's error and error detail (the worker);
* log records, through the log-record factory :func:`install` sets (message and traceback).

*Which* values are secret: those of the environment variables the config names as keys
(``models[].api_key_env``) and of every variable whose name says it is one (``…_API_KEY``,
``…_KEY``, ``…_TOKEN``, ``…_SECRET``, ``…PASSWORD``). Values shorter than :data:`MIN_LENGTH` are
not treated as secrets (replacing "1" everywhere would garble every record). The set is
process-wide because the environment is: the runtime installs it once at start-up.

What it does not do: a secret a tool or model produces from somewhere else is not known here;
keeping tools from reading the server's environment is the sandbox's job.
"""

from __future__ import annotations

import json
import logging
import os
import re
import traceback
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

MIN_LENGTH = 8
_SECRET_NAME = re.compile(r"(?:^|_)(?:API_?KEY|KEY|TOKEN|SECRET|PASSWORD|PASSWD)$", re.IGNORECASE)


class Redactor:
    """Replaces every known secret value in a text by ``[redacted:NAME]``."""

    def __init__(self, secrets: Mapping[str, str]) -> None:
        by_value: dict[str, str] = {}
        for name, value in sorted(secrets.items()):
            if value and len(value) >= MIN_LENGTH:
                by_value.setdefault(value, name)
        self._names = by_value
        self._encoded = [value.encode() for value in by_value]
        # Longest first, so a secret that contains another is replaced whole.
        values = sorted(by_value, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, values))) if values else None

    @property
    def names(self) -> list[str]:
        return sorted(set(self._names.values()))

    def __call__(self, text: str) -> str:
        if self._pattern is None or not text:
            return text
        # ``in`` is a fast substring search: a large stream event without a secret (the common
        # case) costs one scan per secret, never a regex pass.
        if not any(value in text for value in self._names):
            return text
        return self._pattern.sub(lambda m: f"[redacted:{self._names[m.group(0)]}]", text)

    def encoded(self, data: bytes) -> bytes:
        """``data`` (UTF-8 text, such as an encoded stream event) redacted; returned unchanged,
        without a decode, when it holds no secret."""
        if self._pattern is None or not any(value in data for value in self._encoded):
            return data
        return self(data.decode()).encode()


def secrets_in(environ: Mapping[str, str], names: Iterable[str] = ()) -> dict[str, str]:
    """The secrets of ``environ``: the variables ``names`` lists, and those whose name says so."""
    wanted = set(names)
    return {name: value for name, value in environ.items()
            if value and (name in wanted or _SECRET_NAME.search(name))}


_active = Redactor({})
_factory_installed = False


def redact(text: str) -> str:
    """``text`` with the installed secrets replaced."""
    return _active(text)


def redact_bytes(data: bytes) -> bytes:
    """UTF-8 ``data`` with the installed secrets replaced."""
    return _active.encoded(data)


def redact_json(data: Any) -> Any:
    """A redacted, JSON-clean deep copy of ``data`` (values JSON cannot represent become their
    ``str``; so do dates and dataclasses, as the standard library's encoder would). Redacting the
    encoded text covers every string at any depth in one pass; the replacement contains no
    character JSON escapes, so the text stays valid JSON. Encoded with orjson, UTF-8 as the
    stream's events are (every journal event passes here: the standard library's round trip was
    most of what journaling one cost); what orjson refuses (an int beyond 64 bits) takes the
    standard library's way."""
    try:
        encoded = orjson.dumps(data, default=str, option=_JSON_OPTIONS)
    except TypeError:
        return json.loads(_active(json.dumps(data, default=str)))
    return orjson.loads(_active.encoded(encoded))


_JSON_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def install(names: Iterable[str] = (), environ: Mapping[str, str] | None = None) -> Redactor:
    """Make the secrets of ``environ`` (default: this process's) the ones redacted from now on,
    and redact log records too. Returns the redactor installed."""
    global _active, _factory_installed
    _active = Redactor(secrets_in(os.environ if environ is None else environ, names))
    if not _factory_installed:
        _install_log_factory()
        _factory_installed = True
    return _active


def _install_log_factory() -> None:
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if _active._pattern is None:
            return record
        try:
            message = record.getMessage()
            redacted = _active(message)
            if redacted != message:
                record.msg, record.args = redacted, None
            if record.exc_info and record.exc_info[1] is not None:
                # Formatters use a cached exc_text as is: format (and redact) the traceback now.
                record.exc_text = _active("".join(traceback.format_exception(*record.exc_info)).rstrip("\n"))
        except Exception:  # a record that cannot be formatted is the logging module's to report
            pass
        return record

    logging.setLogRecordFactory(factory)


__all__ = ["MIN_LENGTH", "Redactor", "install", "redact", "redact_bytes", "redact_json", "secrets_in"]
