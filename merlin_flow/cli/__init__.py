"""The ``merlin`` command line (typer + rich)."""

from merlin_flow.cli.app import app, main

__all__ = ["app", "main"]
