"""AgentScope Runtime's exception schemas: errors with an HTTP status, a code and details.

Each one derives from :class:`AppBaseException`, itself one of the project's errors
(:class:`~agentscope_serverless.errors.AgentScopeServerlessError`), so a handler that raises
one ends its run with that ``code`` and message in the failed event:

>>> error = ModelTimeoutException("qwen-max", 30)
>>> error.to_dict()["error"]["code"], error.status
('MODEL_TIMEOUT', 504)
"""

from __future__ import annotations

from typing import Any

from agentscope_serverless.errors import AgentScopeServerlessError

Details = dict[str, Any] | None


class AppBaseException(AgentScopeServerlessError):
    """An application error: HTTP ``status``, stable ``code``, ``message`` and ``details``."""

    def __init__(self, status: int, code: str, message: str, details: Details = None) -> None:
        super().__init__(message, code=code)
        self.status = status
        self.details = details or {}

    def to_dict(self) -> dict[str, Any]:
        """The error body: ``{"error": {"code", "message", "details"}, "status"}``."""
        return {
            "error": {"code": self.code, "message": self.message, "details": self.details},
            "status": self.status,
        }


class _CodedException(AppBaseException):
    status_code = 500

    def __init__(self, code: str, message: str, details: Details = None) -> None:
        super().__init__(self.status_code, code, message, details)


class BadRequestException(_CodedException):
    """400."""

    status_code = 400


class UnauthorizedException(_CodedException):
    """401."""

    status_code = 401


class ForbiddenException(_CodedException):
    """403."""

    status_code = 403


class NotFoundException(_CodedException):
    """404."""

    status_code = 404


class MethodNotAllowedException(_CodedException):
    """405."""

    status_code = 405


class ConflictException(_CodedException):
    """409."""

    status_code = 409


class UnprocessableEntityException(_CodedException):
    """422."""

    status_code = 422


class TooManyRequestsException(_CodedException):
    """429."""

    status_code = 429


class InternalServerErrorException(_CodedException):
    """500."""


class BadGatewayException(_CodedException):
    """502."""

    status_code = 502


class ServiceUnavailableException(_CodedException):
    """503."""

    status_code = 503


class GatewayTimeoutException(_CodedException):
    """504."""

    status_code = 504


class BusinessLogicException(_CodedException):
    """A rule of the application was broken (400)."""

    status_code = 400


class SystemException(_CodedException):
    """A failure of the system itself (500)."""


class AgentRuntimeErrorException(_CodedException):
    """An error of the agent runtime (500)."""


class AuthenticationException(UnauthorizedException):
    def __init__(self, message: str = "Authentication failed", details: Details = None) -> None:
        super().__init__("AUTHENTICATION_FAILED", message, details)


class InvalidTokenException(UnauthorizedException):
    def __init__(self, message: str = "Invalid token", details: Details = None) -> None:
        super().__init__("INVALID_TOKEN", message, details)


class TokenExpiredException(UnauthorizedException):
    def __init__(self, message: str = "Token has expired", details: Details = None) -> None:
        super().__init__("TOKEN_EXPIRED", message, details)


class AccessDeniedException(ForbiddenException):
    def __init__(self, message: str = "Access denied", details: Details = None) -> None:
        super().__init__("ACCESS_DENIED", message, details)


class PermissionDeniedException(ForbiddenException):
    def __init__(self, message: str = "Permission denied", details: Details = None) -> None:
        super().__init__("PERMISSION_DENIED", message, details)


class UnauthorizedModelAccessException(ForbiddenException):
    def __init__(self, model_name: str, details: Details = None) -> None:
        super().__init__("MODEL_ACCESS_DENIED", f"No access to model {model_name}", details)


class ResourceNotFoundException(NotFoundException):
    def __init__(self, resource_type: str, resource_id: str, details: Details = None) -> None:
        super().__init__("RESOURCE_NOT_FOUND", f"{resource_type} not found: {resource_id}", details)


class UserNotFoundException(NotFoundException):
    def __init__(self, user_id: str, details: Details = None) -> None:
        super().__init__("USER_NOT_FOUND", f"User not found: {user_id}", details)


class ModelNotFoundException(NotFoundException):
    def __init__(self, model_name: str, details: Details = None) -> None:
        super().__init__("MODEL_NOT_FOUND", f"Model not found: {model_name}", details)


class ToolNotFoundException(NotFoundException):
    def __init__(self, tool_name: str, details: Details = None) -> None:
        super().__init__("TOOL_NOT_FOUND", f"Tool not found: {tool_name}", details)


class TaskNotFoundException(NotFoundException):
    def __init__(self, task_id: str, details: Details = None) -> None:
        super().__init__("TASK_NOT_FOUND", f"Task not found: {task_id}", details)


class InvalidParameterException(BadRequestException):
    def __init__(self, parameter: str, message: str | None = None, details: Details = None) -> None:
        super().__init__("INVALID_PARAMETER", message or f"Invalid parameter: {parameter}", details)


class MissingParameterException(BadRequestException):
    def __init__(self, parameter: str, details: Details = None) -> None:
        super().__init__("MISSING_PARAMETER", f"Missing parameter: {parameter}", details)


class ParameterValidationException(BadRequestException):
    def __init__(self, parameter: str, validation_error: str, details: Details = None) -> None:
        super().__init__(
            "PARAMETER_VALIDATION_ERROR", f"Invalid {parameter}: {validation_error}", details
        )


class ModelContextLengthExceededException(BadRequestException):
    def __init__(self, model_name: str, details: Details = None) -> None:
        super().__init__(
            "MODEL_CONTEXT_LENGTH_EXCEEDED", f"Context length exceeded for {model_name}", details
        )


class RateLimitExceededException(TooManyRequestsException):
    def __init__(self, operation: str, retry_after: int = 60, details: Details = None) -> None:
        super().__init__(
            "RATE_LIMIT_EXCEEDED",
            f"Rate limit exceeded for {operation}; retry after {retry_after} s",
            details,
        )
        self.retry_after = retry_after


class ModelQuotaExceededException(TooManyRequestsException):
    def __init__(self, model_name: str, details: Details = None) -> None:
        super().__init__("MODEL_QUOTA_EXCEEDED", f"Quota exceeded for model {model_name}", details)


class TimeoutException(GatewayTimeoutException):
    def __init__(self, operation: str, timeout: int, details: Details = None) -> None:
        super().__init__("TIMEOUT", f"{operation} timed out after {timeout} s", details)


class ModelTimeoutException(GatewayTimeoutException):
    def __init__(self, model_name: str, timeout: int, details: Details = None) -> None:
        super().__init__(
            "MODEL_TIMEOUT", f"Model {model_name} timed out after {timeout} s", details
        )


class ExternalServiceException(BadGatewayException):
    def __init__(self, service_name: str, message: str, details: Details = None) -> None:
        super().__init__("EXTERNAL_SERVICE_ERROR", f"{service_name}: {message}", details)


class NetworkException(ServiceUnavailableException):
    def __init__(self, message: str, details: Details = None) -> None:
        super().__init__("NETWORK_ERROR", message, details)


class MCPConnectionException(ServiceUnavailableException):
    def __init__(self, details: Details = None) -> None:
        super().__init__("MCP_CONNECTION_ERROR", "Could not connect to the MCP server", details)


class ConfigurationException(SystemException):
    def __init__(
        self, config_key: str, message: str | None = None, details: Details = None
    ) -> None:
        super().__init__(
            "CONFIGURATION_ERROR", message or f"Bad configuration: {config_key}", details
        )


class DatabaseException(SystemException):
    def __init__(self, message: str, details: Details = None) -> None:
        super().__init__("DATABASE_ERROR", message, details)


class RedisException(SystemException):
    def __init__(self, message: str, details: Details = None) -> None:
        super().__init__("REDIS_ERROR", message, details)


class MCPProtocolException(SystemException):
    def __init__(self, details: Details = None) -> None:
        super().__init__("MCP_PROTOCOL_ERROR", "MCP protocol error", details)


class AgentException(AgentRuntimeErrorException):
    def __init__(self, message: str, details: Details = None) -> None:
        super().__init__("AGENT_ERROR", message, details)


class ModelExecutionException(AgentRuntimeErrorException):
    def __init__(self, model_name: str, details: Details = None) -> None:
        super().__init__("MODEL_EXECUTION_ERROR", f"Model {model_name} failed", details)


class ToolExecutionException(AgentRuntimeErrorException):
    def __init__(self, details: Details = None) -> None:
        super().__init__("TOOL_EXECUTION_ERROR", "Tool execution failed", details)


class WorkflowException(AgentRuntimeErrorException):
    def __init__(self, message: str, details: Details = None) -> None:
        super().__init__("WORKFLOW_ERROR", message, details)


class ResponseException(AgentRuntimeErrorException):
    def __init__(self, message: str, details: Details = None) -> None:
        super().__init__("RESPONSE_ERROR", message, details)


class UnknownAgentException(AgentRuntimeErrorException):
    """Wraps an exception an agent raised: ``Unknown agent error: <Type>: <text>``."""

    def __init__(
        self, original_exception: Exception | None = None, details: Details = None
    ) -> None:
        text = "Unknown agent error"
        if original_exception is not None:
            text += f": {type(original_exception).__name__}"
            if str(original_exception):
                text += f": {original_exception}"
        super().__init__("AGENT_UNKNOWN_ERROR", text, details)
        self.original_exception = original_exception


__all__ = [name for name in dir() if name.endswith("Exception") and not name.startswith("_")]
