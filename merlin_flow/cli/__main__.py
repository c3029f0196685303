"""``python -m merlin_flow.cli`` runs the CLI."""

from merlin_flow.cli import main

main()
