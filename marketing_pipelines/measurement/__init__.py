"""Campaign measurement: first-party events, the site-analytics and GitHub-downloads importers, the daily
rollup assets with their checks, schedule and sensors, and the report read from the rollup.

Each name is imported from the module that defines it (docs/ARCHITECTURE.md has the map): ``keys`` for the
asset keys, ``events`` for the event files and ``record_events``, ``importers`` for what the two services
give and how it is stored, ``rollup`` for the daily rollup and its weekly sketches, ``report`` for reading it,
``assets``, ``checks``, ``sensors``, ``freshness`` and ``schedules`` for what Dagster runs, ``defs`` for
their definitions.
"""
