"""The process function: /process and the OpenAI-compatible endpoints, answered in one piece."""

from agentscope_serverless.http.lambda_handler import make_handler

handler = make_handler(["process"])
