"""Every ```python block of README.md, ARCHITECTURE.md and the pages under docs/ runs as it
is: each is written to a file of its own in a fresh directory and run by this interpreter,
with a timeout. A block that uses the Spark connector runs in this process instead, as
``__main__``, on the test session's shared SparkSession (its ``local_session`` call returns
it): a JVM and its Python workers per block would cost more than the block; the
configuration the block changes is set back afterwards. README.md starts with the two
commands `.ci/run` runs, and every relative link of these pages points at a file that
exists.

No block is skipped: a block that needs a service runs against one the tests start (Kafka's
mock cluster, the shared SparkSession), and a block importing a third-party module that is
not installed fails, naming it (every such module is in the ``test`` extra)."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import re
import runpy
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import ON_THE_SPARK_SESSION

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]
TIMEOUT = 600  # seconds per block run in its own process; most take a few
SPARK = "reactive.connectors.spark"


@dataclass
class Block:
    line: int  # of the opening fence, 1-based
    code: str
    page: str = "README.md"  # the page's path relative to the repository


def python_blocks(text: str) -> list[Block]:
    """The ```python blocks of a markdown text."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            blocks.append(Block(start + 1, "\n".join(lines[start + 1:end]) + "\n"))
            i = end
        i += 1
    return blocks


def third_party_imports(code: str) -> set[str]:
    """The top-level modules a block imports that are neither reactive nor the stdlib."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.partition(".")[0])
    return {n for n in names if n != "reactive" and n not in sys.stdlib_module_names}


def page_blocks() -> list[Block]:
    """The python blocks of README.md and of every page under docs/, each naming its page."""
    blocks = []
    for page in PAGES:
        for block in python_blocks(page.read_text()):
            block.page = str(page.relative_to(ROOT))
            blocks.append(block)
    return blocks


BLOCKS = page_blocks()


def test_the_readme_and_the_docs_have_python_blocks():
    assert [b for b in BLOCKS if b.page == "README.md"]
    assert len({b.page for b in BLOCKS}) >= 4


@pytest.mark.e2e
@pytest.mark.parametrize("block", [
    pytest.param(b, id=f"{b.page}:line{b.line}",
                 marks=[ON_THE_SPARK_SESSION] if SPARK in b.code else [])
    for b in BLOCKS])
def test_block_runs(block: Block, tmp_path: Path, request: pytest.FixtureRequest,
                    monkeypatch: pytest.MonkeyPatch) -> None:
    missing = [m for m in sorted(third_party_imports(block.code))
               if importlib.util.find_spec(m) is None]
    assert not missing, (f"{block.page}'s block at line {block.line} imports {missing}, "
                         "not installed: install the test extra (pip install -e '.[test]')")
    script = tmp_path / "block.py"
    script.write_text(block.code)
    if SPARK in block.code:
        _run_on_the_shared_session(block, script, request.getfixturevalue("spark"), monkeypatch)
        return
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, (
        f"{block.page}'s block at line {block.line} failed:\n{proc.stdout}\n{proc.stderr}")


def _run_on_the_shared_session(block: Block, script: Path, spark: Any,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Run ``script`` as ``__main__`` in this process, in its directory, with ``spark`` the
    active session; then set back every configuration value the block changed."""
    before = dict(spark.conf.getAll)
    monkeypatch.chdir(script.parent)
    output = io.StringIO()
    try:
        with contextlib.redirect_stdout(output):
            runpy.run_path(str(script), run_name="__main__")
    except BaseException as error:
        raise AssertionError(f"{block.page}'s block at line {block.line} failed:\n"
                             f"{output.getvalue()}") from error
    finally:
        after = dict(spark.conf.getAll)
        for key in after.keys() - before.keys():
            spark.conf.unset(key)
        for key, value in before.items():
            if after.get(key) != value:
                spark.conf.set(key, value)


def test_the_readme_starts_with_the_two_commands_ci_runs():
    """`.ci/run` takes README.md's first ```sh block as the two commands to run: set up and
    run the main job, set up and run the tests."""
    lines = README.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("```"))
    assert lines[start] == "```sh" and lines[:start] == ["# reactive", ""]
    end = lines.index("```", start + 1)
    commands = lines[start + 1:end]
    assert len(commands) == 2
    assert commands[0].endswith("examples/flights.py") and commands[1].endswith("pytest -q")


LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
CODE_SPAN = re.compile(r"`[^`\n]*`")


def test_relative_links_point_at_files_that_exist():
    broken = []
    for page in PAGES:
        # code spans are not markdown: `Descriptor[int, str]("name")` is no link
        for match in LINK.finditer(CODE_SPAN.sub("", page.read_text())):
            target = match["target"].partition("#")[0]
            if not target or "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {match['target']}")
    assert broken == []


def test_python_blocks_are_found_with_their_lines_and_code():
    text = "text\n```python\nx = 1\nprint(x)\n```\n\n```sh\nls\n```\n```python\npass\n```\n"
    first, second = python_blocks(text)
    assert (first.line, first.code) == (2, "x = 1\nprint(x)\n")
    assert (second.line, second.code) == (10, "pass\n")
