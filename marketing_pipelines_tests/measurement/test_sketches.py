"""The HLL sketches: exact while small, and the measured error of range uniques merged from daily sketches."""

from __future__ import annotations

import random

from marketing_pipelines.measurement import sketches
from marketing_pipelines_tests.factories import sketch_of


def test_small_sketches_round_to_the_exact_count_and_survive_serialization() -> None:
    for n in (0, 1, 7, 50, 300):
        data = sketches.serialize(sketch_of(f"actor-{i}" for i in range(n)))
        assert sketches.estimate(sketches.deserialize(data)) == n


def test_range_uniques_from_daily_sketches_stay_within_the_stated_error() -> None:
    """30 days, 100,000 distinct actors, each active on a few days; merged daily sketches vs the exact count."""
    rng = random.Random(4)
    days: list[set[str]] = [set() for _ in range(30)]
    for actor in range(100_000):
        for day in rng.sample(range(30), rng.randint(1, 4)):
            days[day].add(f"user-{actor}")
    daily = [sketches.serialize(sketch_of(actors)) for actors in days]
    exact = len(set().union(*days))
    merged = sketches.merge(daily)
    estimate = sketches.estimate(merged)
    error = (estimate - exact) / exact
    summed = sum(len(actors) for actors in days)
    print(f"HLL lg_k={sketches.LG_K}: exact {exact}, estimate {estimate}, error {error:+.2%}; sum of daily {summed}")
    assert merged.get_lower_bound(3) <= exact <= merged.get_upper_bound(3)
    # Three standard errors of 1.04 / sqrt(2**12).
    assert abs(error) < 3 * 1.04 / 2 ** (sketches.LG_K / 2)
    assert summed > 2 * exact  # why daily counts cannot be summed
