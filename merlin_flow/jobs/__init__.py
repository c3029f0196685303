"""The use cases behind the CLI: submit, view, control, replay, cost and prune jobs."""
