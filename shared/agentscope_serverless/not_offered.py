"""What AgentScope Runtime 1.0.5 has that is not ported, and what to use instead.

Importing one of these names from the module AgentScope lists it in, or one of the modules
that held them, raises an ``ImportError`` saying so:

>>> from agentscope_serverless.deployers import KubernetesDeployManager
Traceback (most recent call last):
...
ImportError: KubernetesDeployManager (Kubernetes) is not offered: deploy to AWS Lambda with ...
"""

from __future__ import annotations

_DEPLOY = (
    "deploy to AWS Lambda with agentscope_serverless.deployers.SAMDeployManager, build an "
    "AgentRun or ModelStudio archive with agentscope_serverless.deployers.AgentRunDeployManager "
    "or ModelstudioDeployManager, or serve on this machine with "
    "agentscope_serverless.deployers.LocalDeployManager"
)
_MEMORY = (
    "keep long-term memory in agentscope_serverless.services.memory.RedisMemoryService (or "
    "InMemoryMemoryService)"
)
_CELERY = (
    "background tasks are AgentApp's @app.task routes, run without Celery "
    "(agentscope_serverless.app.AgentApp)"
)
_DETACHED = (
    "agentscope_serverless.deployers.LocalDeployManager serves an app in this process (stop() "
    "stops it), and agentscope_serverless.deployers.AgentRunDeployManager or "
    "ModelstudioDeployManager build an archive of a project"
)
_WHEEL = (
    "the AgentRun and ModelStudio deployers (agentscope_serverless.deployers."
    "AgentRunDeployManager, ModelstudioDeployManager) build their archives with "
    "agentscope_serverless.packaging"
)
_AGUI = (
    "an app serves /process (SSE), the OpenAI Responses and Chat Completions APIs and A2A "
    "itself (agentscope_serverless.app.AgentApp)"
)
_SANDBOX = (
    "the sandbox server runs 'base' and 'filesystem' sandboxes: use "
    "agentscope_serverless.sandbox.BaseSandbox or FilesystemSandbox (or their *Async forms), "
    "or connect them with agentscope_serverless.services.sandbox.SandboxService"
)

# Each name: (what it is, what to use instead).
NOT_OFFERED: dict[str, tuple[str, str]] = {
    "KubernetesDeployManager": ("Kubernetes", _DEPLOY),
    "K8sConfig": ("Kubernetes", _DEPLOY),
    "KnativeDeployManager": ("Knative", _DEPLOY),
    "FCDeployManager": ("Alibaba Cloud Function Compute", _DEPLOY),
    "PAIDeployManager": ("Alibaba Cloud PAI", _DEPLOY),
    "Mem0MemoryService": ("Mem0", _MEMORY),
    "ReMePersonalMemoryService": ("ReMe", _MEMORY),
    "ReMeTaskMemoryService": ("ReMe", _MEMORY),
    "TablestoreMemoryService": ("Tablestore", _MEMORY),
    "TablestoreSessionHistoryService": (
        "Tablestore",
        "keep session history in agentscope_serverless.services.session_history."
        "DynamoDBSessionHistoryService or RedisSessionHistoryService",
    ),
    "BaseApp": ("Celery task queues", _CELERY),
    "CeleryMixin": ("Celery task queues", _CELERY),
    "A2AFastAPIDefaultAdapter": (
        "A2A protocol adapter",
        "every app serves A2A itself, its agent card configured by a2a_config "
        "(agentscope_serverless.deployers.adapter.a2a.AgentCardWithRuntimeConfig)",
    ),
    "AGUIAdaptorConfig": ("AG-UI protocol adapter", _AGUI),
    "AGUIDefaultAdapter": ("AG-UI protocol adapter", _AGUI),
    "NacosRegistry": (
        "A2A registries",
        "every app serves A2A at its own URL, its agent card at /.well-known/agent-card.json, "
        "configured by agentscope_serverless.deployers.adapter.a2a.AgentCardWithRuntimeConfig",
    ),
    "ProcessManager": ("detached server processes", _DETACHED),
    "build_detached_app": ("detached-process projects", _DETACHED),
    "get_bundle_entry_script": ("detached-process projects", _DETACHED),
    "BrowserSandbox": ("browser sandboxes", _SANDBOX),
    "BrowserSandboxAsync": ("browser sandboxes", _SANDBOX),
    "GuiSandbox": ("GUI sandboxes", _SANDBOX),
    "GuiSandboxAsync": ("GUI sandboxes", _SANDBOX),
    "GUIMixin": ("GUI sandboxes", _SANDBOX),
    "AsyncGUIMixin": ("GUI sandboxes", _SANDBOX),
    "MobileSandbox": ("mobile sandboxes", _SANDBOX),
    "MobileSandboxAsync": ("mobile sandboxes", _SANDBOX),
    "TrainingSandbox": ("training sandboxes", _SANDBOX),
    "APPWorldSandbox": ("training sandboxes", _SANDBOX),
    "BFCLSandbox": ("training sandboxes", _SANDBOX),
    "CloudSandbox": ("cloud sandboxes", _SANDBOX),
    "AgentbaySandbox": ("AgentBay sandboxes", _SANDBOX),
    "DummySandbox": ("dummy sandboxes", _SANDBOX),
    "build_wheel": ("wheel bundles", _WHEEL),
    "generate_wrapper_project": ("wheel bundles", _WHEEL),
    "get_user_bundle_appdir": ("wheel bundles", _WHEEL),
}


def not_offered(name: str) -> ImportError:
    """The error importing ``name``, one of :data:`NOT_OFFERED`, raises."""
    what, instead = NOT_OFFERED[name]
    return ImportError(f"{name} ({what}) is not offered: {instead}", name=name)


def missing_name(module: str, name: str) -> Exception:
    """What a module's ``__getattr__`` raises for a ``name`` it does not have: the error of
    :func:`not_offered` for a name AgentScope has there, else an ``AttributeError``."""
    if name in NOT_OFFERED:
        return not_offered(name)
    return AttributeError(f"module {module!r} has no attribute {name!r}")


__all__ = ["NOT_OFFERED", "missing_name", "not_offered"]
