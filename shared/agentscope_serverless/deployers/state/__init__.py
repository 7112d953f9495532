"""AgentScope's module path of the deployment record (:mod:`.schema`)."""
