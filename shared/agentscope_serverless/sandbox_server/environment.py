"""What a sandbox is created with beyond its type: ``create``'s environment variables, and
the statuses ``get_status`` reports."""

from __future__ import annotations

import re

from agentscope_serverless.errors import SandboxRequestError

MAX_ENVIRONMENT_VARIABLES = 64
MAX_ENVIRONMENT_BYTES = 64 * 1024
ENVIRONMENT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# Variables the jail sets itself; a sandbox's environment cannot change them.
RESERVED_ENVIRONMENT = frozenset({"PATH", "HOME", "USER", "LOGNAME"})
# The dynamic loader's variables (LD_PRELOAD, LD_AUDIT, LD_LIBRARY_PATH...): prlimit gets the
# environment too, and would load a library of the workspace before it sets the limits.
LOADER_PREFIX = "LD_"
RUNNING = "running"
EXITED = "exited"


def check_environment(environment: dict[str, str] | None) -> dict[str, str]:
    """The variables a ``create`` call sets in its sandbox, checked.

    >>> check_environment({"GREETING": "hi"})
    {'GREETING': 'hi'}
    >>> check_environment({"PATH": "/evil"})
    Traceback (most recent call last):
    ...
    agentscope_serverless.errors.SandboxRequestError: environment variable PATH is reserved
    """
    environment = dict(environment or {})
    if len(environment) > MAX_ENVIRONMENT_VARIABLES:
        raise SandboxRequestError(
            f"environment has more than {MAX_ENVIRONMENT_VARIABLES} variables"
        )
    for name, value in environment.items():
        if not ENVIRONMENT_NAME.fullmatch(name):
            raise SandboxRequestError(f"environment variable name {name[:128]!r} is not valid")
        if name in RESERVED_ENVIRONMENT:
            raise SandboxRequestError(f"environment variable {name} is reserved")
        if name.startswith(LOADER_PREFIX):
            raise SandboxRequestError(
                f"environment variable {name} is not accepted: the dynamic loader would load "
                "code of the sandbox before its limits are set; set it in the command that "
                f"needs it ({name}=... command)"
            )
        if "\x00" in value:
            raise SandboxRequestError(f"environment variable {name} contains a NUL character")
        if not value.isascii() and LONE_SURROGATE.search(value):
            raise SandboxRequestError(
                f"environment variable {name} is not Unicode text (it holds a lone surrogate)"
            )
    size = sum(len(name) + len(value.encode()) for name, value in environment.items())
    if size > MAX_ENVIRONMENT_BYTES:
        raise SandboxRequestError(f"environment is larger than {MAX_ENVIRONMENT_BYTES} bytes")
    return environment


__all__ = ["EXITED", "RUNNING", "check_environment"]
