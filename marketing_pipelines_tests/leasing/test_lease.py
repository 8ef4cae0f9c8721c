"""The shared lease protocol on both databases: claim limits, fencing, expiry, retries, hand-backs."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from marketing_pipelines.db.schema import marketing_execution as t
from marketing_pipelines.executions.queue import EXECUTIONS, begin_attempts, get_execution, start_attempts
from marketing_pipelines.leasing import lease
from marketing_pipelines_tests.factories import add_campaign, bulk_due_executions


def _claim(engine: sa.Engine, owner: str, limit: int, lease_s: float = 60) -> list[int]:
    with engine.begin() as conn:
        return [row["id"] for row in lease.claim_batch(conn, EXECUTIONS, owner, limit, lease_s)]


def _begin(engine: sa.Engine, row_id: int, owner: str) -> None:
    """What a run's worker records of a row it took over just before dispatching its action."""
    with engine.begin() as conn:
        start_attempts(conn, [get_execution(conn, row_id)], "run-1")  # type: ignore[list-item]
        assert begin_attempts(conn, [row_id], owner) == {row_id}


def _row(engine: sa.Engine, row_id: int) -> sa.RowMapping:
    with engine.connect() as conn:
        row = get_execution(conn, row_id)
    assert row is not None
    return row


def test_claim_takes_at_most_limit_in_due_order_and_never_twice(engine: sa.Engine) -> None:
    add_campaign(engine)
    bulk_due_executions(engine, 25)
    first = _claim(engine, "a", 10)
    second = _claim(engine, "b", 10)
    third = _claim(engine, "c", 10)
    assert (len(first), len(second), len(third)) == (10, 10, 5)
    assert not set(first) & set(second) and not set(second) & set(third)
    with engine.connect() as conn:
        dues = dict(conn.execute(sa.select(t.c.id, t.c.due_at)).all())
    assert max(dues[i] for i in first) <= min(dues[i] for i in second)
    assert _claim(engine, "d", 10) == []
    row = _row(engine, first[0])
    assert (row["status"], row["lease_owner"], row["attempts"]) == ("RUNNING", "a", 1)


def test_rows_due_in_the_future_are_not_claimed(engine: sa.Engine) -> None:
    add_campaign(engine)
    bulk_due_executions(engine, 3)
    far_future = _row(engine, 1)["created_at"].replace(year=2099)
    with engine.begin() as conn:
        conn.execute(sa.update(t).where(t.c.id == 1).values(due_at=far_future))
    assert sorted(_claim(engine, "a", 10)) == [2, 3]


def test_stale_owner_cannot_renew_finish_or_fail(engine: sa.Engine) -> None:
    add_campaign(engine)
    bulk_due_executions(engine, 1)
    [row_id] = _claim(engine, "old", 1, lease_s=60)
    _begin(engine, row_id, "old")
    with engine.begin() as conn:
        assert lease.recover_expired(conn, EXECUTIONS, at=_after(61)).requeued == (row_id,)
    assert _claim(engine, "new", 1) == [row_id]
    with engine.begin() as conn:
        assert lease.renew_many(conn, EXECUTIONS, [row_id], "old", 60) == set()
        assert lease.finish(conn, EXECUTIONS, row_id, "old", "SUCCEEDED") is False
        assert lease.retry_or_fail(conn, EXECUTIONS, row_id, "old", "boom", 0) is None
    row = _row(engine, row_id)
    assert (row["status"], row["lease_owner"], row["attempts"]) == ("RUNNING", "new", 2)
    with engine.begin() as conn:
        assert lease.renew_many(conn, EXECUTIONS, [row_id], "new", 60) == {row_id}
        assert lease.finish(conn, EXECUTIONS, row_id, "new", "SUCCEEDED") is True
    assert _row(engine, row_id)["status"] == "SUCCEEDED"


def _after(seconds: float) -> datetime:
    """An instant ``seconds`` from now, for recover_expired to judge leases by instead of waiting."""
    return datetime.now(UTC) + timedelta(seconds=seconds)


def test_a_lease_expires_at_its_end_and_not_before(engine: sa.Engine) -> None:
    add_campaign(engine)
    bulk_due_executions(engine, 1)
    [row_id] = _claim(engine, "w", 1, lease_s=60)
    with engine.begin() as conn:
        assert lease.recover_expired(conn, EXECUTIONS, at=_after(55)) == lease.Recovery((), ())
    assert _row(engine, row_id)["status"] == "RUNNING"
    with engine.begin() as conn:
        assert lease.recover_expired(conn, EXECUTIONS, at=_after(65)).requeued == (row_id,)
    assert _row(engine, row_id)["status"] == "SCHEDULED"


def _expire_one(engine: sa.Engine, owner: str, began: bool = True) -> lease.Recovery:
    assert _claim(engine, owner, 1, lease_s=60) == [1]
    if began:
        _begin(engine, 1, owner)
    with engine.begin() as conn:
        return lease.recover_expired(conn, EXECUTIONS, at=_after(61))


def test_an_expired_lease_loses_the_attempt_without_spending_it_until_max_lost_attempts(engine: sa.Engine) -> None:
    add_campaign(engine)
    bulk_due_executions(engine, 1, max_attempts=2)
    # Expired leases past max_attempts: each attempt was lost (a killed worker, a database restart),
    # not spent, so the row goes back to the queue with its last attempt moved out by one.
    for attempt in range(1, lease.MAX_LOST_ATTEMPTS):
        assert _expire_one(engine, f"w{attempt}") == lease.Recovery((1,), ())
        row = _row(engine, 1)
        assert (row["status"], row["attempts"], row["lost_attempts"]) == ("SCHEDULED", attempt, attempt)
        assert row["max_attempts"] == 2 + attempt and row["last_error"] == lease.LEASE_EXPIRED_ERROR
    # One that kills every worker it reaches still ends: FAILED at MAX_LOST_ATTEMPTS, saying so.
    assert _expire_one(engine, "last") == lease.Recovery((), (1,))
    row = _row(engine, 1)
    assert (row["status"], row["attempts"], row["lost_attempts"]) == ("FAILED", 5, lease.MAX_LOST_ATTEMPTS)
    assert row["last_error"] == f"{lease.LOST_ATTEMPTS_ERROR}; {lease.LEASE_EXPIRED_ERROR}"
    assert row["finished_at"] is not None and row["lease_owner"] is None


def test_a_lost_attempt_leaves_the_whole_budget_to_failures_of_the_work(engine: sa.Engine) -> None:
    add_campaign(engine)
    bulk_due_executions(engine, 1, max_attempts=2)
    # Lost twice (a lease expiry, then a run that failed before recording the row), then two
    # answers of 500: the second 500 is the last attempt of the two the row was given.
    assert _expire_one(engine, "expired") == lease.Recovery((1,), ())
    _claim(engine, "run-failed", 1)
    _begin(engine, 1, "run-failed")
    with engine.begin() as conn:
        assert lease.retry_or_fail(conn, EXECUTIONS, 1, "run-failed", "run failed", 0, lost=True) == "SCHEDULED"
    for owner, status in (("w1", "SCHEDULED"), ("w2", "FAILED")):
        _claim(engine, owner, 1)
        with engine.begin() as conn:
            assert lease.retry_or_fail(conn, EXECUTIONS, 1, owner, "HTTP 500", retry_delay_s=0) == status
    row = _row(engine, 1)
    assert (row["attempts"], row["lost_attempts"], row["max_attempts"]) == (4, 2, 4)
    assert row["last_error"] == "HTTP 500"


def test_live_lease_is_not_recovered(engine: sa.Engine) -> None:
    add_campaign(engine)
    bulk_due_executions(engine, 1)
    _claim(engine, "w", 1, lease_s=60)
    with engine.begin() as conn:
        assert lease.recover_expired(conn, EXECUTIONS) == lease.Recovery((), ())
    assert _row(engine, 1)["status"] == "RUNNING"


def test_retry_or_fail_moves_due_and_counts_attempts(engine: sa.Engine) -> None:
    add_campaign(engine)
    bulk_due_executions(engine, 1, max_attempts=2)
    _claim(engine, "w", 1)
    with engine.begin() as conn:
        assert lease.retry_or_fail(conn, EXECUTIONS, 1, "w", "HTTP 500", retry_delay_s=3600) == "SCHEDULED"
    row = _row(engine, 1)
    assert row["last_error"] == "HTTP 500" and row["lease_owner"] is None
    assert row["due_at"] > row["updated_at"]  # backed off into the future, so not claimable now
    assert _claim(engine, "w2", 1) == []
    with engine.begin() as conn:
        conn.execute(sa.update(t).values(due_at=row["created_at"]))
    _claim(engine, "w2", 1)
    with engine.begin() as conn:
        assert lease.retry_or_fail(conn, EXECUTIONS, 1, "w2", "HTTP 500 again", retry_delay_s=0) == "FAILED"
    assert _row(engine, 1)["finished_at"] is not None


def test_lease_keeper_renews_and_notices_loss(engine: sa.Engine) -> None:
    add_campaign(engine)
    bulk_due_executions(engine, 1)
    _claim(engine, "w", 1, lease_s=1.5)
    lost: list[str] = []
    with lease.LeaseKeeper(engine, EXECUTIONS, 1, "w", 1.5, on_lost=lost.append) as keeper:
        time.sleep(2.5)  # longer than the lease: only renewals keep it alive
        with engine.begin() as conn:
            assert lease.recover_expired(conn, EXECUTIONS) == lease.Recovery((), ())
            # Someone else takes the row (as after an expiry); the keeper must notice.
            conn.execute(sa.update(t).where(t.c.id == 1).values(lease_owner="thief"))
        assert keeper.lost.wait(timeout=3)
    assert lost and "lease lost" in lost[0]


def test_hold_for_extends_the_lease_and_the_keeper_no_longer_shortens_it(engine: sa.Engine) -> None:
    # An agent step retried after a rate limit waits on purpose: its row must stay its own for the wait,
    # not expire as if its worker had died (the claiming tick would then mark a healthy run FAILURE).
    add_campaign(engine)
    bulk_due_executions(engine, 1)
    _claim(engine, "w", 1, lease_s=1.5)
    with lease.LeaseKeeper(engine, EXECUTIONS, 1, "w", 1.5) as keeper:
        time.sleep(0.6)  # the keeper has renewed at least once
        assert keeper.hold_for(60) == {1}
        time.sleep(1.2)  # a keeper still running would have set the lease back to 1.5 s
    with engine.begin() as conn:
        assert lease.recover_expired(conn, EXECUTIONS) == lease.Recovery((), ())
    remaining = _row(engine, 1)["lease_expires_at"] - datetime.now(UTC)
    assert remaining > timedelta(seconds=55), remaining


def test_an_expired_lease_whose_action_never_began_gives_its_attempt_back(engine: sa.Engine) -> None:
    add_campaign(engine)
    bulk_due_executions(engine, 1, max_attempts=1)
    due = _row(engine, 1)["due_at"]
    # A claim whose run never started, again and again (a launcher that fails every launch): more hand-backs
    # than MAX_LOST_ATTEMPTS, and the row's one attempt is still to come.
    for n in range(1, lease.MAX_LOST_ATTEMPTS + 4):
        recovery = _expire_one(engine, f"claim:{n}", began=False)
        assert recovery == lease.Recovery((1,), (), claims={f"claim:{n}": (1,)}, handed_back=(1,))
        row = _row(engine, 1)
        assert (row["status"], row["attempts"], row["lost_attempts"], row["max_attempts"]) == ("SCHEDULED", 0, 0, 1)
        assert (row["unstarted_runs"], row["handed_back"]) == (n, n)
        assert row["last_error"] == lease.LEASE_EXPIRED_UNBEGUN_ERROR
        # The first is due again at once, in its place; each later one after a delay that grows, capped.
        delay = lease.unstarted_delay_seconds(n)
        assert row["due_at"] == (due if delay == 0 else row["updated_at"] + timedelta(seconds=delay))
        with engine.begin() as conn:  # as if the delay had passed
            conn.execute(sa.update(t).values(due_at=due))
    assert [lease.unstarted_delay_seconds(n) for n in range(1, 10)] == [0, 5, 10, 20, 40, 80, 160, 300, 300]
    # An attempt that reaches its action starts the count again, and is a try like any other.
    assert _expire_one(engine, "worker", began=True) == lease.Recovery((1,), ())
    row = _row(engine, 1)
    assert (row["attempts"], row["lost_attempts"], row["unstarted_runs"], row["handed_back"]) == (1, 1, 0, 8)


def test_a_taken_over_row_whose_action_never_began_is_handed_back_and_its_attempt_row_goes(engine: sa.Engine) -> None:
    add_campaign(engine)
    bulk_due_executions(engine, 2)
    _claim(engine, "run:a", 2)
    with engine.begin() as conn:  # the run took both over; it dispatched the first one's action only
        start_attempts(conn, [get_execution(conn, 1), get_execution(conn, 2)], "a")  # type: ignore[list-item]
        assert begin_attempts(conn, [1], "run:a") == {1}
        recovery = lease.recover_expired(conn, EXECUTIONS, at=_after(61))
    assert recovery == lease.Recovery((1, 2), (), handed_back=(2,))
    assert [(_row(engine, i)["attempts"], _row(engine, i)["lost_attempts"]) for i in (1, 2)] == [(1, 1), (0, 0)]


def test_begin_attempts_begins_only_rows_the_owner_holds_with_a_live_lease(engine: sa.Engine) -> None:
    add_campaign(engine)
    bulk_due_executions(engine, 3)
    _claim(engine, "run:a", 3)
    with engine.begin() as conn:
        start_attempts(conn, [get_execution(conn, i) for i in (1, 2, 3)], "a")  # type: ignore[misc]
        conn.execute(sa.update(t).where(t.c.id == 2).values(lease_owner="run:b"))  # another attempt's now
        conn.execute(sa.update(t).where(t.c.id == 3).values(lease_expires_at=datetime.now(UTC) - timedelta(seconds=1)))
        assert begin_attempts(conn, [1, 2, 3], "run:a") == {1}
        assert begin_attempts(conn, [1], "run:a") == {1}  # again (a retried step): its first began_at stays


def test_fence_leases_shortens_to_after_the_last_renewal_and_never_lengthens(engine: sa.Engine) -> None:
    add_campaign(engine)
    bulk_due_executions(engine, 3)
    _claim(engine, "run:a", 3, lease_s=300)
    with engine.begin() as conn:
        conn.execute(sa.update(t).values(run_id="a"))
        conn.execute(sa.update(t).where(t.c.id == 3).values(lease_owner="run:b"))  # not this run's
        assert lease.fence_leases(conn, EXECUTIONS, [1, 2, 3], "run:a", "a", 15) == {1, 2}
    for i in (1, 2):
        row = _row(engine, i)
        assert row["lease_expires_at"] == row["updated_at"] + timedelta(seconds=15)
    assert _row(engine, 3)["lease_expires_at"] > _row(engine, 3)["updated_at"] + timedelta(seconds=200)
    with engine.begin() as conn:  # a second report of the failure changes nothing, nor does a longer fence
        assert lease.fence_leases(conn, EXECUTIONS, [1, 2], "run:a", "a", 15) == {1, 2}
        assert lease.fence_leases(conn, EXECUTIONS, [1, 2], "run:a", "a", 60) == {1, 2}
    row = _row(engine, 1)
    assert row["lease_expires_at"] == row["updated_at"] + timedelta(seconds=15)
    # A dead worker renews nothing: 15 s after its last renewal the rows expire and are requeued.
    with engine.begin() as conn:
        assert lease.recover_expired(conn, EXECUTIONS, at=row["updated_at"] + timedelta(seconds=16)).requeued == (1, 2)


def test_the_keeper_renews_every_few_seconds_whatever_the_lease() -> None:
    for lease_s, heartbeat in ((300, lease.HEARTBEAT_SECONDS), (6, 2.0), (1.2, 0.5)):
        assert lease.LeaseKeeper(None, EXECUTIONS, [], "w", lease_s).heartbeat_seconds == heartbeat  # type: ignore[arg-type]


def test_a_keeper_whose_run_ended_begins_nothing_hands_back_the_unbegun_and_keeps_what_is_in_flight(
    engine: sa.Engine,
) -> None:
    add_campaign(engine)
    bulk_due_executions(engine, 3)
    _claim(engine, "run:a", 3, lease_s=1.5)
    with engine.begin() as conn:
        start_attempts(conn, [get_execution(conn, i) for i in (1, 2, 3)], "a")  # type: ignore[misc]
    ended: list[str | None] = [None]
    stopped: list[str] = []

    def mark(ids: list[int]) -> set[int]:
        with engine.begin() as conn:
            return begin_attempts(conn, ids, "run:a")

    with lease.LeaseKeeper(
        engine, EXECUTIONS, [1, 2, 3], "run:a", 1.5, run_ended=lambda: ended[0], on_stopped=stopped.append
    ) as keeper:
        assert keeper.begin([1], mark) == {1}  # in flight
        ended[0] = "Dagster run a is FAILURE, no longer STARTING or STARTED"
        assert keeper.check_run() == ended[0] and keeper.stopped.is_set()
        assert keeper.begin([2], mark) == set()  # nothing begins any more
        time.sleep(2.5)  # past the lease: only the row in flight is still renewed
        with engine.begin() as conn:
            recovery = lease.recover_expired(conn, EXECUTIONS)
    assert recovery == lease.Recovery((2, 3), (), handed_back=(2, 3))
    assert _row(engine, 1)["status"] == "RUNNING"
    assert len(stopped) == 1 and "2 execution(s) not begun" in stopped[0] and "1 in flight" in stopped[0]
