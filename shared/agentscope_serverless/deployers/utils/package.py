"""AgentScope's module path of :func:`generate_build_directory`."""

from agentscope_serverless.deployers.modelstudio_deployer import generate_build_directory

__all__ = ["generate_build_directory"]
