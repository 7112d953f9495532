"""``python -m agentscope_serverless.sandbox_server``: the same as ``agentscope-sandbox-server``."""

from agentscope_serverless.sandbox_server.cli import main

if __name__ == "__main__":
    main()
