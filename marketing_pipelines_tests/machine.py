"""Parts of the machine a test needs (a Docker engine, Compose, HAProxy, Chromium, PostgreSQL): skipped where missing.

Locally a test whose part is missing skips with the reason and its install hint. Under CI=true it fails with
the same reason instead: .ci/run installs and starts every part it can, so a part missing there is CI's own
failure, and a skip would let CI pass without ever running what the test is for.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def require_or_skip(reason: str) -> NoReturn:
    """Skip the calling test for ``reason``, a missing part with its install hint; fail under CI=true."""
    __tracebackhide__ = True  # pytest reports the skip or failure at the caller's line
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: this test must run)")
    pytest.skip(reason)
