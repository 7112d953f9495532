"""The README runs as pasted.

Every ``python`` and ``bash`` block of the README carries a marker on the line above it:
``<!-- runnable -->`` blocks run here against a server this test starts (its printed key in
place of ``ask_...``, its address in place of ``127.0.0.1:8090``), and a ``<!-- output -->``
``text`` block right after one is what it must print; ``<!-- syntax-only: why -->`` blocks
(AWS deploys, servers that run until stopped) are only parsed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT
from tests.support.http import free_port, wait_until_healthy
from tests.support.sandbox_server import RunningServer

README = PROJECT_ROOT / "README.md"
SCRIPT = str(Path(sys.executable).parent / "agentscope-serverless")
README_ADDRESS = "127.0.0.1:8090"
README_KEY = "ask_..."
CHECKED_LANGUAGES = {"python", "bash", "sh", "shell"}
FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"^<!--\s*(runnable|syntax-only|output)\b.*-->\s*$")


@dataclass(frozen=True)
class Block:
    language: str
    marker: str | None
    line: int
    code: str

    def __str__(self) -> str:
        return f"README line {self.line} ({self.language}, {self.marker or 'unmarked'})"


def blocks(markdown: str) -> list[Block]:
    """The fenced code blocks of ``markdown`` with the marker of the line above each."""
    found: list[Block] = []
    lines = markdown.splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        above = lines[index - 1] if index else ""
        marked = MARKER.match(above)
        end = index + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        code = "\n".join(lines[index + 1 : end]) + "\n"
        language = opening.group(1) or "text"
        found.append(Block(language, marked.group(1) if marked else None, index + 1, code))
        index = end + 1
    return found


@dataclass(frozen=True)
class Target:
    """Where the runnable blocks go: the server, its key, the sandbox server, a home."""

    url: str
    key: str
    sandbox: RunningServer
    home: Path

    def environment(self) -> dict[str, str]:
        return {
            **os.environ,
            "HOME": str(self.home),
            "AGENTSCOPE_URL": self.url,
            # Exported by the README's first example, as a reader's shell would keep it.
            "AGENTSCOPE_API_KEY": self.key,
            "SANDBOX_BASE_URL": self.sandbox.url,
            "SANDBOX_SERVER_TOKEN": self.sandbox.token,
        }

    def adapt(self, code: str) -> str:
        address = self.url.removeprefix("http://")
        return code.replace(README_ADDRESS, address).replace(README_KEY, self.key)


# Results by (language, code): the tests of broken copies run only the blocks they changed.
_RESULTS: dict[tuple[str, str], subprocess.CompletedProcess[str]] = {}


def run_block(block: Block, target: Target, workdir: Path) -> subprocess.CompletedProcess[str]:
    code = target.adapt(block.code)
    known = _RESULTS.get((block.language, code))
    if known is not None:
        return known
    if block.language == "python":
        source = workdir / f"readme_line_{block.line}.py"
        source.write_text(code)
        command = [sys.executable, str(source)]
    else:
        command = ["bash", "-e", "-o", "pipefail", "-c", code]
    done = subprocess.run(
        command,
        cwd=PROJECT_ROOT,
        env=target.environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    _RESULTS[(block.language, code)] = done
    return done


def syntax_error(block: Block) -> str | None:
    if block.language == "python":
        try:
            compile(block.code, str(block), "exec")
        except SyntaxError as exc:
            return f"{exc.msg} (line {exc.lineno} of the block)"
        return None
    checked = subprocess.run(["bash", "-n", "-c", block.code], capture_output=True, text=True)
    return checked.stderr.strip() or None if checked.returncode else None


def problems(markdown: str, target: Target, workdir: Path) -> list[str]:
    """What does not work in ``markdown``'s code blocks (empty when everything does)."""
    found: list[str] = []
    all_blocks = blocks(markdown)
    for position, block in enumerate(all_blocks):
        if block.language not in CHECKED_LANGUAGES:
            continue
        if block.marker not in ("runnable", "syntax-only"):
            found.append(f"{block}: mark it <!-- runnable --> or <!-- syntax-only: why -->")
            continue
        error = syntax_error(block)
        if error is not None:
            found.append(f"{block}: syntax error: {error}")
            continue
        if block.marker == "syntax-only":
            continue
        done = run_block(block, target, workdir)
        if done.returncode != 0:
            found.append(f"{block}: exit {done.returncode}\n{done.stderr[-2000:]}")
            continue
        if '{"error":' in done.stdout:
            found.append(f"{block}: the server answered an error\n{done.stdout[-2000:]}")
            continue
        following = all_blocks[position + 1] if position + 1 < len(all_blocks) else None
        if following is not None and following.marker == "output" and done.stdout != following.code:
            found.append(f"{block}: printed {done.stdout!r}, the README says {following.code!r}")
    return found


@pytest.fixture(scope="module")
def target(
    sandbox_server: RunningServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    """``agentscope-serverless serve`` on a free port, as ``./scripts/run`` starts it."""
    port = free_port()
    home = tmp_path_factory.mktemp("home")
    output = home / "serve.txt"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HOME": str(home)}
    with output.open("w") as sink:
        process = subprocess.Popen(
            [SCRIPT, "serve", "--port", str(port), "--log-level", "warning"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process)
        key = next(line for line in output.read_text().splitlines() if line.startswith("ask_"))
        yield Target(url=url, key=key, sandbox=sandbox_server, home=home)
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_every_code_block_is_marked_and_the_runnable_ones_run(
    target: Target, tmp_path: Path
) -> None:
    markdown = README.read_text()
    runnable = [b for b in blocks(markdown) if b.marker == "runnable"]
    assert len(runnable) >= 5
    assert {b.language for b in runnable} == {"python", "bash"}
    assert problems(markdown, target, tmp_path) == []


def test_a_broken_snippet_fails(target: Target, tmp_path: Path) -> None:
    markdown = README.read_text()
    key_line = 'KEY = os.environ["AGENTSCOPE_API_KEY"]  # the key printed by ./scripts/run\n'
    assert key_line in markdown
    broken = markdown.replace(key_line, "")  # the OpenAI example as it once was
    broken = broken.replace(
        "deploy sam build --agent shouter.agent:app\n",
        "deploy sam build --agent shouter.agent:app && &&\n",
    )
    broken = broken.replace(
        "<!-- runnable -->\n```python\nimport asyncio", "```python\nimport asyncio", 1
    )
    found = problems(broken, target, tmp_path)
    assert len(found) == 3, found
    assert "NameError: name 'KEY' is not defined" in found[0]
    assert "unmarked" in found[1] and "mark it" in found[1]
    assert "syntax error" in found[2]


def test_a_snippet_whose_output_changed_fails(target: Target, tmp_path: Path) -> None:
    markdown = README.read_text().replace("round 1 {'step': 1}", "round 2 {'step': 1}")
    found = problems(markdown, target, tmp_path)
    assert len(found) == 1 and "the README says" in found[0]


def test_every_setting_is_in_the_configuration_table() -> None:
    from agentscope_serverless.settings import Settings

    section = README.read_text().split("## Configuration", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", section))
    missing = [name.upper() for name in Settings.model_fields if name.upper() not in named]
    assert missing == [], f"settings the README's Configuration table does not name: {missing}"


def test_the_configuration_table_states_the_bounds_each_setting_is_held_to() -> None:
    # Refused at start-up naming only the variable, a limit the README did not state
    # (LLM_MAX_ITERATIONS at most 100) was found by trial.
    from agentscope_serverless.services._validation import MAX_TTL_SECONDS
    from agentscope_serverless.settings import Settings

    section = README.read_text().split("## Configuration", 1)[1].split("\n## ", 1)[0]
    rows = {
        name: row
        for row in section.splitlines()
        if row.startswith("| `")
        for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", row.split(" | ")[0])
    }
    unstated = []
    for name, field in Settings.model_fields.items():
        for constraint in field.metadata:
            for kind in ("ge", "gt", "le", "lt"):
                bound = getattr(constraint, kind, None)
                if bound is None or (kind in ("ge", "gt") and bound in (0, 1)):
                    continue  # a count from 1 or a time above 0 goes without saying
                if bound == MAX_TTL_SECONDS:
                    stated = "at most 10^12 s" in section
                else:
                    number = f"{bound:g}" if isinstance(bound, float) else str(bound)
                    stated = re.search(rf"(?<![\d.]){number}(?![\d.])", rows[name.upper()])
                if not stated:
                    unstated.append(f"{name.upper()} {kind} {bound}")
    assert unstated == [], f"bounds the Configuration table does not state: {unstated}"


def test_the_reload_passage_names_every_folder_never_watched() -> None:
    from agentscope_serverless.serve import IGNORED_FOLDERS

    passage = README.read_text().split("`serve --reload` restarts the server", 1)[1]
    passage = passage.split("an idle server costs nothing", 1)[0]
    assert sorted(IGNORED_FOLDERS - set(re.findall(r"`([^`]+)`", passage))) == []


def test_the_routes_table_says_what_a_memory_search_without_top_k_gives() -> None:
    # It said "all that match", while a search gives the best MAX_TOP_K at most.
    from agentscope_serverless.services.memory.base import MAX_TOP_K

    row = next(
        line for line in README.read_text().splitlines() if line.startswith("| `POST /memory`")
    )
    assert f"1 to {MAX_TOP_K:,} results; the best {MAX_TOP_K:,} without one" in row
