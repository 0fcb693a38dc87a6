"""docs/agents.md is tested: every code block marked `tested` runs against a live server.

The convention is written in the file's top comment: a fenced block whose info string carries
the word `tested` (```python tested) is run, each in its own Python process with this
virtualenv, against a live server with its background loop, while a reviewer approves every
approval that waits. It must exit 0, and every run it creates must end `completed` (or the
status named by `expect=<status>` in the info string). Blocks are found when the tests are
collected, so a block marked later is tested without touching this file.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runs.models import Run
from safestop_agent import ApiError, SafestopClient

pytestmark = pytest.mark.django_db(transaction=True)

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "agents.md"
MARKER = "tested"
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the opening fence
    language: str
    words: tuple[str, ...]
    code: str

    @property
    def expect(self) -> str:
        for word in self.words:
            if word.startswith("expect="):
                return word.removeprefix("expect=")
        return "completed"


def code_blocks(text: str) -> list[Block]:
    """Every fenced block of a Markdown text, indented ones (in list items) included."""
    blocks: list[Block] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        words = tuple(opening["info"].split())
        body: list[str] = []
        index += 1
        while index < len(lines) and lines[index].strip() != fence:
            body.append(lines[index][indent:] if lines[index][:indent].isspace() else lines[index])
            index += 1
        blocks.append(
            Block(
                line=index - len(body),
                language=words[0] if words else "",
                words=words[1:],
                code="\n".join(body) + "\n",
            )
        )
        index += 1
    return blocks


def blocks_marked_tested() -> list[Block]:
    return [block for block in code_blocks(GUIDE.read_text()) if MARKER in block.words]


def test_the_guide_marks_its_runnable_blocks_and_only_python_ones():
    blocks = blocks_marked_tested()
    assert blocks, "docs/agents.md has no block marked `tested`"
    guide = GUIDE.read_text()
    first_agent = guide[guide.index("## A first agent") :]
    first_agent = first_agent[: first_agent.index("\n## ", 1)]
    assert f"```python {MARKER}" in first_agent, "the first agent is not tested"
    untestable = [(block.line, block.language) for block in blocks if block.language != "python"]
    assert not untestable, f"only Python blocks can be tested: {untestable}"


def test_the_block_parser_reads_fences_in_list_items_and_their_info():
    text = (
        "x\n```python tested expect=failed\nprint(1)\n```\n- item\n\n  ```python\n  a = 1\n  ```\n"
    )
    first, second = code_blocks(text)
    assert (first.language, first.words, first.expect, first.code) == (
        "python",
        ("tested", "expect=failed"),
        "failed",
        "print(1)\n",
    )
    assert (second.language, second.words, second.code) == ("python", (), "a = 1\n")


class Reviewer(threading.Thread):
    """Approves, as is, every approval that waits, until told to stop."""

    def __init__(self, client: SafestopClient) -> None:
        super().__init__(name="doc-reviewer", daemon=True)
        self.client = client
        self.done = threading.Event()
        self.approved: list[str] = []

    def run(self) -> None:
        while not self.done.wait(0.2):
            try:
                for approval in self.client.list_approvals(status="waiting"):
                    self.client.decide_approval(approval["id"], "approve")
                    self.approved.append(approval["id"])
            except ApiError:
                continue  # decided meanwhile (a stop voided it): look again


@pytest.mark.parametrize("block", blocks_marked_tested(), ids=lambda block: f"line{block.line}")
def test_the_block_runs_against_a_live_server(block: Block, stack: Any, tmp_path: Path):
    script = tmp_path / "block.py"
    script.write_text(block.code)
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE", "PYTHONPATH")
    }
    env.update(
        SAFESTOP_URL=stack.url,
        SAFESTOP_TOKEN=stack.agent_raw,
        SAFESTOP_REVIEWER_TOKEN=stack.reviewer_raw,
        SAFESTOP_WEBHOOK_URL=stack.receiver.url("/hooks/docs"),
        PYTHONUNBUFFERED="1",
    )
    reviewer = Reviewer(stack.reviewer())
    reviewer.start()
    try:
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,  # not the repository: the installed package, as a user has it
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        reviewer.done.set()
        reviewer.join(10)
    where = f"docs/agents.md line {block.line}"
    assert done.returncode == 0, f"{where} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    statuses = dict(Run.objects.values_list("pk", "status"))
    assert all(status == block.expect for status in statuses.values()), (where, statuses)
