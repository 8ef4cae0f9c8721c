"""The streaming file loader, ``load_events_file``: a .jsonl/.csv file read in chunks that a writer thread commits."""

from __future__ import annotations

import gc
import queue
import threading
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa

from marketing_pipelines.db.engine import is_postgres
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.measurement.events.parse import csv_records, jsonl_records, physical_lines
from marketing_pipelines.measurement.events.pg_copy import copy_line
from marketing_pipelines.measurement.events.rejects import Reject, insert_rejects, reject_file_label
from marketing_pipelines.measurement.events.validate import EventRow, InvalidEvent, known_campaign_ids, validated_row
from marketing_pipelines.measurement.events.write import BATCH_SIZE, LoadCounts, conflict_reason, store_events

SUPPORTED_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}
# A chunk of a file load ends after BATCH_SIZE lines (events and rejects), or once its rows' lines hold
# LOAD_CHUNK_BYTES (50,000 typical lines hold about 12 MB), so memory stays bounded however long the lines
# are: in Python a row takes several times its line's size.
LOAD_CHUNK_BYTES = 16 * 1024 * 1024


def file_format(path: Path) -> str:
    fmt = SUPPORTED_SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise InvalidInput(f"{path}: unsupported file type {path.suffix!r}; use .jsonl, .ndjson or .csv")
    return fmt


@dataclass
class _Chunk:
    """The lines of one transaction of a file load."""

    rows: list[EventRow] = field(default_factory=list)
    lines: list[tuple[int, str]] = field(default_factory=list)  # (number, raw text) of each row, for conflicts
    # The rows as COPY text, on PostgreSQL: built by the reading thread, so the writer's thread only waits on
    # the database (Python code on it would compete with the reader for the GIL).
    copy_lines: list[str] | None = None
    rejects: list[Reject] = field(default_factory=list)


class _ChunkWriter:
    """Writes and commits chunks in the order given, on one thread of its own.

    The database inserts chunk n while the caller parses chunk n+1: the drivers release the GIL while the
    server works. What is committed stays what a sequential loader commits: chunks in file order, each in its
    own transaction, and after a failed chunk nothing more. Memory holds at most three chunks: the one being
    written, one waiting, and the one being read.
    """

    def __init__(self, engine: sa.Engine, file_label: str, counts: LoadCounts) -> None:
        self._engine, self._file_label, self._counts = engine, file_label, counts
        self.copies = is_postgres(engine)  # whether chunks should carry their COPY text
        self._waiting: queue.Queue[_Chunk | None] = queue.Queue(maxsize=1)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="events-load-writer", daemon=True)
        self._thread.start()

    def write(self, chunk: _Chunk) -> None:
        """Queue ``chunk``; raises the error of an earlier chunk, which stops the load as it would have then."""
        if self._error is not None:
            raise self._error
        if chunk.rows or chunk.rejects:
            self._waiting.put(chunk)

    def close(self, raise_error: bool = True) -> None:
        """Wait until every queued chunk is committed (or the writer failed), then raise its error if any."""
        self._waiting.put(None)
        self._thread.join()
        if raise_error and self._error is not None:
            raise self._error

    def _run(self) -> None:
        while (chunk := self._waiting.get()) is not None:
            if self._error is None:  # after a failure, queued chunks are dropped, not written
                try:
                    _flush(self._engine, chunk, self._file_label, self._counts)
                except BaseException as exc:
                    self._error = exc


def load_events_file(
    engine: sa.Engine,
    path: Path | str,
    progress: Callable[[int], None] | None = None,
    source: str = "file",
    batch_size: int = BATCH_SIZE,
) -> LoadCounts:
    """Stream a .jsonl/.csv file of events into ``marketing_event``; invalid rows go to ``marketing_event_reject``.

    ``progress`` is called with the bytes read since its last call. Each chunk of ``batch_size`` lines
    commits on its own, so an interrupted load keeps what it wrote and a re-run skips it (event_id dedupe).
    """
    path = Path(path)
    fmt = file_format(path)
    if not path.is_file():  # follows a symlink: /dev/zero or a named pipe would be read forever, or block
        raise InvalidInput(f"{path}: not a regular file (a device, pipe or socket); give a .jsonl or .csv file")
    with engine.connect() as conn:
        known = known_campaign_ids(conn)
    counts = LoadCounts()
    writer = _ChunkWriter(engine, reject_file_label(path), counts)
    # A chunk holds some 100,000 objects the cyclic GC tracks; each full collection would also walk every object
    # the process had before the load (a CLI process with Dagster imported holds over 100,000), which cost a
    # fifth of the reading. Frozen, those are left out of collections until the load ends.
    gc.freeze()
    try:
        _read_chunks(path, fmt, known, source, batch_size, progress, counts, writer)
    except BaseException:
        # Chunks handed over were, to the reader, already written: they commit before the error surfaces.
        writer.close(raise_error=False)
        raise
    finally:
        gc.unfreeze()
    writer.close()
    if counts.read == 0:
        raise InvalidInput(f"{path}: no events found (the file is empty or has only a header)")
    return counts


def _read_chunks(
    path: Path,
    fmt: str,
    known: Container[str],
    source: str,
    batch_size: int,
    progress: Callable[[int], None] | None,
    counts: LoadCounts,
    writer: _ChunkWriter,
) -> None:
    """Read, parse and validate ``path`` into chunks handed to ``writer``.

    A file whose first chunk holds no record (not one line was JSON or a CSV row) is refused before that
    chunk is handed over: a wrong file (``/etc/passwd`` behind a symlink named .jsonl) stores nothing, not
    its first lines as rejects. Waiting for the end of the file instead would hold all of it in memory.
    """
    copy = writer.copies
    seen_record = False
    with path.open("rb") as handle:
        lines = physical_lines(handle, progress)
        records = jsonl_records(lines) if fmt == "jsonl" else csv_records(lines, path)
        while True:
            chunk = _Chunk(copy_lines=[] if copy else None)
            # Bound methods and counters in locals: this loop runs once per line of the file.
            add_row, add_line, add_reject = chunk.rows.append, chunk.lines.append, chunk.rejects.append
            add_copy_line = chunk.copy_lines.append if chunk.copy_lines is not None else None
            held_chars = 0
            for lines_in_chunk, (number, raw, record, reason, json_native) in enumerate(records, 1):
                if record is None:
                    counts.unparseable += 1
                    add_reject(Reject.of(number, raw, reason or "unreadable"))
                else:
                    seen_record = True
                    try:
                        row = validated_row(record, known, source, datetime.now(UTC), json_native)
                    except InvalidEvent as exc:
                        add_reject(Reject.of(number, raw, str(exc)))
                    else:
                        add_row(row)
                        add_line((number, raw))  # not the parsed record: see load_events_file
                        held_chars += len(raw)
                        if add_copy_line is not None:
                            add_copy_line(copy_line(row))
                if lines_in_chunk >= batch_size or held_chars >= LOAD_CHUNK_BYTES:
                    break
            else:
                if not seen_record and chunk.rejects:
                    raise _not_a_records_file(path, fmt, len(chunk.rejects), whole_file=True)
                writer.write(chunk)  # the last one
                return
            if not seen_record:
                raise _not_a_records_file(path, fmt, len(chunk.rejects), whole_file=False)
            writer.write(chunk)


def _not_a_records_file(path: Path, fmt: str, unreadable: int, whole_file: bool) -> InvalidInput:
    if whole_file:
        which = f"not one line could be read as a {fmt.upper()} record ({unreadable} unreadable)"
    else:
        which = f"none of its first {unreadable} lines could be read as a {fmt.upper()} record"
    return InvalidInput(f"{path}: {which}; is this the right file? Nothing was stored.")


def _flush(engine: sa.Engine, chunk: _Chunk, file_label: str, counts: LoadCounts) -> None:
    now = datetime.now(UTC)
    conflicts: list[Reject] = []
    with engine.begin() as conn:
        inserted, not_inserted = store_events(conn, chunk.rows, now, copy=True, copy_lines=chunk.copy_lines)
        for index, fields in not_inserted.items():
            if fields:
                number, raw = chunk.lines[index]
                conflicts.append(Reject.of(number, raw, conflict_reason(chunk.rows[index].event_id, fields)))
        if chunk.rejects or conflicts:
            insert_rejects(conn, [*chunk.rejects, *conflicts], file_label, now)
    counts.loaded += inserted
    counts.conflict += len(conflicts)
    counts.duplicate += len(chunk.rows) - inserted - len(conflicts)
    counts.rejected += len(chunk.rejects)
    for r in [*chunk.rejects, *conflicts]:
        counts.note(r.reason, r.number)
