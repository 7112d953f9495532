"""The AWS SAM stack: ``validate``, ``build``, ``deploy --stack-name NAME [--param K=V]``,
``functions`` (JSON). Same as ``agentscope-serverless deploy sam ...``.

    .venv/bin/python deploy/sam.py build
"""

import os
from pathlib import Path


def main() -> None:
    os.environ.setdefault("AGENTSCOPE_PROJECT_ROOT", str(Path(__file__).resolve().parent.parent))
    from agentscope_serverless.deploy_cli import sam_app

    sam_app(prog_name="deploy/sam.py")


if __name__ == "__main__":
    main()
