"""AgentScope's module paths of the deployers' helpers that ported code imports.

Its detached-process and wheel-bundle helpers are not offered (their modules raise an
``ImportError`` saying so): an archive of a project is built by
:mod:`agentscope_serverless.packaging`.
"""
