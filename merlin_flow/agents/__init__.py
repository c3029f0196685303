"""The agent: its loop, what one attempt's agent is given, agent definitions."""
