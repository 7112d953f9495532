"""``SAMDeployManager``: build the SAM stack and, with AWS credentials, deploy it.

>>> manager = SAMDeployManager(project_root=".", stack_name="my-agent")
>>> # info = await manager.deploy()
>>> # info["url"]  -> the ProcessUrl output (None when nothing was deployed)

Without credentials (botocore's credential chain finds none) the manager stops after
``sam validate --lint`` and ``sam build`` and says so: ``deployed`` is False, ``url`` None,
``build_dir`` the built stack and ``reason`` why nothing was deployed. That way the same call
checks a stack offline (in CI) and deploys it on a machine with an AWS profile.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from agentscope_serverless.deployers.base import (
    DeployManager,
    default_project_root,
    import_path_of,
)

if TYPE_CHECKING:
    from agentscope_serverless.packaging.archives import Progress

URL_OUTPUTS = ("ProcessUrl", "SessionsUrl", "MemoryUrl", "StateUrl", "SandboxUrl")
NO_CREDENTIALS = (
    "no AWS credentials found (environment, shared files, SSO or roles): built only; "
    "configure credentials (for example `aws configure`) to deploy"
)


def _sam() -> ModuleType:
    """The SAM steps: packaging code, which a deployed runtime (the Lambda layer) leaves out,
    imported when deploying only (an agent module imports its deployer beside its app)."""
    from agentscope_serverless.packaging import sam

    return sam


class SAMDeployManager(DeployManager):
    """Deploys the project in ``project_root`` (its code and ``requirements.txt``, serving
    ``agent``) with this package's ``template.yaml`` as the CloudFormation stack ``stack_name``.
    Without ``project_root``, the project is the working directory, or that of the app given
    to :meth:`deploy` (:func:`~agentscope_serverless.deployers.base.default_project_root`).

    ``parameters`` are the template's parameters (``{"FunctionUrlAuthType": "NONE", ...}``);
    ``region`` defaults to the AWS SDK's (``AWS_REGION`` or the profile); ``progress`` is
    called with a line for each step.
    """

    def __init__(
        self,
        project_root: str | Path | None = None,
        stack_name: str = "agentscope-serverless",
        parameters: dict[str, str] | None = None,
        *,
        build_dir: str | Path | None = None,
        region: str | None = None,
        progress: Progress | None = None,
        agent: str | None = None,
    ) -> None:
        super().__init__()
        self._root_given = project_root is not None
        self.project_root = Path(project_root or ".").resolve()
        self.agent = agent
        self.stack_name = stack_name
        self.parameters = dict(parameters or {})
        self.build_dir = Path(build_dir) if build_dir is not None else None
        self.region = region
        self.progress = progress or (lambda _line: None)
        self.outputs: dict[str, str] = {}
        self._deployed = False

    async def deploy(self, *args: Any, app: Any = None, **kwargs: Any) -> dict[str, Any]:
        """Validate, build and (with credentials) deploy; return where the stack is.

        ``app`` (as ``app.deploy(manager)`` gives it: the AgentApp of a module of the
        project, or ``module:attribute``) is the agent to serve, in place of ``agent``; none
        (nor an ``AgentApp`` parameter): the demo agent, for a project with no code of its own.

        Returns ``deploy_id``, ``url`` (the ``ProcessUrl`` output, or None), ``urls`` (every
        Function URL output by name), ``outputs``, ``deployed``, ``build_dir``, ``stack_name``
        and, when nothing was deployed, ``reason``. Failures raise
        :class:`~agentscope_serverless.errors.PackagingError`, and
        :class:`~agentscope_serverless.errors.ConfigurationError`, before anything is built,
        when no app is named for a project of its own
        (:func:`~agentscope_serverless.deployers.archive.refuse_missing_app`).
        """
        if args or kwargs:
            raise TypeError(
                "SAMDeployManager.deploy takes only app: configure the manager (stack name, "
                "parameters, region...)"
            )
        if app is not None:
            if not self._root_given:
                self.project_root = await asyncio.to_thread(default_project_root, app)
            self.agent = import_path_of(app, self.project_root)
        return await asyncio.to_thread(self.deploy_sync)

    def deploy_sync(self) -> dict[str, Any]:
        """The blocking twin of :meth:`deploy`."""
        from agentscope_serverless.deployers.archive import refuse_missing_app
        from agentscope_serverless.packaging.project import secrets_left_out

        sam = _sam()
        # Before a build they would make useless.
        sam.check_stack_name(self.stack_name)
        sam.check_parameters(self.parameters)
        if self.agent is None and "AgentApp" not in self.parameters:
            refuse_missing_app(
                self.project_root,
                (self.build_dir or self.project_root / sam.DEFAULT_BUILD_DIR).resolve(),
                give="agent='module:attribute' (or deploy(app=...))",
                built="stack",
            )
        self.progress("validating template.yaml (sam validate --lint)")
        sam.validate(self.project_root)
        self.progress("building every function and the shared layer (sam build)")
        built = sam.build(self.project_root, build_dir=self.build_dir, agent=self.agent)
        info: dict[str, Any] = {
            "deploy_id": None,
            "url": None,
            "urls": {},
            "outputs": {},
            "deployed": False,
            "build_dir": str(built),
            "stack_name": self.stack_name,
            # The project's secrets the layer was built without (to give the functions
            # otherwise, if the agent needs them).
            "left_out": secrets_left_out(self.project_root),
        }
        if not sam.has_credentials():
            info["reason"] = NO_CREDENTIALS
            return info
        self.progress(f"deploying the stack {self.stack_name} (sam deploy)")
        outputs = sam.deploy(
            self.project_root,
            self.stack_name,
            parameters=self.parameters,
            build_dir=built,
            region=self.region,
        )
        self.outputs = outputs
        self._deployed = True
        self.deploy_id = f"{self.stack_name}-{uuid.uuid4().hex[:8]}"
        self._service_url = outputs.get("ProcessUrl")
        urls = {name: outputs[name] for name in URL_OUTPUTS if name in outputs}
        info.update(
            deploy_id=self.deploy_id,
            url=self._service_url,
            urls=urls,
            outputs=outputs,
            deployed=True,
        )
        return info

    async def stop(self, deploy_id: str | None = None, **kwargs: Any) -> None:
        """Delete the stack this manager deployed (tables are retained); else nothing."""
        if self._deployed:
            await asyncio.to_thread(
                _sam().delete, self.project_root, self.stack_name, region=self.region
            )
        self._deployed = False
        self._service_url = None

    @property
    def is_running(self) -> bool:
        return self._deployed


__all__ = ["SAMDeployManager"]
