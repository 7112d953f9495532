"""The state function: agent state REST API."""

from agentscope_serverless.http.lambda_handler import make_handler

handler = make_handler(["state"])
