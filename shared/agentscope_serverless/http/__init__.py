"""The HTTP API: one application factory over the runtime.

>>> from agentscope_serverless.http import create_app
>>> app = create_app(["process"])

See :func:`create_app` for the routers, :mod:`.auth` for authentication, :mod:`.errors` for
the error format and :mod:`.openai_compat` for the OpenAI-compatible endpoints.
"""

from agentscope_serverless.http.app import ROUTERS, create_app

__all__ = ["ROUTERS", "create_app"]
