"""The OpenAI responses protocol (AgentScope's ``ResponseAPIDefaultAdapter``).

Every app serving ``/process`` also serves ``POST /compatible-mode/v1/responses``, so this
adapter adds nothing: it exists so code passing it keeps working.
"""

from agentscope_serverless.deployers.adapter.responses.response_api_protocol_adapter import (
    ResponseAPIDefaultAdapter,
)

__all__ = ["ResponseAPIDefaultAdapter"]
