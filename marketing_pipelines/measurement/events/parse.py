"""An event file's bytes as records: bounded physical lines, then JSONL objects or CSV rows; bad lines with a reason."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import orjson

from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.measurement.events.json_text import may_hold_a_long_integer
from marketing_pipelines.measurement.events.rejects import MAX_REJECT_RAW_CHARS
from marketing_pipelines.measurement.events.validate import REQUIRED_FIELDS
from marketing_pipelines.strict_json import loads_json

CSV_COLUMNS = (*REQUIRED_FIELDS, "actor_id", "source", "properties")
# A line this long is not an event; refusing it keeps one corrupt line from costing much memory downstream.
MAX_LINE_BYTES = 256 * 1024
# The file loader calls ``progress`` about this often (in bytes read), not once per line.
PROGRESS_STEP_BYTES = 1024 * 1024

PhysicalLine = tuple[int, bytes, str | None]


class Line(NamedTuple):
    number: int
    raw: str
    record: Mapping[str, Any] | None  # None when the line is not a record; reason says why
    reason: str | None = None
    json_native: bool = False  # record came from orjson (see json_text.loads_strict)


_new_tuple = tuple.__new__


def _decode(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def jsonl_records(lines: Iterator[PhysicalLine]) -> Iterator[Line]:
    for number, data, problem in lines:
        # The common case: orjson reads a JSON object (it checks UTF-8 too). Everything else takes the
        # path below, which gives the reject reasons; see json_text.loads_strict for why long digit runs do.
        if problem is None and not may_hold_a_long_integer(data):
            try:
                record = orjson.loads(data)
            except orjson.JSONDecodeError:
                pass
            else:
                if type(record) is dict:
                    yield _new_tuple(Line, (number, data.decode("utf-8"), record, None, True))
                    continue
        text = _decode(data)
        if problem is None and text is None:
            problem = "line is not valid UTF-8"
        shown = text if text is not None else data.decode("utf-8", "replace")
        if problem is not None:
            yield Line(number, shown, None, problem)
            continue
        if not shown.strip():
            continue
        try:
            # Events nest as deep as the parsers read (orjson, above, reads 1024 levels): RecursionError below.
            record = loads_json(shown, max_depth=None)
        except json.JSONDecodeError as exc:
            yield Line(number, shown, None, f"not valid JSON: {exc.msg} at column {exc.colno}")
            continue
        except ValueError as exc:
            yield Line(number, shown, None, f"not valid JSON: {exc}")
            continue
        except RecursionError:
            yield Line(number, shown, None, "not valid JSON: nested too deeply")
            continue
        if not isinstance(record, dict):
            yield Line(number, shown, None, f"line must be a JSON object, got {type(record).__name__}")
            continue
        yield Line(number, shown, record)


class _CsvSource:
    """The text lines csv.reader reads from an event file, and the physical lines behind each row it returns.

    csv.reader pulls one line at a time and stops at the end of a row, so the lines pulled since the last
    ``take_row()`` are those of the row it just returned (or of the part a csv.Error gave up on). Each take
    hands the lines over and starts a new list: what the caller holds is never changed behind its back.
    """

    def __init__(self, lines: Iterator[PhysicalLine]) -> None:
        self._lines = lines
        self._row_lines: list[tuple[int, str]] = []
        self._row_undecodable = False
        self._too_long: list[Line] = []

    def text_lines(self) -> Iterator[str]:
        """Each physical line as text for csv.reader, noted on the row being read."""
        for number, data, problem in self._lines:
            text = _decode(data)
            if problem is not None:
                # Its truncated text could open a quote that swallows the following rows; csv sees a blank line.
                self._too_long.append(Line(number, data.decode("utf-8", "replace"), None, problem))
                yield "\n"
                continue
            if text is None:
                self._row_undecodable = True
                text = data.decode("utf-8", "replace")
            self._row_lines.append((number, text))
            yield text + "\n"

    def take_row(self) -> tuple[list[tuple[int, str]], bool]:
        """(number, text) of each line read since the last call, and whether any of them was not UTF-8."""
        taken = self._row_lines, self._row_undecodable
        self._row_lines, self._row_undecodable = [], False
        return taken

    def take_too_long(self) -> list[Line]:
        """The lines refused for their length since the last call (csv.reader read each as a blank line)."""
        taken, self._too_long = self._too_long, []
        return taken


def csv_records(lines: Iterator[PhysicalLine], path: Path) -> Iterator[Line]:
    source = _CsvSource(lines)
    reader = csv.reader(source.text_lines(), strict=True)
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        return
    except csv.Error as exc:
        raise InvalidInput(f"{path}: the CSV header cannot be read: {exc}") from None
    missing = [c for c in REQUIRED_FIELDS if c not in header]
    if missing:
        raise InvalidInput(
            f"{path}: the CSV header lacks {', '.join(missing)} (expected columns {', '.join(CSV_COLUMNS)})"
        )
    source.take_row()  # the header's lines
    while True:
        try:
            row: list[str] | None = next(reader)
            problem = None
        except StopIteration:
            row, problem = None, "end"
        except csv.Error as exc:
            row, problem = None, f"malformed CSV: {exc}"
        yield from source.take_too_long()
        row_lines, undecodable = source.take_row()
        number = row_lines[0][0] if row_lines else 0
        raw = "\n".join(t for _, t in row_lines)
        if problem == "end":
            # The csv module reports an open quote at the end as "unexpected end of data" (above); lines
            # still held here would be such a row all the same.
            if row_lines:
                yield Line(number, raw, None, "malformed CSV: unterminated quote")
            return
        if row is None:
            yield Line(number, raw, None, problem)
        elif not row or all(not cell.strip() for cell in row):
            continue
        elif undecodable:
            yield Line(number, raw, None, "line is not valid UTF-8")
        elif len(row) != len(header):
            yield Line(number, raw, None, f"expected {len(header)} CSV fields, got {len(row)}")
        else:
            yield Line(number, raw, dict(zip(header, row, strict=True)))


def physical_lines(handle: BinaryIO, progress: Callable[[int], None] | None) -> Iterator[PhysicalLine]:
    """(line number, bytes without the newline, problem or None), reading at most MAX_LINE_BYTES at a time.

    Binary reading with a bounded readline keeps memory constant however large the file or a
    single line is, and a bad byte sequence rejects its own line instead of stopping the load.
    ``progress`` gets the bytes read about every PROGRESS_STEP_BYTES, and the rest at the end.
    """
    number = 0
    unreported = 0
    readline = handle.readline
    while True:
        data = readline(MAX_LINE_BYTES + 1)
        if not data:
            if progress is not None and unreported:
                progress(unreported)
            return
        number += 1
        unreported += len(data)
        problem = None
        if number == 1 and data.startswith(b"\xef\xbb\xbf"):
            data = data[3:]  # a UTF-8 byte-order mark, as spreadsheet programs write it
        if len(data) > MAX_LINE_BYTES and not data.endswith(b"\n"):
            problem = f"line is longer than {MAX_LINE_BYTES} bytes"
            while True:
                rest = readline(MAX_LINE_BYTES)
                unreported += len(rest)
                if not rest or rest.endswith(b"\n"):
                    break
            data = data[:MAX_REJECT_RAW_CHARS]
        if progress is not None and unreported >= PROGRESS_STEP_BYTES:
            progress(unreported)
            unreported = 0
        yield number, data.rstrip(b"\r\n"), problem
