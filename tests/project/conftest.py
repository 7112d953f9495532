"""The Lambda-faithful harness's stores and settings, for the user project's SAM build."""

from tests.lambda_.conftest import function_environment

__all__ = ["function_environment"]
