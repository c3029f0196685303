"""The toolbox an agent works with: its tools, their schemas, permissions, MCP."""
