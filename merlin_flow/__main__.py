"""``python -m merlin_flow`` runs the CLI."""

from merlin_flow.cli import main

main()
