"""The process function: /process, the OpenAI-compatible endpoints and the erase route
(``DELETE /users/me/data``), answered in one piece."""

from agentscope_serverless.http.lambda_handler import make_handler

handler = make_handler(["process", "users"])
