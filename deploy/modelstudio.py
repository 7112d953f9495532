"""Build a ModelStudio archive (wheels, ``requirements.txt``, ``deploy_starter/``) and print
its size. Same as ``agentscope-serverless deploy modelstudio ...``.

    .venv/bin/python deploy/modelstudio.py --agent mypkg.agent:app --out dist/
"""

import os
from pathlib import Path


def main() -> None:
    os.environ.setdefault("AGENTSCOPE_PROJECT_ROOT", str(Path(__file__).resolve().parent.parent))
    from agentscope_serverless.deploy_cli import modelstudio_app

    modelstudio_app(prog_name="deploy/modelstudio.py")


if __name__ == "__main__":
    main()
