"""Deployers: ``from agentscope_serverless.deployers import DeployManager, LocalDeployManager``.

Importing this package imports uvicorn (for the local deployer); the HTTP application and
the Lambda functions never import it.
"""

from agentscope_serverless.deployers.base import DeployManager
from agentscope_serverless.deployers.local_deployer import LocalDeployManager

__all__ = ["DeployManager", "LocalDeployManager"]
