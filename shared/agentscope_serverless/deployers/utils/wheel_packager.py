"""AgentScope's module path of :func:`default_deploy_name`.

Its wheel building (``build_wheel``, ``generate_wrapper_project``, ...) is not offered: the
AgentRun and ModelStudio deployers build their archives with
:mod:`agentscope_serverless.packaging`.
"""

from typing import Any

from agentscope_serverless.deployers.modelstudio_deployer import default_deploy_name
from agentscope_serverless.not_offered import missing_name


def __getattr__(name: str) -> Any:
    raise missing_name(__name__, name)


__all__ = ["default_deploy_name"]
