"""The memory function: long-term memory REST API."""

from agentscope_serverless.http.lambda_handler import make_handler

handler = make_handler(["memory"])
