"""Where a step's work happens: git, the repository, environment, sandbox, processes."""
