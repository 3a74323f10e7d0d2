"""``keel serve`` and ``keel worker`` freeze their start-up heap: what is garbage then is collected first."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import gc, weakref
from agentkeel.cli.worker import freeze_heap

class Node:
    pass

gc.disable()  # the cycle below must still exist when freeze_heap runs
a, b = Node(), Node()
a.other, b.other = b, a
garbage = weakref.ref(a)
del a, b
kept = Node()
freeze_heap()
print(garbage() is None, gc.get_freeze_count() > 0)
"""


def test_freeze_heap_collects_start_up_garbage_then_freezes_the_rest() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["True", "True"]
