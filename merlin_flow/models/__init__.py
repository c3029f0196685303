"""Model calls: litellm, the journal, the scripted model, endpoints, credentials."""
