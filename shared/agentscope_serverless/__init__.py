"""AgentScope Runtime as serverless functions: agents as HTTPS APIs on managed stores.

The package keeps its import light (Lambda cold starts are dominated by imports): the
submodules are imported where they are used, for example::

    from agentscope_serverless.services.session_history import InMemorySessionHistoryService
    from agentscope_serverless.schemas.agent_schemas import Message, TextContent
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
