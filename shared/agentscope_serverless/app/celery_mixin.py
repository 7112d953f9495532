"""AgentScope's Celery mixin, which is not offered here."""

raise ImportError(
    "CeleryMixin (Celery task queues) is not offered: background tasks are AgentApp's "
    "@app.task routes, run without Celery (agentscope_serverless.app.AgentApp)"
)
