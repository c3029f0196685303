"""Locate the files shipped beside the package: migrations, default config, examples.

In a source checkout (editable install) they are the top-level ``alembic/``, ``config/``
and ``examples/`` folders; in a wheel they are copied into ``merlin_flow/_bundled/``.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def resource_dir(name: str) -> Path:
    """Return the shipped folder ``name`` (``alembic``, ``config`` or ``examples``)."""
    for candidate in (_PACKAGE_DIR / "_bundled" / name, _PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"merlin_flow is installed without its {name}/ folder")
