"""Event ingestion: each bad row rejected with its reason, nothing valid lost, loads idempotent and streaming."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from marketing_pipelines.cli import main
from marketing_pipelines.db.campaigns import InvalidInput
from marketing_pipelines.db.schema import marketing_event, marketing_event_reject
from marketing_pipelines.measurement.events import (
    MAX_LINE_BYTES,
    _jsonl_records,
    _physical_lines,
    list_rejects,
    load_events_file,
    record_events,
    reject_file_label,
)
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
    result = CliRunner().invoke(main, ["events", "load", str(path)])
    assert result.exit_code == 1, result.output
    assert message in result.output and "Traceback" not in result.output


def test_events_load_command_prints_counts(db_url: str, tmp_path: Path) -> None:
    add_campaign_for(db_url)
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps(event()) + "\n" + json.dumps(event(event_id="x", campaign_id="nope")) + "\n")
    runner = CliRunner()
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
