"""AgentScope Runtime's exception schemas: errors with an HTTP status, a code and details.

The classes, their bases, codes, statuses and messages are AgentScope's: one class per HTTP
status under :class:`AppBaseException`, :class:`BusinessLogicException` (422) for the
application's rules and :class:`AgentRuntimeErrorException` below it for the agent's own
failures (models, tools, MCP). A handler that raises one ends its run with that ``code`` and
``message`` in the failed event; any other exception ends it as ``AGENT_UNKNOWN_ERROR``
(:class:`UnknownAgentException`).

>>> ToolNotFoundException("search").to_dict()
{'status': 422, 'code': 'TOOL_NOT_FOUND', 'message': 'Tool not found: search', 'details': {}}
>>> str(ToolNotFoundException("search"))
'[422] TOOL_NOT_FOUND: Tool not found: search'

:class:`AppBaseException` is also one of the project's errors
(:class:`~agentscope_serverless.errors.AgentScopeServerlessError`).
"""

from __future__ import annotations

from typing import Any

from agentscope_serverless.errors import AgentScopeServerlessError

Details = dict[str, Any] | None


class AppBaseException(AgentScopeServerlessError):
    """An application error: HTTP ``status``, business ``code``, ``message`` and ``details``.

    ``str()`` reads ``[status] code: message``; ``details`` is ``{}`` when none are given.
    """

    def __init__(self, status: int, code: str, message: str, details: Details = None) -> None:
        super().__init__(message, code=code)
        self.status = status
        self.details = details or {}

    def __str__(self) -> str:
        return f"[{self.status}] {self.code}: {self.message}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status={self.status}, code='{self.code}', "
            f"message='{self.message}')"
        )

    def to_dict(self) -> dict[str, Any]:
        """The error as one flat dict: ``{"status", "code", "message", "details"}``."""
        return {
            "status": self.status,
            "code": self.code,
            "message": self.message,
            "details": self.details,
        }


class BadRequestException(AppBaseException):
    """400 Bad Request."""

    def __init__(self, code: str, message: str, details: Details = None) -> None:
        super().__init__(400, code, message, details)


class UnauthorizedException(AppBaseException):
    """401 Unauthorized."""

    def __init__(self, code: str, message: str, details: Details = None) -> None:
        super().__init__(401, code, message, details)


class ForbiddenException(AppBaseException):
    """403 Forbidden."""

    def __init__(self, code: str, message: str, details: Details = None) -> None:
        super().__init__(403, code, message, details)


class NotFoundException(AppBaseException):
    """404 Not Found."""

    def __init__(self, code: str, message: str, details: Details = None) -> None:
        super().__init__(404, code, message, details)


class MethodNotAllowedException(AppBaseException):
    """405 Method Not Allowed."""

    def __init__(self, code: str, message: str, details: Details = None) -> None:
        super().__init__(405, code, message, details)


class ConflictException(AppBaseException):
    """409 Conflict."""

    def __init__(self, code: str, message: str, details: Details = None) -> None:
        super().__init__(409, code, message, details)


class UnprocessableEntityException(AppBaseException):
    """422 Unprocessable Entity."""

    def __init__(self, code: str, message: str, details: Details = None) -> None:
        super().__init__(422, code, message, details)


class TooManyRequestsException(AppBaseException):
    """429 Too Many Requests."""

    def __init__(self, code: str, message: str, details: Details = None) -> None:
        super().__init__(429, code, message, details)


class InternalServerErrorException(AppBaseException):
    """500 Internal Server Error."""

    def __init__(self, code: str, message: str, details: Details = None) -> None:
        super().__init__(500, code, message, details)


class BadGatewayException(AppBaseException):
    """502 Bad Gateway."""

    def __init__(self, code: str, message: str, details: Details = None) -> None:
        super().__init__(502, code, message, details)


class ServiceUnavailableException(AppBaseException):
    """503 Service Unavailable."""

    def __init__(self, code: str, message: str, details: Details = None) -> None:
        super().__init__(503, code, message, details)


class GatewayTimeoutException(AppBaseException):
    """504 Gateway Timeout."""

    def __init__(self, code: str, message: str, details: Details = None) -> None:
        super().__init__(504, code, message, details)


class BusinessLogicException(UnprocessableEntityException):
    """A rule of the application was broken (422)."""


class SystemException(InternalServerErrorException):
    """A failure of the system itself: a store, a service it calls (500)."""


class AgentRuntimeErrorException(BusinessLogicException):
    """A failure of the agent while it runs: its model, its tools, MCP (422)."""


class AuthenticationException(UnauthorizedException):
    """401 ``AUTH_FAILED``."""

    def __init__(self, message: str = "Authentication failed", details: Details = None) -> None:
        super().__init__("AUTH_FAILED", message, details)


class InvalidTokenException(UnauthorizedException):
    """401 ``INVALID_TOKEN``."""

    def __init__(self, message: str = "Invalid token", details: Details = None) -> None:
        super().__init__("INVALID_TOKEN", message, details)


class TokenExpiredException(UnauthorizedException):
    """401 ``TOKEN_EXPIRED``."""

    def __init__(self, message: str = "Token has expired", details: Details = None) -> None:
        super().__init__("TOKEN_EXPIRED", message, details)


class AccessDeniedException(ForbiddenException):
    """403 ``ACCESS_DENIED``."""

    def __init__(self, message: str = "Access denied", details: Details = None) -> None:
        super().__init__("ACCESS_DENIED", message, details)


class PermissionDeniedException(ForbiddenException):
    """403 ``PERMISSION_DENIED``."""

    def __init__(self, message: str = "Permission denied", details: Details = None) -> None:
        super().__init__("PERMISSION_DENIED", message, details)


class ResourceNotFoundException(NotFoundException):
    """404 ``RESOURCE_NOT_FOUND``: ``<resource_type> not found: <resource_id>``."""

    def __init__(self, resource_type: str, resource_id: str, details: Details = None) -> None:
        super().__init__("RESOURCE_NOT_FOUND", f"{resource_type} not found: {resource_id}", details)


class UserNotFoundException(NotFoundException):
    """404 ``USER_NOT_FOUND``."""

    def __init__(self, user_id: str, details: Details = None) -> None:
        super().__init__("USER_NOT_FOUND", f"User not found: {user_id}", details)


class TaskNotFoundException(NotFoundException):
    """404 ``TASK_NOT_FOUND``."""

    def __init__(self, task_id: str, details: Details = None) -> None:
        super().__init__("TASK_NOT_FOUND", f"Task not found: {task_id}", details)


class InvalidParameterException(BadRequestException):
    """400 ``INVALID_PARAMETER``; the message defaults to ``Invalid parameter: <parameter>``."""

    def __init__(self, parameter: str, message: str | None = None, details: Details = None) -> None:
        if message is None:
            message = f"Invalid parameter: {parameter}"
        super().__init__("INVALID_PARAMETER", message, details)


class MissingParameterException(BadRequestException):
    """400 ``MISSING_PARAMETER``."""

    def __init__(self, parameter: str, details: Details = None) -> None:
        super().__init__("MISSING_PARAMETER", f"Missing required parameter: {parameter}", details)


class ParameterValidationException(BadRequestException):
    """400 ``PARAMETER_VALIDATION``: ``Parameter validation failed: <parameter> - <error>``."""

    def __init__(self, parameter: str, validation_error: str, details: Details = None) -> None:
        super().__init__(
            "PARAMETER_VALIDATION",
            f"Parameter validation failed: {parameter} - {validation_error}",
            details,
        )


class RateLimitExceededException(TooManyRequestsException):
    """429 ``RATE_LIMIT_EXCEEDED``, saying after how many seconds to retry."""

    def __init__(self, operation: str, retry_after: int = 60, details: Details = None) -> None:
        super().__init__(
            "RATE_LIMIT_EXCEEDED",
            f"Operation {operation} is too frequent, please retry after {retry_after} seconds",
            details,
        )


class TimeoutException(GatewayTimeoutException):
    """504 ``TIMEOUT``."""

    def __init__(self, operation: str, timeout: int, details: Details = None) -> None:
        super().__init__(
            "TIMEOUT", f"Operation {operation} timed out, timeout limit: {timeout} seconds", details
        )


class NetworkException(ServiceUnavailableException):
    """503 ``NETWORK_ERROR``."""

    def __init__(self, message: str, details: Details = None) -> None:
        super().__init__("NETWORK_ERROR", message, details)


class ConfigurationException(InternalServerErrorException):
    """500 ``CONFIGURATION_ERROR``; the message defaults to ``Configuration error: <key>``."""

    def __init__(
        self, config_key: str, message: str | None = None, details: Details = None
    ) -> None:
        if message is None:
            message = f"Configuration error: {config_key}"
        super().__init__("CONFIGURATION_ERROR", message, details)


class DatabaseException(SystemException):
    """500 ``DATABASE_ERROR``."""

    def __init__(self, message: str, details: Details = None) -> None:
        super().__init__("DATABASE_ERROR", message, details)


class RedisException(SystemException):
    """500 ``REDIS_ERROR``."""

    def __init__(self, message: str, details: Details = None) -> None:
        super().__init__("REDIS_ERROR", message, details)


class ExternalServiceException(SystemException):
    """500 ``EXTERNAL_SERVICE_ERROR``: ``External service <name> error: <message>``."""

    def __init__(self, service_name: str, message: str, details: Details = None) -> None:
        super().__init__(
            "EXTERNAL_SERVICE_ERROR", f"External service {service_name} error: {message}", details
        )


class AgentException(BusinessLogicException):
    """422 ``AGENT_ERROR``."""

    def __init__(self, message: str, details: Details = None) -> None:
        super().__init__("AGENT_ERROR", message, details)


class WorkflowException(BusinessLogicException):
    """422 ``WORKFLOW_ERROR``."""

    def __init__(self, message: str, details: Details = None) -> None:
        super().__init__("WORKFLOW_ERROR", message, details)


class ResponseException(BusinessLogicException):
    """422 ``RESPONSE_ERROR``."""

    def __init__(self, message: str, details: Details = None) -> None:
        super().__init__("RESPONSE_ERROR", message, details)


class ModelNotFoundException(AgentRuntimeErrorException):
    """422 ``MODEL_NOT_FOUND``."""

    def __init__(self, model_name: str, details: Details = None) -> None:
        super().__init__("MODEL_NOT_FOUND", f"Model not found: {model_name}", details)


class UnauthorizedModelAccessException(AgentRuntimeErrorException):
    """422 ``MODEL_UNAUTHORIZED_ACCESS``."""

    def __init__(self, model_name: str, details: Details = None) -> None:
        super().__init__(
            "MODEL_UNAUTHORIZED_ACCESS", f"Unauthorized access to model: {model_name}", details
        )


class ModelQuotaExceededException(AgentRuntimeErrorException):
    """422 ``MODEL_QUOTA_EXCEEDED``."""

    def __init__(self, model_name: str, details: Details = None) -> None:
        super().__init__("MODEL_QUOTA_EXCEEDED", f"Model quota exceeded: {model_name}", details)


class ModelContextLengthExceededException(AgentRuntimeErrorException):
    """422 ``MODEL_CONTEXT_LENGTH_EXCEEDED``."""

    def __init__(self, model_name: str, details: Details = None) -> None:
        super().__init__(
            "MODEL_CONTEXT_LENGTH_EXCEEDED", f"Model context length exceeded: {model_name}", details
        )


class ModelExecutionException(AgentRuntimeErrorException):
    """422 ``MODEL_EXECUTION_FAILED``."""

    def __init__(self, model_name: str, details: Details = None) -> None:
        super().__init__(
            "MODEL_EXECUTION_FAILED",
            f"Error occurred during execution of model: {model_name}",
            details,
        )


class ModelTimeoutException(AgentRuntimeErrorException):
    """422 ``MODEL_TIMEOUT``."""

    def __init__(self, model_name: str, timeout: int, details: Details = None) -> None:
        super().__init__(
            "MODEL_TIMEOUT",
            f"Model inference timed out: {model_name}, timeout limit: {timeout} seconds",
            details,
        )


class ToolNotFoundException(AgentRuntimeErrorException):
    """422 ``TOOL_NOT_FOUND``."""

    def __init__(self, tool_name: str, details: Details = None) -> None:
        super().__init__("TOOL_NOT_FOUND", f"Tool not found: {tool_name}", details)


class ToolExecutionException(AgentRuntimeErrorException):
    """422 ``TOOL_EXECUTION_FAILED``."""

    def __init__(self, details: Details = None) -> None:
        super().__init__("TOOL_EXECUTION_FAILED", "Error occurred during tool execution", details)


class MCPConnectionException(AgentRuntimeErrorException):
    """422 ``MCP_CONNECTION_FAILED``."""

    def __init__(self, details: Details = None) -> None:
        super().__init__("MCP_CONNECTION_FAILED", "Failed to connect to MCP service", details)


class MCPProtocolException(AgentRuntimeErrorException):
    """422 ``MCP_PROTOCOL_ERROR``."""

    def __init__(self, details: Details = None) -> None:
        super().__init__("MCP_PROTOCOL_ERROR", "Invalid MCP protocol message format", details)


class UnknownAgentException(AgentRuntimeErrorException):
    """422 ``AGENT_UNKNOWN_ERROR``: ``Unknown agent error: <Type>: <text>`` for an exception
    an agent raised, ``Unknown agent error`` without one."""

    def __init__(
        self, original_exception: BaseException | None = None, details: Details = None
    ) -> None:
        message = "Unknown agent error"
        if original_exception is not None:
            message += f": {type(original_exception).__name__}: {original_exception}"
        super().__init__("AGENT_UNKNOWN_ERROR", message, details)


__all__ = [
    "AccessDeniedException",
    "AgentException",
    "AgentRuntimeErrorException",
    "AppBaseException",
    "AuthenticationException",
    "BadGatewayException",
    "BadRequestException",
    "BusinessLogicException",
    "ConfigurationException",
    "ConflictException",
    "DatabaseException",
    "ExternalServiceException",
    "ForbiddenException",
    "GatewayTimeoutException",
    "InternalServerErrorException",
    "InvalidParameterException",
    "InvalidTokenException",
    "MCPConnectionException",
    "MCPProtocolException",
    "MethodNotAllowedException",
    "MissingParameterException",
    "ModelContextLengthExceededException",
    "ModelExecutionException",
    "ModelNotFoundException",
    "ModelQuotaExceededException",
    "ModelTimeoutException",
    "NetworkException",
    "NotFoundException",
    "ParameterValidationException",
    "PermissionDeniedException",
    "RateLimitExceededException",
    "RedisException",
    "ResourceNotFoundException",
    "ResponseException",
    "ServiceUnavailableException",
    "SystemException",
    "TaskNotFoundException",
    "TimeoutException",
    "TokenExpiredException",
    "TooManyRequestsException",
    "ToolExecutionException",
    "ToolNotFoundException",
    "UnauthorizedException",
    "UnauthorizedModelAccessException",
    "UnknownAgentException",
    "UnprocessableEntityException",
    "UserNotFoundException",
    "WorkflowException",
]
