"""The sessions function: session history REST API and the stored runs (status, events, cancel)."""

from agentscope_serverless.http.lambda_handler import make_handler

handler = make_handler(["sessions", "runs"])
