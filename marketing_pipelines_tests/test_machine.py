"""A missing part of the machine skips its test locally and fails it under CI=true, with the same reason."""

from __future__ import annotations

import pytest

from marketing_pipelines_tests.machine import require_or_skip

REASON = "haproxy is not installed (Debian: apt-get install haproxy)"


@pytest.mark.parametrize(
    ("ci", "outcome"),
    [
        # A developer's machine: the test is left out, with the install hint.
        (None, pytest.skip.Exception),
        ("false", pytest.skip.Exception),
        # CI: .ci/run installs every part, so one missing is a failure.
        ("true", pytest.fail.Exception),
    ],
)
def test_a_missing_part_skips_locally_and_fails_under_ci(
    ci: str | None, outcome: type[BaseException], monkeypatch: pytest.MonkeyPatch
) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome) as raised:
        require_or_skip(REASON)
    assert str(raised.value).startswith(REASON)
