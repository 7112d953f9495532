"""Adapters between agent frameworks and this runtime (``agentscope_runtime.adapters``).

Each framework's adapters import the framework itself, so import them only with it
installed: ``agentscope_serverless.adapters.agentscope`` needs the ``agentscope`` package.
"""
