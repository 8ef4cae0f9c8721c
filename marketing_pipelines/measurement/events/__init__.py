"""First-party marketing events: validation, ``record_events`` for the application, and the streaming file loader.

One module per step; import each name from its module:

- ``validate``: the checks one decoded event passes and the row it becomes (``validated_row``);
- ``json_text``: JSON text read with orjson where that reads exactly as ``strict_json.loads_json`` does;
- ``parse``: a file's bytes as bounded lines, then JSONL objects or CSV rows, each bad line with its reason;
- ``write``: rows stored in ``marketing_event`` (INSERT, or COPY on PostgreSQL), and ``record_events``;
- ``pg_copy``: the COPY text format and the temporary staging table it fills;
- ``rejects``: the ``marketing_event_reject`` rows of a file load, written and listed;
- ``files``: ``load_events_file``, which reads a file in chunks while a writer thread commits them.

The limits are read in the module that defines them: a test that patches one patches it there.
"""
