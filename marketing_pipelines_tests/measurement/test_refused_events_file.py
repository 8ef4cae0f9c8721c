"""A file ``events load`` refuses stores nothing: the refusal comes before its lines become reject rows.

A symlink named .jsonl that points at /etc/passwd used to store the first lines of /etc/passwd in
marketing_event_reject (where ``events rejects`` shows them) and only then say it was the wrong file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from marketing_pipelines.cli import main
from marketing_pipelines.db.schema import marketing_event, marketing_event_reject
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.measurement.events.files import load_events_file
from marketing_pipelines_tests.factories import add_campaign

EVENT = {
    "event_id": "e1",
    "campaign_id": "spring-launch",
    "stage": "awareness",
    "event_type": "page_view",
    "occurred_at": "2026-11-26T10:00:00+01:00",
}


def _stored(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            table.name: conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()
            for table in (marketing_event, marketing_event_reject)
        }


NOTHING = {"marketing_event": 0, "marketing_event_reject": 0}


@pytest.mark.parametrize(
    ("name", "target", "message"),
    [
        # A system file behind a symlink named like an events file: not one line is JSON.
        ("events.jsonl", "/etc/passwd", "not one line could be read as a JSONL record"),
        # The same file read as CSV: its first line is no events header.
        ("events.csv", "/etc/passwd", "the CSV header lacks event_id"),
        # A device, not a file: /dev/zero would be read forever, a named pipe would block.
        ("events.jsonl", "/dev/null", "not a regular file"),
    ],
)
def test_events_load_of_a_refused_file_is_one_line_and_stores_nothing(
    db_url: str, engine: sa.Engine, tmp_path: Path, name: str, target: str, message: str
) -> None:
    if not os.path.exists(target):
        pytest.skip(f"{target} does not exist here")
    add_campaign(engine)
    link = tmp_path / name
    link.symlink_to(target)
    result = CliRunner(env={"MARKETING_DATABASE_URL": db_url}).invoke(main, ["events", "load", str(link)])
    assert result.exit_code == 1, result.output
    [line] = result.output.splitlines()
    assert line.startswith(f"Error: {link}: ") and message in line
    assert _stored(engine) == NOTHING


def test_a_file_whose_first_chunk_holds_no_record_is_refused_before_it_is_stored(
    engine: sa.Engine, tmp_path: Path
) -> None:
    add_campaign(engine)
    path = tmp_path / "events.jsonl"
    # Five lines of something else, then events: the first chunk of four is refused before it is written.
    path.write_text("".join(f"root:x:{i}:0::/root:/bin/sh\n" for i in range(5)) + json.dumps(EVENT) + "\n")
    with pytest.raises(InvalidInput, match="none of its first 4 lines could be read as a JSONL record"):
        load_events_file(engine, path, batch_size=4)
    assert _stored(engine) == NOTHING


def test_a_records_file_still_stores_its_rejects(engine: sa.Engine, tmp_path: Path) -> None:
    add_campaign(engine)
    path = tmp_path / "events.jsonl"
    # A bad line before the first record of its chunk is a reject, as before; only a chunk without any is refused.
    path.write_text("not json\n" + json.dumps(EVENT) + "\n")
    counts = load_events_file(engine, path, batch_size=4)
    assert (counts.loaded, counts.rejected) == (1, 1)
    assert _stored(engine) == {"marketing_event": 1, "marketing_event_reject": 1}
