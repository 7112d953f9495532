"""Run metrics for CloudWatch, as Embedded Metric Format (EMF) lines on stdout.

With ``METRICS_NAMESPACE`` set (the stack sets ``AgentScopeServerless``), each run of the
agent that ends writes one JSON line, which CloudWatch Logs turns into metrics: no client,
no API call, nothing added to the run's latency. Unset (the local server), nothing is
written.

- ``Runs`` (Count); ``RunDuration`` (Milliseconds, from the run's start, before its
  session is read, to its end); ``TimeToFirstToken`` (Milliseconds, from the same start to
  the agent's first piece of text, for a run whose agent produced any, whether its client
  got it at once or in a reply not streamed, sent whole at the end); ``PromptTokens`` and
  ``CompletionTokens`` (Count, when the agent reports usage: ``prompt_tokens`` and
  ``completion_tokens``, or ``input_tokens`` and ``output_tokens``).
- Dimensions: ``Service`` (``POWERTOOLS_SERVICE_NAME``), and ``Service``, ``Kind``
  (``process``, ``openai``, ``a2a``) and ``Status`` (``completed``, ``failed``,
  ``canceled``).

A request answered with a server error (a 5xx: a store down before the run begins, an
error no handler maps, a run failed in a reply not streamed) writes one line of its own:
``Errors`` (Count), by ``Service``, and by ``Service`` and ``Code``, the error code it was
answered with when it is one of the runtime's own (a code of its error classes:
:func:`agentscope_serverless.errors.error_classes`, or of :data:`RUNTIME_ERROR_CODES`, such
as ``AGENT_UNKNOWN_ERROR`` for a run the agent failed), else ``OTHER`` (an agent's code, or
none): the dimension takes a bounded set of values, whatever the agent or the client sends.

A line names no user, session or run: metrics are per service, not per person.

>>> line = emf_line("AgentScopeServerless", {"Kind": "process", "Status": "completed"},
...                 {"Runs": (1, "Count")}, timestamp_ms=0)
>>> json.loads(line)["Runs"]
1
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeGuard

from agentscope_serverless import errors
from agentscope_serverless.log import SERVICE

SERVICE_DIMENSION = "Service"
# The Code of an error whose code is none of the runtime's own (or that has none).
OTHER_ERROR_CODE = "OTHER"
# The runtime's codes that are no error class's: of a run the agent failed
# (``runner.AGENT_UNKNOWN_ERROR``, the built-in LLM agent's), of a request the application did
# not answer (``http.errors.INTERNAL_ERROR``) and of a function or server that could not start.
RUNTIME_ERROR_CODES = frozenset(
    {
        "AGENT_UNKNOWN_ERROR",
        "AGENT_MAX_ITERATIONS",
        "LLM_ERROR",
        "LLM_UNAVAILABLE",
        "INTERNAL_ERROR",
        "UNAVAILABLE",
    }
)


def error_code_dimension(code: str | None) -> str:
    """The value of the ``Code`` dimension for an answer with the error code ``code``.

    >>> error_code_dimension("STORE_UNAVAILABLE"), error_code_dimension("AGENT_UNKNOWN_ERROR")
    ('STORE_UNAVAILABLE', 'AGENT_UNKNOWN_ERROR')
    >>> error_code_dimension("user 42 failed")
    'OTHER'
    """
    if code is None:
        return OTHER_ERROR_CODE
    if code in RUNTIME_ERROR_CODES or any(cls.code == code for cls in errors.error_classes()):
        return code
    return OTHER_ERROR_CODE


def emf_line(
    namespace: str,
    dimensions: Mapping[str, str],
    values: Mapping[str, tuple[float, str]],
    *,
    timestamp_ms: int | None = None,
) -> str:
    """One EMF record: ``values`` (name: (value, unit)) under ``namespace``, by the service
    alone and by the service with every one of ``dimensions``."""
    names = [SERVICE_DIMENSION, *dimensions]
    record: dict[str, object] = {
        "_aws": {
            "Timestamp": int(time.time() * 1000) if timestamp_ms is None else timestamp_ms,
            "CloudWatchMetrics": [
                {
                    "Namespace": namespace,
                    "Dimensions": [[SERVICE_DIMENSION], names],
                    "Metrics": [{"Name": name, "Unit": unit} for name, (_, unit) in values.items()],
                }
            ],
        },
        SERVICE_DIMENSION: SERVICE,
        **dimensions,
        **{name: value for name, (value, _) in values.items()},
    }
    return json.dumps(record, separators=(",", ":"))


@dataclass(frozen=True)
class RunMetrics:
    """Writes the metrics of runs that end, and of requests answered with a server error, to
    stdout, under ``namespace``."""

    namespace: str

    def run_ended(
        self,
        *,
        kind: str,
        status: str,
        duration_s: float,
        first_token_s: float | None,
        usage: Mapping[str, object] | None,
    ) -> None:
        """Write the metrics of one run."""
        values: dict[str, tuple[float, str]] = {
            "Runs": (1, "Count"),
            "RunDuration": (round(duration_s * 1000, 3), "Milliseconds"),
        }
        if first_token_s is not None:
            values["TimeToFirstToken"] = (round(first_token_s * 1000, 3), "Milliseconds")
        counts = usage or {}
        # Named as chat completions count them, or as the Responses API does (as the
        # OpenAI-compatible routes read them).
        for keys, name in (
            (("prompt_tokens", "input_tokens"), "PromptTokens"),
            (("completion_tokens", "output_tokens"), "CompletionTokens"),
        ):
            given = (counts.get(key) for key in keys)
            count = next((value for value in given if _is_count(value)), None)
            if count is not None:
                values[name] = (count, "Count")
        self._write(emf_line(self.namespace, {"Kind": kind, "Status": status}, values))

    def request_failed(self, *, code: str | None) -> None:
        """Write the metric of one request answered with a server error (a 5xx) whose error
        code is ``code`` (None: it had none)."""
        dimensions = {"Code": error_code_dimension(code)}
        self._write(emf_line(self.namespace, dimensions, {"Errors": (1, "Count")}))

    @staticmethod
    def _write(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def run_metrics(namespace: str | None) -> RunMetrics | None:
    """The metrics writer of ``METRICS_NAMESPACE`` (None when unset)."""
    return RunMetrics(namespace) if namespace else None


__all__ = [
    "OTHER_ERROR_CODE",
    "RUNTIME_ERROR_CODES",
    "RunMetrics",
    "emf_line",
    "error_code_dimension",
    "run_metrics",
]
