"""AgentScope's module path of :func:`default_deploy_name`.

Its wheel building (``build_wheel``, ``generate_wrapper_project``, ...) is not offered: the
AgentRun and ModelStudio deployers build their archives with
:mod:`agentscope_serverless.packaging`.
"""

from agentscope_serverless.deployers.modelstudio_deployer import default_deploy_name

__all__ = ["default_deploy_name"]
