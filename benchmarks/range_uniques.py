"""Error of the report's unique actors over a range (the union of daily HLL sketches) against the exact count.

Each campaign (one seed each) has one stage with ``--event-types`` event types and a population
of actors; every day a ``--active-share`` of the population, drawn with repetition, acts once with
a random event type. Over the last 7, 30 and 90 days this compares with the exact distinct actors:

- ``type total``: one event type over the range, the merge of its daily sketches (report totals);
- ``stage``: the stage over the range, the merge of every event type's daily sketches (report funnel).

By default the sketches are built in memory exactly as the rollup builds them (sketches.py
``new_sketch``, one ``update`` per distinct actor id string of the row and day, ``serialize``)
and merged exactly as the report merges them (``merge``, ``estimate``): the database only decides
which actor ids reach which sketch, so this measures the real path at any population size. With
``--database sqlite`` or ``postgres`` the events go through ``marketing_event``,
``replace_rollup_days`` and ``measurement_report`` instead (slower; meant for smaller populations,
and as the check that both give the same errors).

    python benchmarks/range_uniques.py --actors 1000 10000 100000 1000000 --campaigns 5
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from datetime import UTC, date, datetime, timedelta

import numpy as np
import pandas as pd
from _common import print_table, throwaway_database
from _measurement_events import EVENT_TYPES, load_events

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.measurement import sketches
from marketing_pipelines.measurement.report.build import measurement_report
from marketing_pipelines.measurement.rollup.daily import replace_rollup_days

FIRST_DAY = date(2026, 1, 1)
STAGE = "signup"
Key = tuple[int, str, str]  # window days, "type total" | "stage", event type ("" for the stage)


def actor_vocab(campaign_id: str, actors: int) -> np.ndarray:
    # Ids differ per campaign so that campaigns are independent trials: the same ids hash the same way,
    # and campaigns sharing a population would repeat one sketch error instead of sampling it.
    return np.array([f"{campaign_id}/actor-{i}" for i in range(actors)], dtype=object)


def campaign_activity(seed: int, actors: int, days: int, active_share: float, event_types: int) -> pd.DataFrame:
    """One row per action: day (0-based), event type (index), actor (index into the population)."""
    rng = np.random.default_rng(seed)
    per_day = max(1, round(actors * active_share))
    return pd.DataFrame(
        {
            "day": np.repeat(np.arange(days), per_day),
            "event_type": rng.integers(0, event_types, size=days * per_day),
            "actor": rng.integers(0, actors, size=days * per_day),
        }
    )


def exact_uniques(activity: pd.DataFrame, windows: list[int], days: int) -> dict[Key, int]:
    exact: dict[Key, int] = {}
    for window in windows:
        in_range = activity[activity["day"] >= days - window]
        exact[(window, "stage", "")] = int(in_range["actor"].nunique())
        for event_type, actors in in_range.groupby("event_type")["actor"]:
            exact[(window, "type total", EVENT_TYPES[int(event_type)])] = int(actors.nunique())
    return exact


def in_memory_estimates(activity: pd.DataFrame, vocab: np.ndarray, windows: list[int], days: int) -> dict[Key, int]:
    daily: dict[tuple[int, str], bytes] = {}
    for (day, event_type), actors in activity.groupby(["day", "event_type"])["actor"]:
        sketch = sketches.new_sketch()
        for actor_id in vocab[np.unique(actors.to_numpy())]:
            sketch.update(actor_id)
        daily[(int(day), EVENT_TYPES[int(event_type)])] = sketches.serialize(sketch)
    estimates: dict[Key, int] = {}
    for window in windows:
        # The report merges its rows ordered by day, then event type; HLL unions depend slightly on the order.
        in_range = {key: daily[key] for key in sorted(daily) if key[0] >= days - window}
        estimates[(window, "stage", "")] = sketches.estimate(sketches.merge(in_range.values()))
        by_type: defaultdict[str, list[bytes]] = defaultdict(list)
        for (_, event_type), data in in_range.items():
            by_type[event_type].append(data)
        for event_type, members in by_type.items():
            estimates[(window, "type total", event_type)] = sketches.estimate(sketches.merge(members))
    return estimates


def as_events(campaign_id: str, activity: pd.DataFrame, vocab: np.ndarray, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed + 1_000_003)
    start = np.datetime64(datetime.combine(FIRST_DAY, datetime.min.time()), "us")
    offsets = activity["day"].to_numpy() * 86_400_000_000 + rng.integers(0, 86_400_000_000, size=len(activity))
    return pd.DataFrame(
        {
            "campaign_id": campaign_id,
            "stage": STAGE,
            "event_type": np.array(EVENT_TYPES, dtype=object)[activity["event_type"].to_numpy()],
            "actor_id": vocab[activity["actor"].to_numpy()],
            "occurred_at": pd.DatetimeIndex(start + offsets.astype("timedelta64[us]")).tz_localize(UTC),
        }
    )


def database_estimates(
    database: str, activities: dict[str, pd.DataFrame], actors: int, windows: list[int], days: int
) -> dict[str, dict[Key, int]]:
    """The same activity through marketing_event, the daily rollup and measurement_report."""
    frame = pd.concat(
        [
            as_events(cid, activity, actor_vocab(cid, actors), seed)
            for seed, (cid, activity) in enumerate(activities.items())
        ],
        ignore_index=True,
    )
    last = FIRST_DAY + timedelta(days=days - 1)
    with throwaway_database(database) as url:
        load_events(url, frame)
        engine = get_engine(url)
        for offset in range(days):
            replace_rollup_days(engine, [FIRST_DAY + timedelta(days=offset)])
        estimates: dict[str, dict[Key, int]] = {}
        with engine.connect() as conn:
            for cid in activities:
                got: dict[Key, int] = {}
                for window in windows:
                    report = measurement_report(conn, cid, last - timedelta(days=window - 1), last)
                    for step in report.funnel:
                        got[(window, "stage", "")] = step.unique_actors
                    for total in report.totals:
                        got[(window, "type total", total.event_type)] = total.unique_actors or 0
                estimates[cid] = got
    return estimates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actors", type=int, nargs="+", default=[1_000, 10_000, 100_000], help="population sizes")
    parser.add_argument("--days", type=int, nargs="+", default=[7, 30, 90], help="range lengths, ending on one day")
    parser.add_argument("--campaigns", type=int, default=5, help="campaigns (seeds) per population size")
    parser.add_argument("--active-share", type=float, default=0.1, help="share of the population acting per day")
    parser.add_argument("--event-types", type=int, default=3, choices=range(1, len(EVENT_TYPES) + 1))
    parser.add_argument(
        "--database",
        choices=["memory", "postgres", "sqlite"],
        nargs="+",
        default=["memory"],
        help="memory (default): sketches.py in memory; postgres/sqlite: through the rollup and the report",
    )
    args = parser.parse_args()
    windows, days = sorted(args.days), max(args.days)
    for database in args.database:
        rows = []
        for actors in args.actors:
            activities = {
                f"bench-{seed:02d}": campaign_activity(seed, actors, days, args.active_share, args.event_types)
                for seed in range(args.campaigns)
            }
            if database == "memory":
                estimates = {
                    cid: in_memory_estimates(a, actor_vocab(cid, actors), windows, days)
                    for cid, a in activities.items()
                }
            else:
                estimates = database_estimates(database, activities, actors, windows, days)
            errors: defaultdict[tuple[int, str], list[float]] = defaultdict(list)
            exact_sizes: defaultdict[tuple[int, str], list[int]] = defaultdict(list)
            for cid, activity in activities.items():
                for key, exact in exact_uniques(activity, windows, days).items():
                    errors[key[:2]].append((estimates[cid][key] - exact) / exact * 100)
                    exact_sizes[key[:2]].append(exact)
            for (window, value), errs in sorted(errors.items()):
                rows.append(
                    (
                        actors,
                        window,
                        value,
                        len(errs),
                        round(float(np.mean(exact_sizes[(window, value)]))),
                        math.sqrt(float(np.mean(np.square(errs)))),
                        max(abs(x) for x in errs),
                        float(np.mean(errs)),
                    )
                )
        print_table(
            f"range unique actors, HLL (lg_k {sketches.LG_K}) vs exact, {database}, {args.campaigns} campaigns, "
            f"{args.active_share:.0%} of the population active per day, {args.event_types} event types",
            ["actors", "days", "value", "values", "mean exact", "RMS err %", "max |err| %", "mean err %"],
            rows,
        )


if __name__ == "__main__":
    main()
