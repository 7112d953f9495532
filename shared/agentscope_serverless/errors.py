"""One family of typed errors for the whole project.

Every error the project raises on purpose derives from :class:`AgentScopeServerlessError`,
so callers can catch the family, and the HTTP layer maps each class to one status code.
Messages never include secrets (tokens, passwords, connection strings with credentials).
"""

from __future__ import annotations

from typing import Any


class AgentScopeServerlessError(Exception):
    """Base of every error raised by this project.

    ``code`` is a stable, machine-readable identifier (used in HTTP error bodies and in
    ``failed`` events); the message is for humans. ``retry_after``, when set, is the seconds
    to wait before retrying (sent as ``Retry-After``, carried by a ``failed`` event).
    """

    code: str = "INTERNAL_ERROR"
    retry_after: int | None = None

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class ConfigurationError(AgentScopeServerlessError, ValueError):
    """A setting is missing or has a bad value (raised at start-up)."""

    code = "CONFIGURATION_ERROR"


def hook_name(hook: object) -> str:
    """The name of an app's hook (``@app.init``, ``@app.shutdown``...) as messages show it."""
    return getattr(hook, "__qualname__", None) or type(hook).__name__


class StartupError(AgentScopeServerlessError):
    """A start-up hook of the app (``@app.init``, ``before_start``) raised: the message names
    the hook and its exception, which is chained as the cause."""

    def __init__(self, kind: str, hook: object, cause: BaseException) -> None:
        super().__init__(
            f"the {kind} hook {hook_name(hook)}() failed: {type(cause).__name__}: {cause}"
        )


class ShutdownError(AgentScopeServerlessError):
    """A shut-down hook of the app (``@app.shutdown``, ``after_finish``) raised: the message
    names the hook and its exception, which is chained as the cause."""

    def __init__(self, kind: str, hook: object, cause: BaseException) -> None:
        super().__init__(
            f"the {kind} hook {hook_name(hook)}() failed: {type(cause).__name__}: {cause}"
        )


class InvalidInputError(AgentScopeServerlessError, ValueError):
    """An argument or request body is not valid.

    ``errors`` lists the offending fields as ``{"loc": [...], "msg": "..."}`` items.

    >>> InvalidInputError("user_id must not be blank", field="user_id").errors
    [{'loc': ['user_id'], 'msg': 'user_id must not be blank'}]
    """

    code = "INVALID_INPUT"

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        errors: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(message)
        if errors is None:
            errors = [{"loc": [field] if field else [], "msg": message}]
        self.errors = errors


class UnsupportedParameterError(InvalidInputError):
    """A request asks for something this server cannot do (a 400 naming the parameter),
    rather than have it ignored unseen.

    >>> UnsupportedParameterError("tools", "an agent runs its own tools").message
    'tools is not supported: an agent runs its own tools'
    """

    code = "UNSUPPORTED_PARAMETER"

    def __init__(self, parameter: str, reason: str) -> None:
        super().__init__(f"{parameter} is not supported: {reason}", field=parameter)
        self.parameter = parameter


class ServiceNotStartedError(AgentScopeServerlessError, RuntimeError):
    """A data method was called on a service before ``start()`` or after ``stop()``, or
    was under way still when ``stop()`` closed the store (``stopped``)."""

    code = "SERVICE_NOT_STARTED"

    def __init__(self, service_name: str, *, stopped: bool = False) -> None:
        if stopped:
            message = f"{service_name} was stopped while this call was under way"
        else:
            message = (
                f"{service_name} is not started: call `await service.start()` first "
                "(or use `async with service:`)"
            )
        super().__init__(message)
        self.service_name = service_name


class MethodNotImplementedError(AgentScopeServerlessError, NotImplementedError):
    """A service does not implement a method the request needs (a service written for
    AgentScope Runtime has AgentScope's methods only): the message names the method to
    implement. Retrying gets the same answer until it is implemented.

    >>> MethodNotImplementedError("override list_rounds() to list a session's rounds").code
    'NOT_IMPLEMENTED'
    """

    code = "NOT_IMPLEMENTED"


class NotFoundError(AgentScopeServerlessError, LookupError):
    """The thing asked for does not exist (or belongs to someone else)."""

    code = "NOT_FOUND"


class SessionNotFoundError(NotFoundError):
    """No session with that id for that user."""

    code = "SESSION_NOT_FOUND"

    def __init__(self, user_id: str, session_id: str) -> None:
        super().__init__(f"session {session_id!r} not found")
        self.user_id = user_id
        self.session_id = session_id


class ConflictError(AgentScopeServerlessError):
    """The request conflicts with the current state (for example a concurrent write)."""

    code = "CONFLICT"


class IdempotencyKeyReusedError(ConflictError):
    """An ``Idempotency-Key`` already used for a different request (another body or route)."""

    code = "IDEMPOTENCY_KEY_REUSED"


class RequestInProgressError(ConflictError):
    """A request with the same ``Idempotency-Key`` is still running: retry a little later."""

    code = "REQUEST_IN_PROGRESS"


class MessageIdConflictError(ConflictError):
    """A message's id names a message of its session that says something else: a session
    keeps one message per id, so it would not be stored."""

    code = "MESSAGE_ID_CONFLICT"


class RunCanceledError(ConflictError):
    """A run was canceled before it began: its session was deleted, or its user's data
    erased, while it was loading them."""

    code = "RUN_CANCELED"


class RunNotEndedError(ConflictError):
    """What was asked needs the run's end (deleting a response still in progress): a retry
    a moment later would find it going still, or act on a run that ended since, which its
    caller never saw."""


class RequestTimeoutError(AgentScopeServerlessError):
    """The request body did not arrive in time."""

    code = "REQUEST_TIMEOUT"


class TimeLimitError(AgentScopeServerlessError):
    """A run or background task was ended at its Lambda function's time limit (see
    :mod:`agentscope_serverless.time_limit`)."""

    code = "TIME_LIMIT"


class PayloadTooLargeError(AgentScopeServerlessError):
    """A request body or stored item is larger than the configured limit."""

    code = "PAYLOAD_TOO_LARGE"


class TaskCapacityError(AgentScopeServerlessError):
    """This process runs as many background tasks as it may at once (``TASKS_MAX_RUNNING``):
    the task was not submitted; retry once some have ended (``retry_after`` seconds, sent as
    ``Retry-After`` with the 429)."""

    code = "TASK_CAPACITY"

    def __init__(self, message: str, *, code: str | None = None, retry_after: int = 5) -> None:
        super().__init__(message, code=code)
        self.retry_after = retry_after


class TaskQuotaError(TaskCapacityError):
    """The user runs as many background tasks at once as their share allows
    (``TASKS_MAX_RUNNING_PER_USER``); retry once one of theirs has ended."""

    code = "TASK_QUOTA"


class AuthenticationError(AgentScopeServerlessError):
    """No credential, or a credential that does not match any key."""

    code = "UNAUTHENTICATED"


class PermissionDeniedError(AgentScopeServerlessError):
    """The credential is valid but may not act on the requested user or resource."""

    code = "PERMISSION_DENIED"


class StoreUnavailableError(AgentScopeServerlessError):
    """A backing store (Redis, DynamoDB, a sandbox server) cannot be reached or failed.

    ``store`` names the store (``"redis"``, ``"dynamodb"``, ...); the message never
    carries credentials.
    """

    code = "STORE_UNAVAILABLE"

    def __init__(self, store: str, message: str) -> None:
        super().__init__(f"{store} is unavailable: {message}")
        self.store = store


class PackagingError(AgentScopeServerlessError):
    """A deployable could not be built (a failed install, a size above the platform's limit)."""

    code = "PACKAGING_ERROR"


class DeploymentError(AgentScopeServerlessError):
    """A deployer could not deploy what it built (no cloud to reach, a failed rollout)."""

    code = "DEPLOYMENT_ERROR"


class UploadNotAvailableError(DeploymentError):
    """Uploading to this platform is not available in this build (build with ``skip_upload``)."""

    code = "UPLOAD_NOT_AVAILABLE"

    def __init__(self, platform: str) -> None:
        super().__init__(
            f"uploading to {platform} is not available in this build, and Alibaba Cloud "
            "credentials are set: build the archive only (skip_upload=True, --skip-upload) "
            f"and upload it with {platform}'s console or CLI"
        )
        self.platform = platform


class AgentError(AgentScopeServerlessError):
    """The agent failed while handling a request."""

    code = "AGENT_ERROR"


class SandboxError(AgentScopeServerlessError):
    """A sandbox operation failed (base of every sandbox error).

    Messages carry the operation and the server's explanation, never the bearer token.
    """

    code = "SANDBOX_ERROR"


class SandboxUnavailableError(SandboxError):
    """The sandbox server cannot be reached, timed out, failed on its side (5xx), or
    answered something that is not the sandbox protocol (a 2xx without JSON ``data``)."""

    code = "SANDBOX_UNAVAILABLE"


class SandboxAuthenticationError(SandboxError):
    """The sandbox server rejected the bearer token (401/403)."""

    code = "SANDBOX_UNAUTHENTICATED"


class SandboxNotFoundError(SandboxError, NotFoundError):
    """No sandbox with that id (never created, released, or reaped when idle)."""

    code = "SANDBOX_NOT_FOUND"


class SandboxRequestError(SandboxError):
    """The sandbox server refused the request: bad arguments, unknown tool or sandbox type,
    or a path outside the sandbox's workspace."""

    code = "SANDBOX_BAD_REQUEST"


class SandboxCapacityError(SandboxError):
    """The sandbox server runs as many sandboxes as it may; release some or retry later
    (``retry_after`` seconds, sent as ``Retry-After`` with the 429)."""

    code = "SANDBOX_CAPACITY"

    def __init__(self, message: str, *, code: str | None = None, retry_after: int = 10) -> None:
        super().__init__(message, code=code)
        self.retry_after = retry_after


class SandboxQuotaError(SandboxCapacityError):
    """The caller (a user, or the owner named at creation) holds as many sandboxes as its
    share allows; release one or retry later."""

    code = "SANDBOX_QUOTA"


def error_classes() -> list[type[AgentScopeServerlessError]]:
    """Every error class of the project, its base first, subclasses after their class:
    walked on each call (it is short, and needed only for failures), so classes defined
    after the first call are found too."""
    found: list[type[AgentScopeServerlessError]] = []
    pending: list[type[AgentScopeServerlessError]] = [AgentScopeServerlessError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


__all__ = [
    "AgentError",
    "AgentScopeServerlessError",
    "AuthenticationError",
    "ConfigurationError",
    "ConflictError",
    "DeploymentError",
    "IdempotencyKeyReusedError",
    "InvalidInputError",
    "MessageIdConflictError",
    "MethodNotImplementedError",
    "NotFoundError",
    "PackagingError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RequestInProgressError",
    "RequestTimeoutError",
    "RunCanceledError",
    "RunNotEndedError",
    "SandboxAuthenticationError",
    "SandboxCapacityError",
    "SandboxError",
    "SandboxNotFoundError",
    "SandboxQuotaError",
    "SandboxRequestError",
    "SandboxUnavailableError",
    "ServiceNotStartedError",
    "SessionNotFoundError",
    "ShutdownError",
    "StartupError",
    "StoreUnavailableError",
    "TaskCapacityError",
    "TaskQuotaError",
    "TimeLimitError",
    "UnsupportedParameterError",
    "UploadNotAvailableError",
    "error_classes",
    "hook_name",
]
