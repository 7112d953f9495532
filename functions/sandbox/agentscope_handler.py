"""The sandbox function: sandbox access for a user's sessions."""

from agentscope_serverless.http.lambda_handler import make_handler

handler = make_handler(["sandbox"])
