"""AgentScope Runtime 1.0.5's public API, read from the listing beside this file.

``agentscope-runtime-1.0.5-api.md`` was produced by importing each module of an installed
``agentscope-runtime==1.0.5`` and printing its public names with ``inspect.signature``. This
module parses it into :class:`Entry` objects (a module's names, their parameters, their
methods) and says which of them are in our porting scope.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path

LISTING = Path(__file__).with_name("agentscope-runtime-1.0.5-api.md")
ENGINE = "agentscope_runtime.engine"

Kind = inspect._ParameterKind


@dataclass(frozen=True)
class Param:
    name: str
    kind: Kind
    has_default: bool


@dataclass
class Method:
    name: str
    is_async: bool
    params: list[Param] | None  # None for a property


@dataclass
class Entry:
    module: str  # the reference module the name is listed under
    name: str
    kind: str  # "class", "def" or "lazy"
    params: list[Param] | None
    defined_in: str | None
    methods: list[Method] = field(default_factory=list)


@dataclass
class Listing:
    modules: list[str]
    entries: list[Entry]


_ENTRY = re.compile(r"^- (class|def) (\w+)\((.*)$")
_LAZY = re.compile(r"^- (\w+)  \(lazy; needs an optional extra\)$")
_METHOD = re.compile(r"^  - (async )?(\w+)\((.*)$")
_PROPERTY = re.compile(r"^  - property (\w+)$")
_DEFINED_IN = re.compile(r"\s+\[defined in ([\w.]+)\]$")
_OPEN, _CLOSE = "([{<", ")]}>"


def _split_call(rest: str) -> tuple[str, str]:
    """``rest`` starts right after a ``(``: the text up to its matching ``)``, and after."""
    depth, quote = 0, ""
    for i, char in enumerate(rest):
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in _OPEN:
            depth += 1
        elif char in _CLOSE:
            if depth == 0 and char == ")":
                return rest[:i], rest[i + 1 :]
            depth -= 1
    raise ValueError(f"unbalanced signature: {rest!r}")


def _split_params(text: str) -> list[str]:
    parts, depth, quote, start = [], 0, "", 0
    for i, char in enumerate(text):
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in _OPEN:
            depth += 1
        elif char in _CLOSE:
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    tail = text[start:].strip()
    if tail:
        parts.append(tail)
    return parts


def parse_params(text: str) -> list[Param]:
    """The parameters of a printed signature (without the parentheses)."""
    params: list[Param] = []
    kind = Kind.POSITIONAL_OR_KEYWORD
    for part in _split_params(text):
        if part == "*":
            kind = Kind.KEYWORD_ONLY
            continue
        if part == "/":
            params = [Param(p.name, Kind.POSITIONAL_ONLY, p.has_default) for p in params]
            continue
        head = re.split(r"[:=]", part, maxsplit=1)[0].strip()
        if head.startswith("**"):
            params.append(Param(head[2:], Kind.VAR_KEYWORD, False))
        elif head.startswith("*"):
            params.append(Param(head[1:], Kind.VAR_POSITIONAL, False))
            kind = Kind.KEYWORD_ONLY
        else:
            params.append(Param(head, kind, _has_default(part)))
    return params


def _has_default(part: str) -> bool:
    depth, quote = 0, ""
    for char in part:
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in _OPEN:
            depth += 1
        elif char in _CLOSE:
            depth -= 1
        elif char == "=" and depth == 0:
            return True
    return False


def parse(text: str | None = None) -> Listing:
    """Every module and entry of the listing."""
    text = LISTING.read_text() if text is None else text
    modules: list[str] = []
    entries: list[Entry] = []
    module = ""
    for line in text.splitlines():
        if line.startswith("## "):
            module = line[3:].strip()
            modules.append(module)
            continue
        if not module:
            continue
        if match := _LAZY.match(line):
            entries.append(Entry(module, match[1], "lazy", None, None))
        elif match := _ENTRY.match(line):
            inside, after = _split_call(match[3])
            defined = _DEFINED_IN.search(after)
            entries.append(
                Entry(module, match[2], match[1], parse_params(inside), defined and defined[1])
            )
        elif match := _METHOD.match(line):
            inside, _ = _split_call(match[3])
            entries[-1].methods.append(Method(match[2], bool(match[1]), parse_params(inside)))
        elif match := _PROPERTY.match(line):
            entries[-1].methods.append(Method(match[1], False, None))
    return Listing(modules, entries)


# Out of our porting scope, with the reason (README, "Porting from AgentScope Runtime").
OUT_OF_SCOPE_MODULES = {
    f"{ENGINE}.app.base_app": "Celery task queues",
}
OUT_OF_SCOPE_NAMES = {
    **dict.fromkeys(
        ["KubernetesDeployManager", "KnativeDeployManager", "K8sConfig"], "Kubernetes/Knative"
    ),
    "FCDeployManager": "Function Compute deployer",
    "PAIDeployManager": "PAI deployer",
    **dict.fromkeys(["TablestoreSessionHistoryService", "TablestoreMemoryService"], "Tablestore"),
    "Mem0MemoryService": "Mem0",
    **dict.fromkeys(["ReMePersonalMemoryService", "ReMeTaskMemoryService"], "ReMe"),
    "NacosRegistry": "Nacos",
    **dict.fromkeys(["BaseApp", "CeleryMixin"], "Celery task queues"),
    **dict.fromkeys(
        [
            "A2AFastAPIDefaultAdapter",
            "AGUIAdaptorConfig",
            "AGUIDefaultAdapter",
        ],
        "A2A and AG-UI protocol adapters (every app serves A2A)",
    ),
    **dict.fromkeys(
        [
            "ProcessManager",
            "build_detached_app",
            "get_bundle_entry_script",
            "build_wheel",
            "generate_wrapper_project",
            "get_user_bundle_appdir",
        ],
        "AgentScope's detached-process and wheel-bundle internals (our archives: packaging)",
    ),
}
OUT_OF_SCOPE_METHODS = {
    "create_detached_project": "AgentScope's detached-process projects",
}
# Names AgentScope's engine modules import from its sandbox package: they belong to
# ``agentscope_serverless.sandbox`` (the sandbox half of the port), not to these modules.
SANDBOX_PACKAGE = "agentscope_runtime.sandbox"


def in_scope(entry: Entry) -> bool:
    if entry.module in OUT_OF_SCOPE_MODULES or entry.name in OUT_OF_SCOPE_NAMES:
        return False
    return not (entry.defined_in or "").startswith(SANDBOX_PACKAGE)


def our_module(reference_module: str) -> str:
    """The porting rule: ``agentscope_runtime.engine.X`` -> ``agentscope_serverless.X``."""
    if reference_module == ENGINE:
        return "agentscope_serverless"
    if reference_module.startswith(ENGINE + "."):
        return "agentscope_serverless." + reference_module[len(ENGINE) + 1 :]
    if reference_module.startswith("agentscope_runtime."):
        return "agentscope_serverless." + reference_module[len("agentscope_runtime.") :]
    raise ValueError(reference_module)


# Parameters named differently for the same thing, in the same position: AgentScope 1.0.5's
# ``SandboxService.connect(session_id, user_id, sandbox_types)`` and the seeds'
# ``connect(session_id, user_id, env_types, tools)`` (we take both names).
SAME_PARAMETER = {"sandbox_types": "env_types"}


def incompatibilities(reference: list[Param], ours: inspect.Signature) -> list[str]:
    """Why a call written for ``reference`` would not bind to ``ours`` (empty: it would).

    Every reference parameter exists in ours (by name, at the same position when it can be
    passed positionally, or through ``**kwargs``); ``*args``/``**kwargs`` are kept; ours
    requires nothing the reference does not.
    """
    ref = [p for p in reference if p.name not in ("self", "cls")]
    our_params = [p for p in ours.parameters.values() if p.name not in ("self", "cls")]
    by_name = {p.name: p for p in our_params}
    our_positional = [
        p.name for p in our_params if p.kind in (Kind.POSITIONAL_ONLY, Kind.POSITIONAL_OR_KEYWORD)
    ]
    has_var_kw = any(p.kind is Kind.VAR_KEYWORD for p in our_params)
    has_var_pos = any(p.kind is Kind.VAR_POSITIONAL for p in our_params)
    problems: list[str] = []
    positional_index = 0
    for param in ref:
        if param.kind is Kind.VAR_POSITIONAL:
            if not has_var_pos:
                problems.append(f"no *{param.name}")
            continue
        if param.kind is Kind.VAR_KEYWORD:
            if not has_var_kw:
                problems.append(f"no **{param.name}")
            continue
        if param.kind in (Kind.POSITIONAL_ONLY, Kind.POSITIONAL_OR_KEYWORD):
            at = (
                our_positional[positional_index] if positional_index < len(our_positional) else None
            )
            if at not in (param.name, SAME_PARAMETER.get(param.name)) and not (
                at is None and has_var_pos and param.name in by_name
            ):
                problems.append(
                    f"positional parameter {positional_index} is {at!r}, not {param.name!r}"
                )
            positional_index += 1
            continue
        if param.name not in by_name and not has_var_kw:
            problems.append(f"no parameter {param.name!r}")
        elif param.name in by_name and by_name[param.name].kind is Kind.POSITIONAL_ONLY:
            problems.append(f"{param.name!r} is positional-only")
    ref_names = {p.name: p for p in ref}
    for p in our_params:
        required = p.default is inspect.Parameter.empty and p.kind not in (
            Kind.VAR_POSITIONAL,
            Kind.VAR_KEYWORD,
        )
        if required and (p.name not in ref_names or ref_names[p.name].has_default):
            problems.append(f"{p.name!r} is required here but not in the reference")
    return problems
