"""First-party marketing events: validation, ``record_events`` for the application, and the streaming file loader.

One module per step; this package re-exports their public names:

- ``validate``: the checks one decoded event passes (``validate_event``) and the row it becomes;
- ``json_text``: JSON text read with orjson where that reads exactly as ``strict_json.loads_json`` does;
- ``parse``: a file's bytes as bounded lines, then JSONL objects or CSV rows, each bad line with its reason;
- ``write``: rows stored in ``marketing_event`` (INSERT, or COPY on PostgreSQL), and ``record_events``;
- ``pg_copy``: the COPY text format and the temporary staging table it fills;
- ``rejects``: the ``marketing_event_reject`` rows of a file load, written and listed;
- ``files``: ``load_events_file``, which reads a file in chunks while a writer thread commits them.

The limits are read in the module that defines them: a test that patches one patches it there.
"""

from marketing_pipelines.measurement.events.files import (
    LOAD_CHUNK_BYTES,
    SUPPORTED_SUFFIXES,
    file_format,
    load_events_file,
)
from marketing_pipelines.measurement.events.parse import CSV_COLUMNS, MAX_LINE_BYTES, PROGRESS_STEP_BYTES
from marketing_pipelines.measurement.events.rejects import MAX_REJECT_RAW_CHARS, list_rejects, reject_file_label
from marketing_pipelines.measurement.events.validate import (
    COMPARED_FIELDS,
    MAX_FUTURE_SKEW,
    MAX_LENGTHS,
    MAX_PROPERTIES_BYTES,
    MIN_OCCURRED_AT,
    REQUIRED_FIELDS,
    InvalidEvent,
    MarketingEvent,
    known_campaign_ids,
    parse_occurred_at,
    validate_event,
)
from marketing_pipelines.measurement.events.write import (
    BATCH_SIZE,
    COPY_MIN_ROWS,
    LOOKUP_SLICE,
    LoadCounts,
    conflict_reason,
    record_events,
)

__all__ = [
    "BATCH_SIZE",
    "COMPARED_FIELDS",
    "COPY_MIN_ROWS",
    "CSV_COLUMNS",
    "LOAD_CHUNK_BYTES",
    "LOOKUP_SLICE",
    "MAX_FUTURE_SKEW",
    "MAX_LENGTHS",
    "MAX_LINE_BYTES",
    "MAX_PROPERTIES_BYTES",
    "MAX_REJECT_RAW_CHARS",
    "MIN_OCCURRED_AT",
    "PROGRESS_STEP_BYTES",
    "REQUIRED_FIELDS",
    "SUPPORTED_SUFFIXES",
    "InvalidEvent",
    "LoadCounts",
    "MarketingEvent",
    "conflict_reason",
    "file_format",
    "known_campaign_ids",
    "list_rejects",
    "load_events_file",
    "parse_occurred_at",
    "record_events",
    "reject_file_label",
    "validate_event",
]
