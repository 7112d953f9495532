"""Protocol adapters: extra protocols an agent app may serve (AgentScope's names)."""
