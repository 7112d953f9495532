"""A sandbox's folder is deleted whole on release, whatever the sandbox left in it."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.conftest import PROJECT_ROOT

NOBODY = 65534

MAKE_AND_REMOVE = """
import os, sys
from pathlib import Path
from agentscope_serverless.sandbox_server.jail import remove_tree

sandbox = Path(sys.argv[1])
(sandbox / "locked").mkdir(parents=True)
(sandbox / "locked" / "kept.txt").write_text("left by the sandbox")
(sandbox / "locked" / "inner").mkdir()
os.chmod(sandbox / "locked" / "inner", 0)
os.symlink("/etc", sandbox / "locked" / "etc")
os.chmod(sandbox / "locked", 0o500)  # as `chmod 500 locked` in a sandbox
remove_tree(sandbox)
print(os.path.lexists(sandbox))
"""


def test_a_folder_the_sandbox_made_read_only_is_deleted_by_a_server_that_is_not_root() -> None:
    # A server that is not root runs its sandboxes as its own user (weaker isolation): what
    # they lock, it must unlock to delete. Run as nobody here when the tests run as root
    # (in a folder nobody reaches: pytest's own are the user's alone).
    root = Path(tempfile.mkdtemp(prefix="remove-tree-"))
    root.chmod(0o777)
    try:
        result = _make_and_remove(root / "sandbox")
    finally:
        subprocess.run(["rm", "-rf", "--", str(root)], check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
    assert Path("/etc").stat().st_mode & 0o777 == 0o755  # the link was not followed


def _make_and_remove(sandbox: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", MAKE_AND_REMOVE, str(sandbox)]
    if os.geteuid() == 0:
        command = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *command]
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(PROJECT_ROOT / "shared")}
    return subprocess.run(command, capture_output=True, text=True, env=env, check=False)
