"""``./scripts/run`` as a newcomer meets it: no root, no apt, a busy port, pasteable commands."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import PROJECT_ROOT
from tests.support.http import free_port, user_message, wait_until_healthy

RUN = PROJECT_ROOT / "scripts" / "run"
# What a user without root and without the sandbox tooling would not have.
HIDDEN_COMMANDS = {"bwrap", "apt-get", "apt", "sudo", "redis-server", "redis-cli"}


@pytest.fixture(scope="module")
def bare_path() -> Iterator[str]:
    """A PATH with every usual command but apt, sudo, bubblewrap and Redis, readable by all."""
    directory = Path(tempfile.mkdtemp(prefix="bare-path-"))
    directory.chmod(0o755)
    for source in ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        if not Path(source).is_dir():
            continue
        for entry in Path(source).iterdir():
            target = directory / entry.name
            if entry.name not in HIDDEN_COMMANDS and not target.exists():
                target.symlink_to(entry)
    yield str(directory)
    shutil.rmtree(directory)


NOBODY = 65534


@pytest.fixture(scope="module")
def nobody_clone() -> Iterator[Path]:
    """The repository's scripts with a ready virtualenv, owned by ``nobody``.

    As a user without root has it after their first ``./scripts/run``: their own clone and
    ``.venv``. The virtualenv is made with the system Python (this suite's interpreter may
    live where other users cannot reach) and sees the suite's installed packages.
    """
    system_python = Path("/usr/bin/python3")
    assert system_python.exists(), "the system Python is missing: apt-get install -y python3"
    version = subprocess.run(
        [system_python, "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert version == str(sys.version_info[:2]), "the system Python is not this suite's version"
    clone = Path(tempfile.mkdtemp(prefix="clone-of-nobody-"))
    shutil.copytree(PROJECT_ROOT / "scripts", clone / "scripts")
    shutil.copytree(PROJECT_ROOT / "requirements", clone / "requirements")
    shutil.copy(PROJECT_ROOT / "pyproject.toml", clone)
    venv = clone / ".venv"
    subprocess.run([system_python, "-m", "venv", "--without-pip", venv], check=True)
    suite_site = Path(sysconfig.get_paths()["purelib"])
    (
        venv
        / "lib"
        / f"python{sys.version_info[0]}.{sys.version_info[1]}"
        / "site-packages"
        / "suite.pth"
    ).write_text(f"import site; site.addsitedir({str(suite_site)!r})\n")
    (venv / "bin" / "uv").symlink_to(Path(sys.executable).parent / "uv")
    script = (Path(sys.executable).parent / "agentscope-serverless").read_text().split("\n", 1)[1]
    launcher = venv / "bin" / "agentscope-serverless"
    launcher.write_text(f"#!{venv / 'bin' / 'python'}\n{script}")
    launcher.chmod(0o755)
    locked = (clone / "requirements" / "dev.lock").read_bytes() + (
        clone / "pyproject.toml"
    ).read_bytes()
    (venv / ".lock-stamp").write_text(hashlib.sha256(locked).hexdigest() + "\n")
    for directory, _, files in os.walk(clone):
        os.chown(directory, NOBODY, NOBODY)
        for name in files:
            os.chown(os.path.join(directory, name), NOBODY, NOBODY, follow_symlinks=False)
    yield clone
    shutil.rmtree(clone)


def as_nobody(command: list[str], path: str) -> tuple[list[str], dict[str, str]]:
    """``command`` run as the unprivileged user ``nobody``, with ``path`` as its PATH."""
    setpriv = shutil.which("setpriv")
    assert setpriv is not None, "setpriv is missing: apt-get install -y util-linux"
    home = tempfile.mkdtemp(prefix="nobody-home-")
    os.chown(home, NOBODY, NOBODY)
    env = {"PATH": path, "HOME": home, "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1"}
    wrapper = [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]
    return [*wrapper, *command], env


def test_the_demo_runs_without_root_apt_or_bubblewrap(
    nobody_clone: Path, bare_path: str, tmp_path: Path
) -> None:
    port = free_port()
    run = str(nobody_clone / "scripts" / "run")
    command, env = as_nobody([run, "--port", str(port), "--log-level", "warning"], bare_path)
    output = tmp_path / "output.txt"
    output.touch(mode=0o666)
    with output.open("w") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process, timeout=60)
        banner = output.read_text()
        key = next(line for line in banner.splitlines() if line.startswith("ask_"))
        assert "installing" not in banner and "apt-get" not in banner
        assert httpx.get(f"{url}/").status_code == 200, "the chat page is served"
        body = {"input": [user_message("My name is Alice")], "stream": False}
        reply = httpx.post(
            f"{url}/process", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30
        )
        assert reply.status_code == 200
        assert "Alice" in reply.json()["output"][0]["content"][0]["text"]
        assert Path(f"/proc/{process.pid}").stat().st_uid == NOBODY, "the server runs as nobody"
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
    assert "Traceback" not in output.read_text(), output.read_text()
    assert code in (0, 128 + signal.SIGTERM, -signal.SIGTERM)


def test_an_agent_of_ones_own_runs_without_root_saying_how_to_set_up_sandboxes(
    nobody_clone: Path, bare_path: str, tmp_path: Path
) -> None:
    # Only an agent whose name held "sandbox" got bubblewrap set up: another one using
    # sandboxes met its absence at its first sandbox.
    port = free_port()
    run = str(nobody_clone / "scripts" / "run")
    agent = ["--agent", "agentscope_serverless.agents.demo:app"]
    command, env = as_nobody([run, *agent, "--port", str(port)], bare_path)
    output = tmp_path / "output.txt"
    output.touch(mode=0o666)
    with output.open("w") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", process, timeout=60)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    printed = output.read_text()
    assert "sudo apt-get update && sudo apt-get install -y bubblewrap" in printed, printed
    assert "sandboxes on the embedded sandbox server" in printed


def test_the_stack_without_redis_or_root_prints_the_command_to_run(
    nobody_clone: Path, bare_path: str
) -> None:
    port = free_port()
    run = str(nobody_clone / "scripts" / "run")
    command, env = as_nobody([run, "--stack", "--port", str(port)], bare_path)
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1
    assert "sudo apt-get update && sudo apt-get install -y redis-server" in done.stderr
    assert "--stack" in done.stderr
    assert "ask_" not in done.stdout + done.stderr, "no key before the stack can run"


def test_a_taken_port_fails_before_any_key_is_printed() -> None:
    with socket.socket() as taken, socket.socket() as next_one:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with contextlib.suppress(OSError):  # the next port is taken too: not suggested
            next_one.bind(("127.0.0.1", port + 1))
            next_one.listen()
        done = subprocess.run(
            [str(RUN), "--port", str(port)], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2
        assert f"port {port} on 127.0.0.1 is already in use" in done.stderr
        suggested = int(re.search(r"e\.g\. --port (\d+)", done.stderr)[1])  # type: ignore[index]
        assert suggested > port + 1
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", suggested))  # free, as said
    assert "ask_" not in done.stdout + done.stderr


def test_printed_commands_run_when_pasted_from_the_repo_root(tmp_path: Path) -> None:
    port = free_port()
    output = tmp_path / "output.txt"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PATH"] = os.pathsep.join(
        p for p in env["PATH"].split(os.pathsep) if not Path(p, "agentscope-serverless").exists()
    )
    with output.open("w") as sink:
        process = subprocess.Popen(
            [str(RUN), "--port", str(port), "--log-level", "warning"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process, timeout=60)
        lines = output.read_text().splitlines()
        commands = [line for line in lines if line.startswith(("curl ", ".venv/", "agentscope"))]
        assert len(commands) == 3
        for line in commands:
            if "chat" in line.split()[:2]:
                line += " </dev/null"  # the chat reads from the terminal until end of input
            done = subprocess.run(
                ["bash", "-c", line], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True
            )
            assert done.returncode == 0, (line, done.stderr)
        assert commands[2].startswith(".venv/bin/agentscope-serverless chat ")
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_a_busy_apt_is_waited_for_with_a_message(tmp_path: Path) -> None:
    lock = tmp_path / "lock-frontend"
    lock.touch()
    with lock.open("r+") as held:
        fcntl.lockf(held, fcntl.LOCK_EX)  # as dpkg holds it while it works
        done = subprocess.run(
            [str(PROJECT_ROOT / "scripts" / "bootstrap"), "debian", "a test", "no-such-command"],
            capture_output=True,
            text=True,
            env={**os.environ, "APT_LOCK_FILES": str(lock), "APT_LOCK_WAIT_SECONDS": "2"},
            timeout=60,
        )
    assert "installing the Debian packages no-such-command (a test)" in done.stdout
    assert "another apt or dpkg process is running; waiting for it to finish" in done.stdout
    assert done.returncode == 1 and "apt is still busy" in done.stderr


def test_the_key_hint_of_a_key_file_server_runs_when_pasted(tmp_path: Path) -> None:
    port = free_port()
    output = tmp_path / "output.txt"
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "AUTH_KEYS_BACKEND": "file",
        "AUTH_KEYS_FILE": str(tmp_path / "keys.json"),
    }
    with output.open("w") as sink:
        process = subprocess.Popen(
            [str(RUN), "--port", str(port), "--log-level", "warning"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", process, timeout=60)
    finally:
        process.terminate()
        process.wait(timeout=30)
    banner = output.read_text()
    assert "ask_" not in banner
    hint = banner.split("make one with: ", 1)[1].split(")", 1)[0]
    done = subprocess.run(
        ["bash", "-c", hint], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "ask_" in done.stdout


def test_run_from_a_project_folder_takes_paths_from_there(tmp_path: Path) -> None:
    """Run from the user's own folder, a relative ``--app-dir`` and the printed commands are
    the user's folder's, not the checkout's."""
    caller = tmp_path / "work"
    package = caller / "projects" / "mine" / "mine"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "agent.py").write_text(
        "from agentscope_serverless.app import AgentApp\n\n"
        'app = AgentApp(app_name="mine")\n\n\n'
        '@app.query(framework="text")\n'
        "async def query(self, msgs, **kwargs):\n"
        '    yield "mine says hi"\n'
    )
    port = free_port()
    output = tmp_path / "output.txt"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PATH"] = os.pathsep.join(
        p for p in env["PATH"].split(os.pathsep) if not Path(p, "agentscope-serverless").exists()
    )
    command = [str(RUN), "--port", str(port), "--log-level", "warning"]
    command += ["--app-dir", "projects/mine", "--agent", "mine.agent:app"]
    with output.open("w") as sink:
        process = subprocess.Popen(
            command, cwd=caller, stdout=sink, stderr=subprocess.STDOUT, env=env
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process, timeout=60)
        lines = output.read_text().splitlines()
        [chat] = [line for line in lines if " chat --url " in line]
        done = subprocess.run(
            ["bash", "-c", f"{chat} </dev/null"],
            cwd=caller,
            env=env,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, (chat, done.stderr)
        key = next(line for line in lines if line.startswith("ask_"))
        body = {"input": [user_message("hello")], "stream": False}
        reply = httpx.post(
            f"{url}/process", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30
        )
        assert reply.json()["output"][0]["content"][0]["text"] == "mine says hi"
    finally:
        if process.poll() is None:
            process.terminate()
        process.wait(timeout=30)
    assert "Traceback" not in output.read_text(), output.read_text()
