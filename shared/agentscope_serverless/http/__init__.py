"""The HTTP API: one application factory over the runtime::

    from agentscope_serverless.http import create_app
    app = create_app(["process"], settings=settings)   # settings from the process's root

See :func:`create_app` for the routers, :mod:`.auth` for authentication, :mod:`.errors` for
the error format, :mod:`.openai_compat` for the OpenAI-compatible endpoints and
:mod:`.sdk_retries` for their answer to an OpenAI SDK's retry. :func:`public` leaves a route a
user adds to ``app.get_fastapi_app()`` open to callers without a key.
"""

from agentscope_serverless.http._fastapi import import_fastapi

import_fastapi()  # before any route is defined

from agentscope_serverless.http.app import ROUTERS, create_app  # noqa: E402
from agentscope_serverless.http.auth import public  # noqa: E402

__all__ = ["ROUTERS", "create_app", "public"]
