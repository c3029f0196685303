"""litellm imported ahead of the first call: in a thread of its own, once (models.llm)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys, threading
from merlin_flow.models import llm
assert "litellm" not in sys.modules
llm.preload_in_background()
llm.preload_in_background()  # a second ask starts nothing
started = [t for t in threading.enumerate() if t.name == "merlin-preload"]
print(len(started))
module = llm.litellm_module()  # waits for the thread's import, or imports it itself
started[0].join(timeout=120)
print(module is sys.modules["litellm"], started[0].is_alive())
print("litellm.responses.mcp.chat_completions_handler" in sys.modules)
"""


def test_litellm_is_imported_once_in_a_thread_of_its_own() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, check=True
    )
    assert done.stdout.split() == ["1", "True", "False", "True"]
