"""The user API type-checks: mypy (strict) on ``examples/``, the python blocks of
``docs/*.md`` and ``tests/typing_cases/typed_user_code.py`` reports nothing but the
mistakes that last file marks with ``# expect-error: <code>``, each with its code. With
``get_state`` returning ``Any``, or streams, descriptors, sources or sinks not generic, or
string options not ``Literal``, the marked lines pass unnoticed or the ``assert_type`` s
fail, and so does this test.

mypy runs on the package as a wheel installs it (``reactive.backends`` and
``reactive.connectors`` inside ``reactive``): a tree of symbolic links, since the editable
install maps them with an import hook that mypy does not follow.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

api = pytest.importorskip("mypy.api")

ROOT = Path(__file__).resolve().parents[2]
USER_CODE = ROOT / "tests" / "typing_cases" / "typed_user_code.py"
_EXPECT = re.compile(r"#\s*expect-error:\s*([a-z-]+)")
_ERROR = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[a-z-]+)\]$")


def _installed_layout(site: Path) -> None:
    """``site/reactive``: the runtime's entries, with the backends and connectors inside."""
    package = site / "reactive"
    package.mkdir()
    for entry in (ROOT / "reactive").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    (package / "backends").symlink_to(ROOT / "backends")
    (package / "connectors").symlink_to(ROOT / "connectors")


def _expected_errors() -> set[tuple[str, int, str]]:
    expected = set()
    for number, line in enumerate(USER_CODE.read_text().splitlines(), start=1):
        match = _EXPECT.search(line)
        if match:
            expected.add((USER_CODE.name, number, match.group(1)))
    return expected


def _run_mypy(site: Path, files: list[str]) -> tuple[str, str, int]:
    """mypy (strict) on ``files`` with ``site`` first on its search path, run from
    ``site`` so that the checkout's ``reactive`` folder is not found instead."""
    saved_cwd, saved_path = os.getcwd(), os.environ.get("MYPYPATH")
    os.environ["MYPYPATH"] = str(site)
    os.chdir(site)
    try:
        return api.run([
            "--strict", "--ignore-missing-imports", "--no-error-summary",
            "--show-error-codes", "--config-file", "",
            "--cache-dir", str(ROOT / ".mypy_cache" / "typed_api"), *files])
    finally:
        os.chdir(saved_cwd)
        if saved_path is None:
            del os.environ["MYPYPATH"]
        else:
            os.environ["MYPYPATH"] = saved_path


@pytest.fixture(scope="module")
def mypy_output(tmp_path_factory: pytest.TempPathFactory) -> str:
    site = tmp_path_factory.mktemp("site")
    _installed_layout(site)
    examples = sorted(str(p) for p in (ROOT / "examples").glob("*.py"))
    # the python blocks of the docs, each a complete program
    blocks = tmp_path_factory.mktemp("docs")
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for i, code in enumerate(re.findall(r"```python\n(.*?)```", doc.read_text(), re.S)):
            block = blocks / f"doc_{doc.stem}_{i}.py"
            block.write_text(code)
            examples.append(str(block))
    stdout, stderr, status = _run_mypy(site, [*examples, str(USER_CODE)])
    assert status in (0, 1), stderr
    return stdout


def _errors(output: str) -> set[tuple[str, int, str]]:
    errors = set()
    for line in output.splitlines():
        match = _ERROR.match(line)
        if match:
            errors.add((Path(match["path"]).name, int(match["line"]), match["code"]))
        else:
            assert ": note:" in line or not line.strip(), line
    return errors


#: what a documentation snippet may leave out: annotations on its own functions (their
#: bodies are still checked); every other error of a snippet is a mistake in the docs
_SNIPPET_LICENCE = {"no-untyped-def", "no-untyped-call"}


def test_the_examples_and_the_docs_type_check(mypy_output: str) -> None:
    errors = {e for e in _errors(mypy_output) if e[0] != USER_CODE.name
              and not (e[0].startswith("doc_") and e[2] in _SNIPPET_LICENCE)}
    assert not errors, mypy_output


def test_typed_user_code_reports_exactly_the_marked_mistakes(mypy_output: str) -> None:
    errors = {e for e in _errors(mypy_output) if e[0] == USER_CODE.name}
    expected = _expected_errors()
    assert len(expected) >= 10
    assert errors == expected, mypy_output
