"""Lines that are not valid UTF-8 in the line-file source: never decoded with replacement
characters; they fail the job naming the file and the line's byte offset (``errors="fail"``,
the default), or reach the pipeline as :class:`InvalidLine` records for its dead-letter
output (``errors="dead_letter"``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reactive import ConfigurationError, Dataflow, JobFailedError, UserFunctionError
from reactive.connectors.collections import ListSink
from reactive.connectors.files import InvalidLine, LineFileSource

GOOD = ["first line", "zweite Zeile: grün", "", "fourth"]
BAD = b"caf\xe9 au lait"  # latin-1, not UTF-8


def write_input(path: Path, crlf: bool = False) -> tuple[int, list[tuple[int, str]]]:
    """Two good lines, a bad one, two good ones; return the bad line's offset and the
    good lines with their offsets."""
    end = b"\r\n" if crlf else b"\n"
    raws = [GOOD[0].encode(), GOOD[1].encode(), BAD, GOOD[2].encode(), GOOD[3].encode()]
    offsets, offset = [], 0
    for raw in raws:
        offsets.append(offset)
        offset += len(raw) + len(end)
    path.write_bytes(b"".join(r + end for r in raws))
    good = [(offsets[i], line) for i, line in zip([0, 1, 3, 4], GOOD, strict=True)]
    return offsets[2], good


def _route(flow: Dataflow, path: Path, with_offsets: bool, errors: str
           ) -> tuple[ListSink, ListSink]:
    """The pipeline shape of a job with a dead-letter output: bad input goes to ``dead``,
    the rest to ``main``."""
    main, dead = ListSink(), ListSink()
    lines = flow.read_text_file(path, uid="lines", with_offsets=with_offsets, errors=errors)
    lines.filter(lambda r: isinstance(r, InvalidLine)).sink(dead)
    lines.filter(lambda r: not isinstance(r, InvalidLine)).map(_upper).sink(main)
    return main, dead


def _upper(record: Any) -> Any:
    if isinstance(record, tuple):
        return record[0], record[1].upper()
    return record.upper()


@pytest.mark.parametrize("with_offsets", [False, True])
@pytest.mark.parametrize("crlf", [False, True])
async def test_invalid_lines_go_to_the_dead_letter_output(tmp_path, with_offsets, crlf):
    path = tmp_path / "in.txt"
    bad_offset, good = write_input(path, crlf)
    flow = Dataflow("dead-letters", parallelism=1)
    main, dead = _route(flow, path, with_offsets, "dead_letter")
    await flow.run()
    assert len(dead.records) == 1
    invalid = dead.records[0]
    assert (invalid.path, invalid.offset, invalid.raw) == (str(path), bad_offset, BAD)
    assert f"byte offset {bad_offset + 3}" in invalid.reason  # the bad byte itself
    expected = [(o, line.upper()) for o, line in good] if with_offsets else \
        [line.upper() for _, line in good]
    assert main.records == expected
    assert not any("\ufffd" in str(r) for r in main.records)


@pytest.mark.parametrize("with_offsets", [False, True])
async def test_an_invalid_line_fails_the_job_naming_file_and_offset(tmp_path, with_offsets):
    path = tmp_path / "in.txt"
    bad_offset, _ = write_input(path)
    flow = Dataflow("strict", parallelism=1)
    _route(flow, path, with_offsets, "fail")
    with pytest.raises(JobFailedError) as info:
        await flow.run()
    error = info.value.__cause__
    assert isinstance(error, UserFunctionError)
    message = str(error)
    assert str(path) in message and f"line at byte offset {bad_offset} " in message
    assert "errors='dead_letter'" in message


async def test_fail_is_the_default(tmp_path):
    path = tmp_path / "in.txt"
    write_input(path)
    flow = Dataflow("default", parallelism=1)
    flow.read_text_file(path).sink(ListSink())
    with pytest.raises(JobFailedError, match="not valid UTF-8"):
        await flow.run()


async def test_a_bad_line_in_a_large_batch_keeps_the_offsets_of_the_others(tmp_path):
    path = tmp_path / "big.txt"
    lines = [f"line {i}".encode() for i in range(5_000)]
    lines[2_345] = b"\xff\xfe" + lines[2_345]
    path.write_bytes(b"\n".join(lines) + b"\n")
    reader = LineFileSource(path, with_offsets=True, errors="dead_letter").create_reader(0, 1)
    records: list[Any] = []
    while (batch := await reader.read_batch(10_000)) is not None:
        records += batch
    offset = 0
    for raw, record in zip(lines, records, strict=True):
        if isinstance(record, InvalidLine):
            assert (record.offset, record.raw) == (offset, raw)
        else:
            assert record == (offset, raw.decode())
        offset += len(raw) + 1
    assert sum(isinstance(r, InvalidLine) for r in records) == 1


def test_unknown_errors_option_is_a_configuration_error(tmp_path):
    (tmp_path / "in.txt").write_text("x\n")
    with pytest.raises(ConfigurationError, match="errors"):
        LineFileSource(tmp_path / "in.txt", errors="replace")
    with pytest.raises(ConfigurationError, match="errors"):
        Dataflow("x").read_text_file(tmp_path / "in.txt", errors="ignore")
