"""The durable step machine: attempts, verdicts, escalation, leases, recovery."""
