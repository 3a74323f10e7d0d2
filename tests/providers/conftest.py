"""The provider stubs' fixtures, defined once so the session-scoped processes are shared by every
module of this folder (see ``provider_support``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # provider_support, whichever import mode pytest uses

from keel_support import keel_provider_server  # noqa: E402, F401
from provider_support import (  # noqa: E402, F401
    anthropic_stub,
    anthropic_stub_process,
    openai_stub,
    openai_stub_process,
    stub_key,
)
