"""The README's Python example runs as written and prints what the README says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def test_python_example_prints_what_the_readme_says() -> None:
    section = _section("Use the services from Python")
    code = re.search(r"```python\n(.*?)```", section, re.S)
    expected = re.search(r"```text\n(.*?)```", section, re.S)
    assert code and expected
    result = subprocess.run(
        [sys.executable, "-c", code.group(1)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected.group(1)
