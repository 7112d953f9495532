"""AgentScope Runtime 1.0.5's exception schemas: each class's HTTP status, code, message and
bases, the flat ``to_dict()``, ``str()``, and the failed event of a run that raises one."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from agentscope_serverless.runner import Runner
from agentscope_serverless.schemas import exception as ex
from agentscope_serverless.schemas.agent_schemas import AgentResponse, RunStatus

# (class, its arguments, status, code, message), as 1.0.5 builds them.
CODED: list[tuple[type[ex.AppBaseException], tuple[Any, ...], int, str, str]] = [
    (ex.AuthenticationException, (), 401, "AUTH_FAILED", "Authentication failed"),
    (ex.InvalidTokenException, (), 401, "INVALID_TOKEN", "Invalid token"),
    (ex.TokenExpiredException, (), 401, "TOKEN_EXPIRED", "Token has expired"),
    (ex.AccessDeniedException, (), 403, "ACCESS_DENIED", "Access denied"),
    (ex.PermissionDeniedException, (), 403, "PERMISSION_DENIED", "Permission denied"),
    (ex.ResourceNotFoundException, ("Doc", "d1"), 404, "RESOURCE_NOT_FOUND", "Doc not found: d1"),
    (ex.UserNotFoundException, ("u1",), 404, "USER_NOT_FOUND", "User not found: u1"),
    (ex.TaskNotFoundException, ("t1",), 404, "TASK_NOT_FOUND", "Task not found: t1"),
    (
        ex.InvalidParameterException,
        ("top_k",),
        400,
        "INVALID_PARAMETER",
        "Invalid parameter: top_k",
    ),
    (
        ex.MissingParameterException,
        ("query",),
        400,
        "MISSING_PARAMETER",
        "Missing required parameter: query",
    ),
    (
        ex.ParameterValidationException,
        ("city", "empty"),
        400,
        "PARAMETER_VALIDATION",
        "Parameter validation failed: city - empty",
    ),
    (
        ex.RateLimitExceededException,
        ("search",),
        429,
        "RATE_LIMIT_EXCEEDED",
        "Operation search is too frequent, please retry after 60 seconds",
    ),
    (
        ex.TimeoutException,
        ("search", 5),
        504,
        "TIMEOUT",
        "Operation search timed out, timeout limit: 5 seconds",
    ),
    (ex.NetworkException, ("down",), 503, "NETWORK_ERROR", "down"),
    (
        ex.ConfigurationException,
        ("api_key",),
        500,
        "CONFIGURATION_ERROR",
        "Configuration error: api_key",
    ),
    (ex.DatabaseException, ("gone",), 500, "DATABASE_ERROR", "gone"),
    (ex.RedisException, ("gone",), 500, "REDIS_ERROR", "gone"),
    (
        ex.ExternalServiceException,
        ("oss", "denied"),
        500,
        "EXTERNAL_SERVICE_ERROR",
        "External service oss error: denied",
    ),
    (ex.AgentException, ("lost",), 422, "AGENT_ERROR", "lost"),
    (ex.WorkflowException, ("stuck",), 422, "WORKFLOW_ERROR", "stuck"),
    (ex.ResponseException, ("bad",), 422, "RESPONSE_ERROR", "bad"),
    (ex.ModelNotFoundException, ("qwen",), 422, "MODEL_NOT_FOUND", "Model not found: qwen"),
    (
        ex.UnauthorizedModelAccessException,
        ("qwen",),
        422,
        "MODEL_UNAUTHORIZED_ACCESS",
        "Unauthorized access to model: qwen",
    ),
    (
        ex.ModelQuotaExceededException,
        ("qwen",),
        422,
        "MODEL_QUOTA_EXCEEDED",
        "Model quota exceeded: qwen",
    ),
    (
        ex.ModelContextLengthExceededException,
        ("qwen",),
        422,
        "MODEL_CONTEXT_LENGTH_EXCEEDED",
        "Model context length exceeded: qwen",
    ),
    (
        ex.ModelExecutionException,
        ("qwen",),
        422,
        "MODEL_EXECUTION_FAILED",
        "Error occurred during execution of model: qwen",
    ),
    (
        ex.ModelTimeoutException,
        ("qwen", 30),
        422,
        "MODEL_TIMEOUT",
        "Model inference timed out: qwen, timeout limit: 30 seconds",
    ),
    (ex.ToolNotFoundException, ("search",), 422, "TOOL_NOT_FOUND", "Tool not found: search"),
    (
        ex.ToolExecutionException,
        (),
        422,
        "TOOL_EXECUTION_FAILED",
        "Error occurred during tool execution",
    ),
    (
        ex.MCPConnectionException,
        (),
        422,
        "MCP_CONNECTION_FAILED",
        "Failed to connect to MCP service",
    ),
    (ex.MCPProtocolException, (), 422, "MCP_PROTOCOL_ERROR", "Invalid MCP protocol message format"),
    (ex.UnknownAgentException, (), 422, "AGENT_UNKNOWN_ERROR", "Unknown agent error"),
]

# The classes that take (code, message, details), and their status.
BY_STATUS: list[tuple[type[ex.AppBaseException], int]] = [
    (ex.BadRequestException, 400),
    (ex.UnauthorizedException, 401),
    (ex.ForbiddenException, 403),
    (ex.NotFoundException, 404),
    (ex.MethodNotAllowedException, 405),
    (ex.ConflictException, 409),
    (ex.UnprocessableEntityException, 422),
    (ex.TooManyRequestsException, 429),
    (ex.InternalServerErrorException, 500),
    (ex.BadGatewayException, 502),
    (ex.ServiceUnavailableException, 503),
    (ex.GatewayTimeoutException, 504),
    (ex.BusinessLogicException, 422),
    (ex.SystemException, 500),
    (ex.AgentRuntimeErrorException, 422),
]

# Each class and its direct base in 1.0.5.
BASES: dict[type[ex.AppBaseException], type[Exception]] = {
    **{cls: ex.AppBaseException for cls, _ in BY_STATUS[:12]},
    ex.BusinessLogicException: ex.UnprocessableEntityException,
    ex.SystemException: ex.InternalServerErrorException,
    ex.AgentRuntimeErrorException: ex.BusinessLogicException,
    ex.AuthenticationException: ex.UnauthorizedException,
    ex.InvalidTokenException: ex.UnauthorizedException,
    ex.TokenExpiredException: ex.UnauthorizedException,
    ex.AccessDeniedException: ex.ForbiddenException,
    ex.PermissionDeniedException: ex.ForbiddenException,
    ex.ResourceNotFoundException: ex.NotFoundException,
    ex.UserNotFoundException: ex.NotFoundException,
    ex.TaskNotFoundException: ex.NotFoundException,
    ex.InvalidParameterException: ex.BadRequestException,
    ex.MissingParameterException: ex.BadRequestException,
    ex.ParameterValidationException: ex.BadRequestException,
    ex.RateLimitExceededException: ex.TooManyRequestsException,
    ex.TimeoutException: ex.GatewayTimeoutException,
    ex.NetworkException: ex.ServiceUnavailableException,
    ex.ConfigurationException: ex.InternalServerErrorException,
    ex.DatabaseException: ex.SystemException,
    ex.RedisException: ex.SystemException,
    ex.ExternalServiceException: ex.SystemException,
    ex.AgentException: ex.BusinessLogicException,
    ex.WorkflowException: ex.BusinessLogicException,
    ex.ResponseException: ex.BusinessLogicException,
    ex.ModelNotFoundException: ex.AgentRuntimeErrorException,
    ex.UnauthorizedModelAccessException: ex.AgentRuntimeErrorException,
    ex.ModelQuotaExceededException: ex.AgentRuntimeErrorException,
    ex.ModelContextLengthExceededException: ex.AgentRuntimeErrorException,
    ex.ModelExecutionException: ex.AgentRuntimeErrorException,
    ex.ModelTimeoutException: ex.AgentRuntimeErrorException,
    ex.ToolNotFoundException: ex.AgentRuntimeErrorException,
    ex.ToolExecutionException: ex.AgentRuntimeErrorException,
    ex.MCPConnectionException: ex.AgentRuntimeErrorException,
    ex.MCPProtocolException: ex.AgentRuntimeErrorException,
    ex.UnknownAgentException: ex.AgentRuntimeErrorException,
}


@pytest.mark.parametrize(
    ("cls", "args", "status", "code", "message"), CODED, ids=[c[0].__name__ for c in CODED]
)
def test_each_exception_has_agentscope_status_code_and_message(
    cls: type[ex.AppBaseException], args: tuple[Any, ...], status: int, code: str, message: str
) -> None:
    error = cls(*args)
    assert (error.status, error.code, error.message, error.details) == (status, code, message, {})


@pytest.mark.parametrize(("cls", "status"), BY_STATUS, ids=[c.__name__ for c, _ in BY_STATUS])
def test_each_status_class_takes_a_code_and_a_message(
    cls: Callable[[str, str, dict[str, Any]], ex.AppBaseException], status: int
) -> None:
    error = cls("MY_CODE", "mine", {"k": 1})
    assert (error.status, error.code, error.message, error.details) == (
        status,
        "MY_CODE",
        "mine",
        {"k": 1},
    )


def test_every_listed_class_has_agentscope_base() -> None:
    assert set(BASES) | {ex.AppBaseException} == {getattr(ex, name) for name in ex.__all__}
    assert {cls: cls.__bases__[0] for cls in BASES} == BASES


def test_agent_runtime_errors_are_business_logic_errors_not_server_errors() -> None:
    agent_errors = [ex.ModelTimeoutException("qwen", 30), ex.ToolExecutionException()]
    for error in [*agent_errors, ex.UnknownAgentException(RuntimeError("x"))]:
        with pytest.raises(ex.AgentRuntimeErrorException):
            raise error
        with pytest.raises(ex.BusinessLogicException):
            raise error
        assert isinstance(error, ex.UnprocessableEntityException)
        assert not isinstance(error, ex.InternalServerErrorException | ex.GatewayTimeoutException)
    assert not isinstance(ex.AgentException("x"), ex.AgentRuntimeErrorException)
    assert not isinstance(ex.ModelNotFoundException("qwen"), ex.NotFoundException)


def test_store_and_service_failures_are_system_errors() -> None:
    for error in [
        ex.RedisException("x"),
        ex.DatabaseException("x"),
        ex.ExternalServiceException("s", "x"),
    ]:
        assert isinstance(error, ex.SystemException | ex.InternalServerErrorException)
    assert not isinstance(ex.ConfigurationException("k"), ex.SystemException)
    assert isinstance(ex.ConfigurationException("k"), ex.InternalServerErrorException)


def test_to_dict_is_flat() -> None:
    error = ex.AppBaseException(418, "TEAPOT", "short and stout", {"spout": True})
    assert error.to_dict() == {
        "status": 418,
        "code": "TEAPOT",
        "message": "short and stout",
        "details": {"spout": True},
    }
    assert list(error.to_dict()) == ["status", "code", "message", "details"]


def test_details_default_to_an_empty_dict() -> None:
    assert ex.ToolExecutionException().details == {}
    assert ex.AppBaseException(400, "C", "m", None).to_dict()["details"] == {}


def test_str_reads_status_code_and_message() -> None:
    assert str(ex.ModelNotFoundException("qwen")) == "[422] MODEL_NOT_FOUND: Model not found: qwen"
    assert ex.AccessDeniedException().args == ("Access denied",)


def test_repr_shows_status_code_and_message() -> None:
    assert repr(ex.NotFoundException("GONE", "gone")) == (
        "NotFoundException(status=404, code='GONE', message='gone')"
    )


def test_an_empty_message_is_kept_instead_of_the_default() -> None:
    assert ex.InvalidParameterException("p", "").message == ""
    assert ex.ConfigurationException("k", "").message == ""
    assert ex.InvalidParameterException("p", "p must be positive").message == "p must be positive"


def test_unknown_agent_exception_names_the_type_and_text() -> None:
    assert ex.UnknownAgentException(KeyError("k")).message == "Unknown agent error: KeyError: 'k'"
    assert ex.UnknownAgentException(RuntimeError()).message == "Unknown agent error: RuntimeError: "


class RaisingRunner(Runner):
    """A Runner subclass whose handler raises ``error``, as AgentScope users write them."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.framework_type = "text"
        self.error = error

    async def query_handler(self, *args: Any, **kwargs: Any) -> AsyncIterator[str]:
        raise self.error
        yield ""  # a generator, as AgentScope's streaming handlers are


async def _failed_event(error: Exception) -> AgentResponse:
    async with RaisingRunner(error) as runner:
        request = {"input": [{"role": "user", "content": [{"type": "text", "text": "go"}]}]}
        events = [event async for event in runner.stream_query(request)]
    last = events[-1]
    assert isinstance(last, AgentResponse) and last.status == RunStatus.Failed
    return last


@pytest.mark.parametrize(
    ("error", "code", "message"),
    [
        (
            ex.ToolExecutionException(),
            "TOOL_EXECUTION_FAILED",
            "Error occurred during tool execution",
        ),
        (ex.AuthenticationException(), "AUTH_FAILED", "Authentication failed"),
        (ex.AppBaseException(400, "MY_CODE", "custom"), "MY_CODE", "custom"),
        (RuntimeError("Error"), "AGENT_UNKNOWN_ERROR", "Unknown agent error: RuntimeError: Error"),
        (RuntimeError(), "AGENT_UNKNOWN_ERROR", "Unknown agent error: RuntimeError: "),
    ],
    ids=["tool", "auth", "custom", "plain", "plain-without-text"],
)
async def test_a_run_that_raises_fails_with_agentscope_code_and_message(
    error: Exception, code: str, message: str
) -> None:
    failed = await _failed_event(error)
    assert failed.error is not None
    assert failed.error.model_dump() == {"code": code, "message": message}
