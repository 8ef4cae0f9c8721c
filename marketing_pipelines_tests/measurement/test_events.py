"""Event ingestion: each bad row rejected with its reason, nothing valid lost, loads idempotent and streaming."""

from __future__ import annotations

import json
import re
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from marketing_pipelines.cli import main
from marketing_pipelines.cli import measurement as cli
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import campaign as campaign_table
from marketing_pipelines.db.schema import marketing_event, marketing_event_reject
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.measurement.events import files as events_module
from marketing_pipelines.measurement.events.files import load_events_file
from marketing_pipelines.measurement.events.json_text import loads_strict as _loads_strict
from marketing_pipelines.measurement.events.parse import MAX_LINE_BYTES, PROGRESS_STEP_BYTES
from marketing_pipelines.measurement.events.parse import jsonl_records as _jsonl_records
from marketing_pipelines.measurement.events.parse import physical_lines as _physical_lines
from marketing_pipelines.measurement.events.rejects import list_rejects, reject_file_label
from marketing_pipelines.measurement.events.validate import MAX_PROPERTIES_BYTES, InvalidEvent
from marketing_pipelines.measurement.events.validate import validated_row as _validated_row
from marketing_pipelines.measurement.events.write import (
    COPY_MIN_ROWS,
    LoadCounts,
    ingestion_reading,
    record_events,
)
from marketing_pipelines.strict_json import loads_json
from marketing_pipelines_tests.factories import add_campaign


def event(**overrides: Any) -> dict[str, Any]:
    base = {
        "event_id": "e1",
        "campaign_id": "spring-launch",
        "stage": "awareness",
        "event_type": "page_view",
        "actor_id": "u1",
        "occurred_at": "2026-11-26T10:00:00+01:00",
        "source": "web",
        "properties": {"path": "/"},
    }
    return {k: v for k, v in {**base, **overrides}.items() if v is not ...}


# (line as written, reject reason expected)
BAD_JSONL_LINES = [
    ('{"event_id": "x1", "campaign_id": "spring-launch"', "not valid JSON"),  # truncated line
    ("[1, 2, 3]", "line must be a JSON object, got list"),
    (json.dumps(event(event_id=...)), "missing required field 'event_id'"),
    (json.dumps(event(event_id="x2", stage="")), "missing required field 'stage'"),
    (json.dumps(event(event_id="x3", campaign_id="nope")), "unknown campaign 'nope'"),
    (json.dumps(event(event_id="x4", occurred_at=...)), "missing required field 'occurred_at'"),
    (json.dumps(event(event_id="x5", occurred_at="2026-11-26T10:00:00")), "has no UTC offset"),
    (json.dumps(event(event_id="x6", occurred_at="yesterday")), "is not an ISO-8601 timestamp"),
    (json.dumps(event(event_id="x7", occurred_at=1764150000)), "is not an ISO-8601 timestamp"),
    (json.dumps(event(event_id="x8", occurred_at="2999-01-01T00:00:00Z")), "more than a day in the future"),
    (json.dumps(event(event_id="x9", actor_id="a" * 201)), "field 'actor_id' is longer than 200"),
    (json.dumps(event(event_id="y" * 201)), "field 'event_id' is longer than 200"),
    (json.dumps(event(event_id="x10", properties=[1])), "properties must be a JSON object"),
    (json.dumps(event(event_id="x11", properties={"blob": "z" * 20_000})), "properties are larger than"),
    (json.dumps(event(event_id="x12", stage={"nested": 1})), "field 'stage' must be a string"),
    (json.dumps(event(event_id="x13", actor_id="a\x00b")), "field 'actor_id' contains a NUL character"),
    (json.dumps(event(event_id="x14", properties={"k": "\x00"})), "properties contain a NUL character"),
    (
        '{"event_id": "x15", "campaign_id": "spring-launch", "stage": "s\\ud800", "event_type": "t", '
        '"occurred_at": "2026-11-26T10:00:00Z"}',
        "field 'stage' is not valid Unicode",
    ),
]


@pytest.fixture
def campaign(engine: sa.Engine) -> str:
    return add_campaign(engine, "spring-launch")


def stored_events(engine: sa.Engine) -> dict[str, sa.RowMapping]:
    with engine.connect() as conn:
        return {r["event_id"]: r for r in conn.execute(sa.select(marketing_event)).mappings()}


def rejects(engine: sa.Engine) -> list[tuple[int, str, str]]:
    t = marketing_event_reject
    with engine.connect() as conn:
        return [
            tuple(r) for r in conn.execute(sa.select(t.c.line_number, t.c.reason, t.c.raw).order_by(t.c.line_number))
        ]


def test_jsonl_bad_rows_are_rejected_with_their_reason_and_valid_rows_load(
    engine: sa.Engine, campaign: str, tmp_path: Path
) -> None:
    valid = [json.dumps(event(event_id=f"ok{i}", actor_id=f"u{i}")) for i in range(3)]
    lines = [valid[0], *[line for line, _ in BAD_JSONL_LINES], "", valid[1], "   ", valid[2]]
    path = tmp_path / "events.jsonl"
    path.write_bytes(("\n".join(lines) + "\n").encode() + b'{"event_id": "\xff\xfe"}\n')

    counts = load_events_file(engine, path, batch_size=4)

    assert (counts.loaded, counts.duplicate, counts.rejected) == (3, 0, len(BAD_JSONL_LINES) + 1)
    assert set(stored_events(engine)) == {"ok0", "ok1", "ok2"}
    got = rejects(engine)
    expected_reasons = [reason for _, reason in BAD_JSONL_LINES] + ["not valid UTF-8"]
    assert len(got) == len(expected_reasons)
    for (line_number, reason, _raw), expected in zip(got, expected_reasons, strict=True):
        assert expected in reason, (line_number, reason)
    # Line numbers are the file's own: line 1 is the first valid row, bad rows start at line 2.
    assert [g[0] for g in got] == [*range(2, 2 + len(BAD_JSONL_LINES)), len(lines) + 1]
    assert got[0][2] == BAD_JSONL_LINES[0][0]


def test_an_unterminated_csv_quote_rejects_the_rest_of_the_file_with_its_lines_kept_apart(
    engine: sa.Engine, campaign: str, tmp_path: Path
) -> None:
    header = "event_id,campaign_id,stage,event_type,occurred_at"
    ok = "ok1,spring-launch,awareness,page_view,2026-11-26T10:00:00Z"
    # The quote opened on line 3 is never closed: lines 3 to 5 are one malformed row.
    tail = ['bad,spring-launch,"awareness', "page_view,2026-11-26T10:00:00Z", "more,text"]
    path = tmp_path / "events.csv"
    path.write_text("\n".join([header, ok, *tail]) + "\n")

    counts = load_events_file(engine, path)

    assert (counts.loaded, counts.rejected) == (1, 1)
    # The reject's raw text is the file's lines as written, one per line, as for every multi-line row.
    # Python's csv reports the open quote as the data ending early.
    assert rejects(engine) == [(3, "malformed CSV: unexpected end of data", "\n".join(tail))]


def test_loading_the_same_file_twice_adds_nothing(engine: sa.Engine, campaign: str, tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(
        "\n".join(
            [json.dumps(event(event_id=f"e{i}")) for i in range(5)] + ["not json", json.dumps(event(event_id="e0"))]
        )
    )
    first = load_events_file(engine, path)
    second = load_events_file(engine, path)
    assert (first.loaded, first.duplicate, first.rejected) == (5, 1, 1)
    assert (second.loaded, second.duplicate, second.rejected) == (0, 6, 1)
    assert len(stored_events(engine)) == 5
    assert len(rejects(engine)) == 1


def test_csv_with_quoted_newlines_bad_rows_and_utc_normalisation(
    engine: sa.Engine, campaign: str, tmp_path: Path
) -> None:
    path = tmp_path / "events.csv"
    path.write_bytes(
        b"event_id,campaign_id,stage,event_type,actor_id,occurred_at,source,properties\r\n"
        b'c1,spring-launch,awareness,page_view,u1,2026-11-26T23:30:00-05:00,web,"{""note"":\n ""two lines""}"\r\n'
        b"c2,spring-launch,awareness,page_view,,2026-11-26T10:00:00Z,,\r\n"
        b"c3,spring-launch,awareness,page_view,u3\r\n"
        b"c4,nope,awareness,page_view,u4,2026-11-26T10:00:00Z,web,\r\n"
        b"c5,spring-launch,awareness,page_view,u5,2026-11-26T10:00:00Z,web,{not json}\r\n"
        b"c6,spring-launch,awareness,page_view,\xff,2026-11-26T10:00:00Z,web,\r\n"
        b"c7,spring-launch,awareness,page_view,u7,2026-11-26T10:00:00Z,web,\r\n"
    )
    counts = load_events_file(engine, path, source="crm")
    assert (counts.loaded, counts.rejected) == (3, 4)
    stored = stored_events(engine)
    assert stored["c1"]["properties"] == {"note": "two lines"}
    assert stored["c1"]["occurred_at"].isoformat() == "2026-11-27T04:30:00+00:00"
    assert (stored["c2"]["actor_id"], stored["c2"]["source"], stored["c7"]["source"]) == (None, "crm", "web")
    assert [(n, reason) for n, reason, _ in rejects(engine)] == [
        # c1 spans lines 2-3 (a quoted line break), so c3 is on line 5.
        (5, "expected 8 CSV fields, got 5"),
        (6, "unknown campaign 'nope'"),
        (7, "properties is not valid JSON"),
        (8, "line is not valid UTF-8"),
    ]


def test_a_line_longer_than_the_limit_is_rejected_without_losing_the_next(
    engine: sa.Engine, campaign: str, tmp_path: Path
) -> None:
    path = tmp_path / "events.jsonl"
    huge = json.dumps(event(event_id="huge", properties={"x": "z" * (MAX_LINE_BYTES * 3)}))
    path.write_text(huge + "\n" + json.dumps(event(event_id="after")) + "\n")
    counts = load_events_file(engine, path)
    assert (counts.loaded, counts.rejected) == (1, 1)
    assert "after" in stored_events(engine)
    [(line_number, reason, raw)] = rejects(engine)
    assert line_number == 1 and "longer than" in reason and len(raw) <= 4000


def test_reading_streams_in_constant_memory(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    line = json.dumps(event(properties={"pad": "p" * 400})) + "\n"
    with path.open("w") as handle:
        for _ in range(60_000):  # about 30 MB
            handle.write(line)
    progressed = [0]

    def progress(n: int) -> None:
        progressed[0] += n

    tracemalloc.start()
    try:
        with path.open("rb") as handle:
            records = sum(1 for _ in _jsonl_records(_physical_lines(handle, progress)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert records == 60_000
    assert progressed[0] == path.stat().st_size
    assert peak < 1_000_000, f"peak {peak} bytes while reading a {path.stat().st_size} byte file"


def test_record_events_validates_all_before_writing(engine: sa.Engine, campaign: str) -> None:
    with engine.begin() as conn:
        counts = record_events(conn, [event(event_id="a"), event(event_id="b"), event(event_id="a")])
    assert (counts.loaded, counts.duplicate) == (2, 1)
    with (
        pytest.raises(InvalidInput, match=r"event 1 \('d'\): occurred_at .* has no UTC offset"),
        engine.begin() as conn,
    ):
        record_events(conn, [event(event_id="c"), event(event_id="d", occurred_at="2026-11-26T10:00:00")])
    assert set(stored_events(engine)) == {"a", "b"}


def test_the_last_ingestion_is_read_as_an_aware_utc_time(engine: sa.Engine, campaign: str) -> None:
    with engine.connect() as conn:
        assert ingestion_reading(conn, datetime.now(UTC)).last_ingested_at is None
    with engine.begin() as conn:
        record_events(conn, [event(event_id="a", occurred_at="2026-11-26T00:30:00+01:00"), event(event_id="b")])
    with engine.connect() as conn:
        reading = ingestion_reading(conn, datetime.now(UTC))
    assert reading.last_ingested_at is not None and reading.last_ingested_at.tzinfo == UTC
    assert abs(datetime.now(UTC) - reading.last_ingested_at) < timedelta(minutes=5)
    assert reading.ingested_last_hour == 2


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.jsonl", b"", "no events found"),
        ("header-only.csv", b"event_id,campaign_id,stage,event_type,occurred_at\n", "no events found"),
        ("no-header.csv", b"a,b,c\n1,2,3\n", "the CSV header lacks event_id"),
        ("garbage.jsonl", b"\x1f\x8b\x08\x00binary\nmore garbage\n", "not one line could be read"),
        ("events.txt", b"{}", "unsupported file type '.txt'"),
    ],
)
def test_events_load_command_fails_only_when_nothing_could_be_read(
    db_url: str, tmp_path: Path, name: str, content: bytes, message: str
) -> None:
    add_campaign_for(db_url)
    path = tmp_path / name
    path.write_bytes(content)
    result = CliRunner(env={"MARKETING_DATABASE_URL": db_url}).invoke(main, ["events", "load", str(path)])
    assert result.exit_code == 1, result.output
    assert message in result.output and "Traceback" not in result.output


def test_events_load_command_prints_counts(db_url: str, tmp_path: Path) -> None:
    add_campaign_for(db_url)
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps(event()) + "\n" + json.dumps(event(event_id="x", campaign_id="nope")) + "\n")
    runner = CliRunner(env={"MARKETING_DATABASE_URL": db_url})
    first = runner.invoke(main, ["events", "load", str(path)], catch_exceptions=False)
    assert first.exit_code == 0
    assert "loaded 1, duplicate 0, conflict 0, rejected 1" in first.output
    # The reasons it saw, with their first line numbers, and where to see them all.
    assert "1 x unknown campaign 'nope' (line 2)" in first.output
    assert f"events rejects --file '{path.resolve()}'" in first.output
    again = runner.invoke(main, ["events", "load", str(path)], catch_exceptions=False)
    assert "loaded 0, duplicate 1, conflict 0, rejected 1" in again.output
    listed = runner.invoke(main, ["events", "rejects", "--file", str(path), "--json"], catch_exceptions=False)
    assert [(r["line_number"], r["reason"]) for r in json.loads(listed.output)] == [(2, "unknown campaign 'nope'")]


EVENTS = 3000
BAD_LINE = 1501


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        # Each stopped the whole load with a traceback at this line, every time it was re-run.
        ({"occurred_at": "9999-12-31T23:00:00-05:00"}, "is out of range in UTC"),
        ({"occurred_at": "0001-01-01T00:00:00+05:00"}, "is out of range in UTC"),
        ('"properties": {"score": NaN}', "NaN is not a JSON number"),
        ('"properties": {"score": 1e400}', "number 1e400 is out of range"),
        ('"properties": {"score": -Infinity}', "-Infinity is not a JSON number"),
    ],
)
def test_one_bad_value_is_a_reject_and_the_rest_loads(
    engine: sa.Engine, campaign: str, tmp_path: Path, bad: Any, reason: str
) -> None:
    path = tmp_path / "events.jsonl"
    with path.open("w") as handle:
        for i in range(1, EVENTS + 1):
            line = json.dumps(event(event_id=f"e{i}"))
            if i == BAD_LINE:
                line = (
                    json.dumps(event(event_id=f"e{i}", **bad))
                    if isinstance(bad, dict)
                    else line[:-1] + ", " + bad + "}"
                )
            handle.write(line + "\n")
    counts = load_events_file(engine, path)
    assert (counts.loaded, counts.rejected) == (EVENTS - 1, 1)
    assert [(lines, r) for r, lines in counts.reasons.items()] == [([BAD_LINE], next(iter(counts.reasons)))]
    assert reason in next(iter(counts.reasons))
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(marketing_event)).scalar_one() == EVENTS - 1
        # Neither database holds non-JSON: the stored properties all parse as strict JSON.
        stored = conn.execute(sa.select(marketing_event.c.properties)).scalars().all()
    assert all(isinstance(p, dict) and "score" not in p for p in stored)


def test_record_events_refuses_non_finite_numbers_in_properties(engine: sa.Engine, campaign: str) -> None:
    with pytest.raises(InvalidInput, match="properties hold NaN or Infinity"), engine.begin() as conn:
        record_events(conn, [event(properties={"score": float("nan")})])


def test_a_csv_header_with_a_byte_order_mark_is_read(engine: sa.Engine, campaign: str, tmp_path: Path) -> None:
    path = tmp_path / "export.csv"
    header = "event_id,campaign_id,stage,event_type,occurred_at,actor_id"
    path.write_bytes(
        ("\ufeff" + header + "\n" + "c1,spring-launch,awareness,page_view,2026-11-26T09:00:00Z,u1\n").encode()
    )
    counts = load_events_file(engine, path)
    assert (counts.loaded, counts.rejected) == (1, 0)


def test_an_event_id_stored_with_different_content_is_a_conflict_not_a_duplicate(
    engine: sa.Engine, campaign: str, tmp_path: Path
) -> None:
    first = tmp_path / "first.jsonl"
    first.write_text(json.dumps(event(event_id="a")) + "\n" + json.dumps(event(event_id="b")) + "\n")
    assert load_events_file(engine, first).loaded == 2
    second = tmp_path / "second.jsonl"
    second.write_text(
        json.dumps(event(event_id="a")) + "\n"  # the same event again: a duplicate
        + json.dumps(event(event_id="b", event_type="purchase", properties={"path": "/x"})) + "\n"
    )  # fmt: skip
    counts = load_events_file(engine, second)
    assert (counts.loaded, counts.duplicate, counts.conflict, counts.rejected) == (0, 1, 1, 0)
    [(reason, lines)] = counts.reasons.items()
    assert (
        lines == [2] and reason == "event_id 'b' is already stored with a different event_type, properties; not loaded"
    )
    with engine.connect() as conn:
        assert [r["reason"] for r in list_rejects(conn, reject_file_label(second))] == [reason]
        stored = conn.execute(sa.select(marketing_event.c.event_type).where(marketing_event.c.event_id == "b")).scalar()
    assert stored == "page_view"  # the first version stays
    with engine.begin() as conn:
        app = record_events(conn, [event(event_id="a"), event(event_id="b", stage="conversion")])
    assert (app.duplicate, app.conflict) == (1, 1)
    assert app.conflicts == [("b", "event_id 'b' is already stored with a different stage; not loaded")]


def add_campaign_for(db_url: str) -> None:
    from marketing_pipelines.db.engine import get_engine

    add_campaign(get_engine(db_url), "spring-launch")


# --- the COPY path (PostgreSQL) and the INSERT paths (SQLite, small record_events batches) ---------------

# Each breaks COPY's text format unless escaped, or reads as its NULL (\N) or end-of-data marker (\.).
HOSTILE_TEXTS = [
    "tab\there",
    "new\nline",
    "carriage\rreturn",
    "back\\slash",
    "\\N",
    "\\.",
    "\\t is not a tab",
    'say "hi"',
    "é 😀 \x7f",
    "ends in \\",
]


def hostile_events() -> list[dict[str, Any]]:
    events = [
        event(
            event_id=f"h{i}-{text}",
            stage=text,
            event_type=text,
            actor_id=text,
            source=text,
            properties={text: text, "nested": [text, {"k": text}]},
        )
        for i, text in enumerate(HOSTILE_TEXTS)
    ]
    return [
        *events,
        event(event_id="no-actor", actor_id=..., source=...),
        event(event_id="empty-actor", actor_id=""),
        # Integers beyond 64 bits stay exact integers; orjson alone would make them floats.
        event(event_id="numbers", properties={"big": 12345678901234567890123, "low": -(2**64), "f": 0.1, "e": 1e-7}),
        event(event_id=12345678901234567890123),
        event(event_id="offset", occurred_at="2026-11-26T10:00:00.123456+05:30"),
    ]


def write_jsonl(path: Path, records: list[Any]) -> Path:
    # Half the lines escape non-ASCII (\u00e9), half carry it as UTF-8: both go through the parser.
    lines = [r if isinstance(r, str) else json.dumps(r, ensure_ascii=i % 2 == 0) for i, r in enumerate(records)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def snapshot(engine: sa.Engine) -> tuple[dict[str, tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Every stored event (without ingested_at) and every reject row (without rejected_at)."""
    t = marketing_event_reject
    with engine.connect() as conn:
        stored = {
            r["event_id"]: tuple(v for k, v in r.items() if k != "ingested_at")
            for r in conn.execute(sa.select(marketing_event)).mappings()
        }
        reject_rows = conn.execute(
            sa.select(t.c.line_number, t.c.reason, t.c.raw, t.c.raw_sha256).order_by(t.c.line_number, t.c.reason)
        ).all()
    return stored, [tuple(r) for r in reject_rows]


def counted(counts: LoadCounts) -> tuple[Any, ...]:
    return (counts.loaded, counts.duplicate, counts.conflict, counts.rejected, counts.unparseable, counts.reasons)


def test_copy_and_sqlite_loads_store_the_same_rows_rejects_and_conflicts(
    sqlite_url: str, pg_url: str, tmp_path: Path
) -> None:
    events = hostile_events()
    first = write_jsonl(
        tmp_path / "first.jsonl",
        [
            *events,
            events[0],  # the same event again: a duplicate
            event(event_id="nul", actor_id="a\x00b"),  # PostgreSQL text cannot hold NUL: a reject
            event(event_id="nul-properties", properties={"k": "a\x00b"}),
            '{"event_id": "tab\tinside the line"',  # not JSON; its raw line holds a tab
        ],
    )
    second = write_jsonl(
        tmp_path / "second.jsonl",
        [
            {**events[1], "stage": "changed"},  # stored with a different stage: a conflict
            {**events[2], "properties": {"\\": "\\N"}},
            event(event_id="h-new\t\\N", actor_id="\\N"),
        ],
    )
    results = {}
    for url in (sqlite_url, pg_url):
        engine = get_engine(url)
        add_campaign(engine, "spring-launch")
        # batch_size 4: the files span several chunks, so hostile rows meet chunk boundaries too.
        loads = [counted(load_events_file(engine, path, batch_size=4)) for path in (first, second)]
        results[url] = (loads, snapshot(engine))
    assert results[pg_url] == results[sqlite_url]

    (first_counts, second_counts), (stored, reject_rows) = results[pg_url]
    assert first_counts[:5] == (len(events), 1, 0, 3, 1)
    assert second_counts[:4] == (1, 0, 2, 0)
    for i, text in enumerate(HOSTILE_TEXTS):
        _, _, stage, event_type, actor_id, _, source, properties = stored[f"h{i}-{text}"]
        assert (stage, event_type, actor_id, source) == (text, text, text, text)
        assert properties == {text: text, "nested": [text, {"k": text}]}
    assert stored["h-new\t\\N"][4] == "\\N"  # the text \N, not NULL
    assert stored["no-actor"][4] is None and stored["empty-actor"][4] is None
    numbers = stored["numbers"][7]
    assert numbers == {"big": 12345678901234567890123, "low": -(2**64), "f": 0.1, "e": 1e-7}
    assert type(numbers["big"]) is int
    assert "12345678901234567890123" in stored
    assert stored["offset"][5] == datetime(2026, 11, 26, 4, 30, 0, 123456, tzinfo=UTC)
    assert [(n, reason[:40]) for n, reason, _, _ in reject_rows] == [
        (1, f"event_id {events[1]['event_id']!r} is already stored with a different stage; not loaded"[:40]),
        (2, f"event_id {events[2]['event_id']!r} is already stored with a different properties; not loaded"[:40]),
        (len(events) + 2, "field 'actor_id' contains a NUL character"[:40]),
        (len(events) + 3, "properties contain a NUL character"),
        (len(events) + 4, "not valid JSON: Invalid control characte"),
    ]
    assert reject_rows[-1][2] == '{"event_id": "tab\tinside the line"'  # the raw line, its tab kept


def test_record_events_stores_the_same_through_copy_and_through_insert(sqlite_url: str, pg_url: str) -> None:
    bulk = [*hostile_events(), *(event(event_id=f"bulk{i}", actor_id=f"u{i}") for i in range(COPY_MIN_ROWS))]
    again = [*bulk[:3], {**bulk[3], "stage": "changed"}, event(event_id="late")]
    small = COPY_MIN_ROWS // 3

    def record(url: str, batches: list[list[dict[str, Any]]]) -> tuple[tuple[Any, ...], dict[str, tuple[Any, ...]]]:
        engine = get_engine(url)
        # Several calls in one transaction, as the demo makes them: the staging table is made and dropped per call.
        with engine.begin() as conn:
            results = [record_events(conn, batch) for batch in batches]
        total = (
            sum(r.loaded for r in results),
            sum(r.duplicate for r in results),
            sum(r.conflict for r in results),
            [c for r in results for c in r.conflicts],
        )
        return total, snapshot(engine)[0]

    add_campaign(get_engine(sqlite_url), "spring-launch")
    add_campaign(get_engine(pg_url), "spring-launch")
    reference = record(sqlite_url, [bulk, again])
    through_copy = record(pg_url, [bulk, again])  # len(bulk) >= COPY_MIN_ROWS
    with get_engine(pg_url).begin() as conn:
        conn.execute(sa.delete(marketing_event))
    through_insert = record(pg_url, [bulk[i : i + small] for i in range(0, len(bulk), small)] + [again])
    assert through_copy == reference == through_insert
    assert reference[0][:3] == (len(bulk) + 1, 3, 1)


def test_record_events_copies_on_an_autocommit_connection(pg_url: str) -> None:
    # Every statement commits on its own: the staging table must outlive the statement that makes it.
    engine = get_engine(pg_url)
    add_campaign(engine, "spring-launch")
    events = [event(event_id=f"a{i}") for i in range(COPY_MIN_ROWS)]
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        assert record_events(conn, events).loaded == COPY_MIN_ROWS
        assert record_events(conn, events).duplicate == COPY_MIN_ROWS
    assert len(stored_events(engine)) == COPY_MIN_ROWS


def test_duplicates_conflicts_and_bad_lines_within_and_across_chunks(
    engine: sa.Engine, campaign: str, tmp_path: Path
) -> None:
    # Line n holds event e{n}; chunks of 10 lines: 1-10, 11-20, 21-25.
    records: list[Any] = [event(event_id=f"e{n}", actor_id=f"u{n}") for n in range(1, 26)]
    records[3 - 1] = records[1 - 1]  # e1 again in the same chunk: a duplicate
    records[10 - 1] = "not json"  # the last line of chunk 1 is bad
    records[11 - 1] = event(event_id="e11", campaign_id="nope")  # and the first of chunk 2
    records[15 - 1] = {**records[2 - 1], "stage": "conversion"}  # e2, stored by chunk 1, differs: a conflict
    records[17 - 1] = {**records[16 - 1], "event_type": "purchase"}  # e16 differs within chunk 2: a conflict
    records[21 - 1] = records[16 - 1]  # e16 again in chunk 3: a duplicate
    path = write_jsonl(tmp_path / "events.jsonl", records)

    counts = load_events_file(engine, path, batch_size=10)

    assert (counts.loaded, counts.duplicate, counts.conflict, counts.rejected) == (19, 2, 2, 2)
    assert set(stored_events(engine)) == {f"e{n}" for n in range(1, 26)} - {"e3", "e10", "e11", "e15", "e17", "e21"}
    assert stored_events(engine)["e2"]["stage"] == "awareness" and stored_events(engine)["e16"]["event_type"] == (
        "page_view"
    )
    assert {reason: lines for reason, lines in counts.reasons.items() if "JSON" not in reason} == {
        "unknown campaign 'nope'": [11],
        "event_id 'e2' is already stored with a different stage; not loaded": [15],
        "event_id 'e16' is already stored with a different event_type; not loaded": [17],
    }
    assert [n for n, _, _ in rejects(engine)] == [10, 11, 15, 17]


def padded_lines(path: Path, count: int, pad: int, campaign_of: Any = lambda n: "spring-launch") -> int:
    """``count`` lines of equal length (e0001, e0002, ...); returns the length of one with its newline."""
    lines = [
        json.dumps(event(event_id=f"e{n:04d}", campaign_id=campaign_of(n), properties={"pad": "p" * pad}))
        for n in range(1, count + 1)
    ]
    assert len({len(line) for line in lines}) == 1
    path.write_text("\n".join(lines) + "\n")
    return len(lines[0]) + 1


class Interrupted(Exception):
    pass


@pytest.mark.parametrize("chunk_bound", ["lines", "bytes"])
def test_an_interrupted_load_keeps_the_chunks_before_and_loses_the_one_being_read(
    engine: sa.Engine, campaign: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk_bound: str
) -> None:
    path = tmp_path / "events.jsonl"
    line_bytes = padded_lines(path, 1000, pad=2000)
    per_chunk = 50
    batch_size = per_chunk
    if chunk_bound == "bytes":  # a chunk also ends once its lines hold LOAD_CHUNK_BYTES
        monkeypatch.setattr(events_module, "LOAD_CHUNK_BYTES", per_chunk * (line_bytes - 1))
        batch_size = 10**6

    def progress(_: int) -> None:
        raise Interrupted  # as Ctrl-C would, the first time progress is reported

    with pytest.raises(Interrupted):
        load_events_file(engine, path, progress=progress, batch_size=batch_size)
    # Progress is first reported on reading the line that completes PROGRESS_STEP_BYTES; the lines before it
    # were read, and every full chunk among them committed, on its own, as a sequential loader commits them.
    read = -(-PROGRESS_STEP_BYTES // line_bytes) - 1
    expected = read // per_chunk * per_chunk
    assert 0 < expected < read
    assert len(stored_events(engine)) == expected


def test_a_chunk_the_database_refuses_stops_the_load_after_the_chunks_before(
    engine: sa.Engine, campaign: str, tmp_path: Path
) -> None:
    add_campaign(engine, "autumn-launch")
    path = tmp_path / "events.jsonl"
    line_bytes = padded_lines(
        path, 300, pad=8000, campaign_of=lambda n: "autumn-launch" if 150 < n <= 200 else "spring-launch"
    )
    assert PROGRESS_STEP_BYTES // line_bytes < 150  # progress is reported before the autumn-launch lines

    def delete_autumn_launch(_: int) -> None:
        with engine.begin() as conn:
            conn.execute(sa.delete(campaign_table).where(campaign_table.c.id == "autumn-launch"))

    # Validated against the campaigns of the load's start, lines 151-200 fail the foreign key in the database:
    # lines 1-150 stay, and nothing after the failed chunk is written.
    with pytest.raises(sa.exc.IntegrityError):
        load_events_file(engine, path, progress=delete_autumn_launch, batch_size=50)
    assert len(stored_events(engine)) == 150


# (JSON text, what loads_json makes of it: its value, or its exception and message)
STRICT_JSON_CASES = [
    ('{"a": 1, "b": [1.5, "x", null, true]}', {"a": 1, "b": [1.5, "x", None, True]}),
    ('{"a": 12345678901234567890123}', {"a": 12345678901234567890123}),  # orjson alone: 1.2345678901234568e+22
    ('{"a": -9223372036854775809}', {"a": -9223372036854775809}),
    ('{"a": 18446744073709551616}', {"a": 18446744073709551616}),
    ('{"a": 1.5e300, "b": 1e-400}', {"a": 1.5e300, "b": 0.0}),
    ('{"a": "\\ud83d\\ude00"}', {"a": "😀"}),
    ('{"a": "\\ud800"}', {"a": "\ud800"}),  # orjson refuses a lone surrogate; loads_json reads it, validation rejects
    ('{"a": NaN}', (ValueError, "NaN is not a JSON number")),
    ('{"a": Infinity}', (ValueError, "Infinity is not a JSON number")),
    ('{"a": -Infinity}', (ValueError, "-Infinity is not a JSON number")),
    ('{"a": 1e400}', (ValueError, "number 1e400 is out of range")),
    ('{"a": -1e400}', (ValueError, "number -1e400 is out of range")),
    ('{"a": 1,}', (json.JSONDecodeError, "Expecting property name enclosed in double quotes")),
    ("\ufeff{}", (json.JSONDecodeError, "Unexpected UTF-8 BOM")),
]


@pytest.mark.parametrize(("text", "expected"), STRICT_JSON_CASES)
def test_the_fast_parser_reads_json_as_loads_json_does(text: str, expected: Any) -> None:
    [line] = _jsonl_records(iter([(1, text.encode("utf-8"), None)]))
    if isinstance(expected, tuple):
        exception, message = expected
        for parse in (loads_json, _loads_strict):
            with pytest.raises(exception, match=re.escape(message)):
                parse(text)
        assert line.record is None and message in (line.reason or "")
    else:
        # repr tells 1 from 1.0 and an integer from a float.
        assert repr(loads_json(text)) == repr(_loads_strict(text)[0]) == repr(line.record) == repr(expected)


def test_numbers_beyond_64_bits_and_non_finite_ones_in_jsonl_and_csv(
    engine: sa.Engine, campaign: str, tmp_path: Path
) -> None:
    base = json.dumps(event(event_id="X", properties=...))[:-1]
    jsonl = tmp_path / "events.jsonl"
    jsonl.write_text(
        "\n".join(
            [
                base.replace('"X"', '"big"')
                + ', "properties": {"n": 12345678901234567890123, "m": -18446744073709551616}}',
                base.replace('"X"', "12345678901234567890123") + "}",
                base.replace('"X"', '"inf"') + ', "properties": {"n": Infinity}}',
                base.replace('"X"', '"neg"') + ', "properties": {"n": -1e400}}',
                base.replace('"X"', '"nan"') + ', "occurred_at": NaN}',
            ]
        )
        + "\n"
    )
    csv_file = tmp_path / "events.csv"
    csv_file.write_text(
        "event_id,campaign_id,stage,event_type,occurred_at,properties\n"
        'c-big,spring-launch,s,t,2026-11-26T10:00:00Z,"{""n"": 12345678901234567890123}"\n'
        'c-inf,spring-launch,s,t,2026-11-26T10:00:00Z,"{""n"": 1e400}"\n'
        'c-nan,spring-launch,s,t,2026-11-26T10:00:00Z,"{""n"": NaN}"\n'
    )
    assert load_events_file(engine, jsonl).loaded == 2
    assert load_events_file(engine, csv_file).loaded == 1
    stored = stored_events(engine)
    assert stored["big"]["properties"] == {"n": 12345678901234567890123, "m": -18446744073709551616}
    assert type(stored["big"]["properties"]["n"]) is int
    assert "12345678901234567890123" in stored
    assert stored["c-big"]["properties"] == {"n": 12345678901234567890123}
    assert [reason for _, reason, _ in rejects(engine)] == [
        "not valid JSON: Infinity is not a JSON number",
        "properties is not valid JSON: number 1e400 is out of range",
        "not valid JSON: number -1e400 is out of range",
        "properties is not valid JSON: NaN is not a JSON number",
        "not valid JSON: NaN is not a JSON number",
    ]


def test_deeply_nested_json_is_a_reject_not_a_crash(engine: sa.Engine, campaign: str, tmp_path: Path) -> None:
    deep = "[" * 5000 + "]" * 5000  # past both parsers' depth limits: loads_json raised RecursionError
    nested_300: Any = []
    for _ in range(300):  # deeper than orjson writes (254), shallower than json reads: stored as it is
        nested_300 = [nested_300]
    base = json.dumps(event(event_id="X", properties=...))[:-1]
    path = tmp_path / "events.jsonl"
    path.write_text(
        "\n".join(
            [
                base.replace('"X"', '"deep"') + ', "properties": {"a": ' + deep + "}}",
                json.dumps(event(event_id="nested", properties={"a": nested_300})),
                json.dumps(event(event_id="after")),
            ]
        )
        + "\n"
    )
    counts = load_events_file(engine, path)
    assert (counts.loaded, counts.rejected) == (2, 1)
    assert [reason for _, reason, _ in rejects(engine)] == ["not valid JSON: nested too deeply"]
    assert stored_events(engine)["nested"]["properties"] == {"a": nested_300}


@pytest.mark.parametrize("char", ["a", "é", "\x7f", "😀", '"', "\n"])
def test_the_properties_size_limit_counts_json_text_as_before(char: str) -> None:
    # Properties whose compact, ASCII-escaped JSON is exactly the limit pass; one character more does not.
    width = len(json.dumps(char)) - 2
    room = MAX_PROPERTIES_BYTES - len('{"k":""}')
    value = char * (room // width) + "a" * (room % width)
    now = datetime.now(UTC)
    for text, accepted in ((value, True), (value + "a", False)):
        line = json.dumps(event(properties={"k": text})).encode()
        [parsed] = _jsonl_records(iter([(1, line, None)]))
        assert parsed.json_native and parsed.record is not None
        if accepted:
            row = _validated_row(parsed.record, {"spring-launch"}, "file", now, parsed.json_native)
            assert row.properties == {"k": text}
            assert json.loads(row.properties_json) == {"k": text}
        else:
            with pytest.raises(InvalidEvent, match="properties are larger than"):
                _validated_row(parsed.record, {"spring-launch"}, "file", now, parsed.json_native)


def test_events_load_shows_progress_on_large_files(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_campaign_for(db_url)
    path = write_jsonl(tmp_path / "events.jsonl", [event(event_id="a"), event(event_id="b")])
    monkeypatch.setattr(cli, "PROGRESS_MIN_BYTES", 1)
    result = CliRunner(env={"MARKETING_DATABASE_URL": db_url}).invoke(
        main, ["events", "load", str(path)], catch_exceptions=False
    )
    assert result.exit_code == 0
    assert "loading events.jsonl" in result.stderr and "100%" in result.stderr
    assert result.stdout == "loaded 2, duplicate 0, conflict 0, rejected 0\n"
