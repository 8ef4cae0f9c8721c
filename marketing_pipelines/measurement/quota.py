"""Each measurement source's request quota as a token bucket every replica shares.

The bucket is a row of ``model_rate_limit`` (db/token_bucket.py; provider ``source:<name>``, model ``*``, unit
``requests``), sized from the source's contract so that no period of the quota, however aligned, admits more than
the quota (``Quota.burst``). An importer's HTTP client asks the gate before every request it sends, its own
retries included; a request that would wait longer than a step should hold raises ``QuotaExhausted`` unsent, and
the asset hands the step back to Dagster to retry when the bucket has refilled. A backfill of many range runs on
several replicas thus spends the source's quota at its documented rate instead of meeting its 429s.

An operator who knows the account's own limit (a paid plan, a token shared with other tools) resizes the row with
``marketing-pipelines limits set source:<name> --calls-per-minute N --burst B``; it is never resized back.
"""

from __future__ import annotations

import httpx
import sqlalchemy as sa

from marketing_pipelines.db import token_bucket
from marketing_pipelines.db.schema import EVERY_MODEL
from marketing_pipelines.measurement.importers.base import QuotaExhausted, RequestGate
from marketing_pipelines.measurement.sources import Source

# The longest a step waits in-process for its source's next request; longer waits free the worker (Dagster retry).
MAX_WAIT_S = 30.0


def ensure_quota(engine: sa.Engine, source: Source) -> None:
    """Create the source's bucket from its contract if it does not exist (full); an existing one is kept as is."""
    quota = source.contract.quota
    with engine.begin() as conn:
        token_bucket.ensure_limit(
            conn, source.quota_bucket, EVERY_MODEL, "requests", quota.per_minute, burst=quota.burst
        )


def request_gate(engine: sa.Engine, source: Source, max_wait_s: float = MAX_WAIT_S) -> RequestGate:
    """The hook an importer's client calls before each request: one request from the shared bucket, or raise."""
    ensure_quota(engine, source)
    name = source.quota_bucket

    def gate(request: httpx.Request) -> None:
        try:
            token_bucket.admit(engine, name, EVERY_MODEL, {"requests": 1}, max_wait_s=max_wait_s)
        except token_bucket.ModelRateLimited as exc:
            raise QuotaExhausted(
                source.name,
                exc.retry_after_s,
                f"{name}'s shared request quota ({source.contract.quota.requests} per "
                f"{source.contract.quota.period_s:.0f} s) is spent; the request was not sent",
            ) from None

    return gate
