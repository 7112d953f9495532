"""Build an AgentRun archive (flat site-packages and ``agentrun.json``) and print its size.
Same as ``agentscope-serverless deploy agentrun ...``.

    .venv/bin/python deploy/agentrun.py --agent mypkg.agent:app --out dist/
"""

import os
from pathlib import Path


def main() -> None:
    os.environ.setdefault("AGENTSCOPE_PROJECT_ROOT", str(Path(__file__).resolve().parent.parent))
    from agentscope_serverless.deploy_cli import agentrun_app

    agentrun_app(prog_name="deploy/agentrun.py")


if __name__ == "__main__":
    main()
