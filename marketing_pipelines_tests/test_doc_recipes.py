"""Every bash block of README.md and docs/OPERATIONS.md runs as written, as a newcomer runs it: in order, in a
fresh folder on the embedded SQLite default, through bash with ``-euo pipefail``, with no MARKETING_* variable
but what the block itself exports. docs/ANALYSTS.md has its own runner (measurement/test_analysts_doc.py);
deploy/README.md's runbook is test_runbook.py.

A block that cannot run here says why in the Markdown, right above it: ``<!-- not run by the doc runner: why -->``
(it installs the package, runs this suite, or serves until stopped; each has a test of its own, named there).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "docs" / "OPERATIONS.md"]
BLOCK = re.compile(r"(<!-- not run by the doc runner: (?P<why>[^>]+?) -->\n)?```bash\n(?P<body>.*?)^```$", re.M | re.S)
# What a block may assume was done before it, beyond an installed package: the README's first steps.
PRELUDE = """\
marketing-pipelines db upgrade
marketing-pipelines campaigns add spring-launch --name 'Spring launch' --owner ana
"""


def blocks(doc: Path) -> list[tuple[int, str, str | None]]:
    """``(line, body, why not run)`` of each bash block, in the order the doc gives them."""
    text = doc.read_text()
    return [(text.count("\n", 0, m.start("body")) + 1, m.group("body"), m.group("why")) for m in BLOCK.finditer(text)]


def newcomer_environment() -> dict[str, str]:
    """A newcomer's: the installed commands on PATH, nothing of this project's configuration."""
    kept = {
        k: v for k, v in os.environ.items() if not k.startswith(("MARKETING_", "DAGSTER_", "PLAUSIBLE_", "POSTHOG_"))
    }
    for name in ("GITHUB_TOKEN", "GITHUB_API_URL", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        kept.pop(name, None)
    return {**kept, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{kept.get('PATH', '')}"}


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_bash_block_runs_as_written(doc: Path, tmp_path: Path) -> None:
    found = blocks(doc)
    assert found, f"{doc.name} has no bash block"
    env = newcomer_environment()
    runs = [(0, PRELUDE, None)] if doc.name != "README.md" else []
    for line, body, why in runs + found:
        if why is not None:
            continue
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", body], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"{doc.name}, block at line {line}:\n{body}\n{done.stdout}\n{done.stderr}"


def test_every_block_left_out_says_why() -> None:
    left_out = [(doc.name, line, why) for doc in DOCS for line, _, why in blocks(doc) if why is not None]
    assert all(len(why.split()) >= 3 for _, _, why in left_out), left_out
    assert any(doc.name == "README.md" and why is None for doc in DOCS for _, _, why in blocks(doc))
