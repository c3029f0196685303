"""Transitional: the engine now lives in ``attempt``, ``verdict`` and ``lifecycle``.

Kept only until the CLI and ``jobs`` import from those modules (issue 11); not public.
"""

from merlin_flow.lifecycle import add_event
from merlin_flow.sandbox import SANDBOX_OFF_WARNING
from merlin_flow.store import FINAL_JOB_STATUSES

__all__ = ["FINAL_JOB_STATUSES", "SANDBOX_OFF_WARNING", "add_event"]
