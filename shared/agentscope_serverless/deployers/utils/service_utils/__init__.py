"""AgentScope's module path of :class:`FastAPIAppFactory` (:mod:`.fastapi_factory`)."""
