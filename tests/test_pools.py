"""Fleets of pools, the pure part: the split of a fleet's demand over its pools (``keda_llm_scaler.pools``),
the cost functions, and the trigger keys that declare a pool (``keda_llm_scaler.metadata``)."""

from __future__ import annotations

import itertools
import math

import pytest

from keda_llm_scaler.errors import BadMetadata
from keda_llm_scaler.metadata import KNOWN_KEYS, metadata_hints, parse_trigger
from keda_llm_scaler.pools import (
    PoolReading,
    PoolSpec,
    cost_per_million_tokens,
    parse_tier,
    pool_cost_per_hour,
    pool_reading,
    split,
)

RESERVED = PoolSpec("chat", "a100", tier=0, size=4, cost_per_hour=4.0)
BURST = PoolSpec("chat", "l4", tier=1, size=None, cost_per_hour=1.5)


def reading(spec: PoolSpec, value: float | None, unit: float | None = 10.0, members: int = 0) -> PoolReading:
    return PoolReading(spec, value, unit, members)


def values(readings: list[PoolReading]) -> dict[str, float]:
    return {pool: share.value for pool, share in split(readings).items()}


def test_the_reserved_pool_fills_first_up_to_its_size() -> None:
    # the fleet asks for 3 reserved replicas' worth: all of it on the reserved pool, none on burst
    assert values([reading(RESERVED, 3.0), reading(BURST, 0.0)]) == {"a100": 3.0, "l4": 0.0}
    # load seen on the burst pool counts too: the gateway spread it, the reserved pool could serve it
    assert values([reading(RESERVED, 1.0), reading(BURST, 2.0)]) == {"a100": 3.0, "l4": 0.0}
    # 6 replica-equivalents: the reserved pool answers its size, burst only the excess
    assert values([reading(RESERVED, 6.0), reading(BURST, 0.0)]) == {"a100": 4.0, "l4": 2.0}


def test_burst_gets_only_the_excess_in_its_own_units() -> None:
    # a burst replica (another GPU class) serves 4 req/s at target, a reserved one 10: 60 req/s is 4 reserved
    # replicas (40 req/s) and 20 req/s beyond them, which is 5 burst replicas, not 2
    shares = split([reading(RESERVED, 6.0, unit=10.0), reading(BURST, 0.0, unit=4.0)])
    assert shares["a100"].value == 4.0 and shares["l4"].value == 5.0
    assert shares["l4"].work_rps == pytest.approx(20.0) and shares["a100"].fleet_work_rps == pytest.approx(60.0)
    assert not shares["l4"].unit_assumed
    # the burst pool's own load is converted back to the fleet's unit: 2 burst replicas = 8 req/s
    shares = split([reading(RESERVED, 4.0, unit=10.0), reading(BURST, 2.0, unit=4.0)])
    assert shares["a100"].value == 4.0 and shares["l4"].value == 2.0
    assert shares["a100"].fleet_work_rps == pytest.approx(48.0)


def test_a_falling_demand_empties_burst_first() -> None:
    burst_seen = []
    reserved_seen = []
    for demand in (9.0, 7.0, 5.0, 4.5, 4.0, 3.0, 1.0, 0.0):
        s = values([reading(RESERVED, demand), reading(BURST, 0.0)])
        reserved_seen.append(s["a100"])
        burst_seen.append(s["l4"])
    assert burst_seen == [5.0, 3.0, 1.0, 0.5, 0.0, 0.0, 0.0, 0.0]
    assert reserved_seen == [4.0, 4.0, 4.0, 4.0, 4.0, 3.0, 1.0, 0.0]  # shrinks only once burst is empty


def test_the_split_does_not_depend_on_the_order_of_the_readings() -> None:
    second = PoolSpec("chat", "t4", tier=2, size=3)
    burst = PoolSpec("chat", "l4", tier=1, size=4)  # a middle tier needs a size (else no split: below)
    readings = [reading(RESERVED, 7.0, unit=10.0), reading(burst, 1.0, unit=4.0, members=1), reading(second, None,
                members=2, unit=None)]  # fmt: skip
    answers = [split(list(order)) for order in itertools.permutations(readings)]
    assert all(a == answers[0] for a in answers)
    assert answers[0]["a100"].value == 4.0  # and tiers are in their order: reserved, burst, then tier 2
    assert answers[0]["l4"].value == 4.0 and answers[0]["t4"].value > 0  # burst full: tier 2 takes the rest


def test_tiers_fill_in_their_order_and_the_last_takes_what_no_size_holds() -> None:
    b1 = PoolSpec("chat", "b1", tier=1, size=2)
    b2 = PoolSpec("chat", "b2", tier=2, size=1)
    shares = split([reading(b2, 0.0), reading(b1, 0.0), reading(RESERVED, 10.0)])
    assert {p: s.value for p, s in shares.items()} == {"a100": 4.0, "b1": 2.0, "b2": 4.0}
    assert shares["b2"].unplaced_rps == pytest.approx(30.0)  # 3 replicas beyond its size: the HPA clamps
    assert "beyond every pool's size" in shares["b2"].explain()


def test_a_pool_without_fresh_data_counts_its_members_at_target() -> None:
    # the burst pool's data is missing: its 3 members count as 3 replicas at target, never as zero load
    shares = split([reading(RESERVED, 2.0), reading(BURST, None, members=3)])
    assert shares["a100"].value == 4.0 and shares["l4"].value == 1.0
    assert shares["l4"].fresh is False and shares["a100"].fresh is True
    assert shares["l4"].own is None


def test_an_unknown_unit_is_the_mean_of_the_known_ones_and_said_so() -> None:
    shares = split([reading(RESERVED, 6.0, unit=10.0), reading(BURST, 0.0, unit=None)])
    assert shares["l4"].unit_assumed and shares["l4"].unit_rps == 10.0 and shares["l4"].value == 2.0
    assert "(assumed)" in shares["l4"].explain()
    # none known: replica-equivalents
    shares = split([reading(RESERVED, 6.0, unit=None), reading(BURST, 0.0, unit=None)])
    assert shares["a100"].unit_rps == 1.0 and shares["l4"].value == 2.0
    assert split([]) == {}


def test_cost_reserved_pays_its_size_burst_what_it_runs() -> None:
    assert pool_cost_per_hour(RESERVED, 1) == 16.0  # 4 reserved replicas whether used or not
    assert pool_cost_per_hour(RESERVED, 6) == 24.0  # more run than it holds: those too
    assert pool_cost_per_hour(BURST, 0) == 0.0
    assert pool_cost_per_hour(BURST, 3) == 4.5  # starting replicas included by the caller
    assert pool_cost_per_hour(PoolSpec("chat", "x", tier=1), 3) is None  # no price: unknown, not 0
    assert cost_per_million_tokens(36.0, 1000.0) == pytest.approx(10.0)  # 3.6 M tokens an hour for 36
    for tokens in (None, 0.0, math.nan, math.inf):
        assert cost_per_million_tokens(36.0, tokens) is None
    assert cost_per_million_tokens(None, 1000.0) is None


def test_tiers() -> None:
    assert (parse_tier("reserved"), parse_tier(" Burst "), parse_tier("7")) == (0, 1, 7)
    for bad in ("spot", "-1", "100", "1.5", "٢"):
        with pytest.raises(ValueError, match="is not a tier"):
            parse_tier(bad)


BASE = {"endpoints": "http://10.0.0.7:8000"}


def test_trigger_keys_declare_the_pool() -> None:
    cfg = parse_trigger("ns", "chat-a100", {**BASE, "fleet": "chat", "poolTier": "reserved", "poolSize": "4",
                                            "replicaCostPerHour": "4.1"})  # fmt: skip
    assert cfg.pool == PoolSpec("chat", "chat-a100", 0, 4, 4.1)  # the pool is the ScaledObject's name
    cfg = parse_trigger("ns", "chat-l4", {**BASE, "fleet": "chat", "pool": "l4", "poolTier": "burst"})
    assert cfg.pool == PoolSpec("chat", "l4", 1, None, None)
    assert parse_trigger("ns", "chat", BASE).pool is None
    plain = parse_trigger("ns", "chat", BASE)
    pooled = parse_trigger("ns", "chat", {**BASE, "fleet": "chat", "poolTier": "burst"})
    assert pooled.fleet_key == plain.fleet_key and pooled.key != plain.key  # a view parameter: one scrape loop
    assert {"fleet", "pool", "poolTier", "poolSize", "replicaCostPerHour"} <= KNOWN_KEYS
    assert metadata_hints({**BASE, "fleet": "chat", "poolTier": "burst", "poolSize": "3"}) == []


@pytest.mark.parametrize(
    ("key", "bad"),
    [
        ("fleet", "Chat"),
        ("fleet", "a" * 64),
        ("fleet", "chat_1"),
        ("pool", "L4 pool"),
        ("poolTier", "spot"),
        ("poolTier", ""),  # required with fleet
        ("poolSize", "-1"),
        ("poolSize", "2.5"),
        ("poolSize", "²"),
        ("poolSize", "10000000"),
        ("replicaCostPerHour", "-0.5"),
        ("replicaCostPerHour", "cheap"),
        ("replicaCostPerHour", "nan"),
    ],
)
def test_bad_pool_keys_are_refused_naming_the_key(key: str, bad: str) -> None:
    meta = {**BASE, "fleet": "chat", "poolTier": "burst", key: bad}
    with pytest.raises(BadMetadata) as err:
        parse_trigger("ns", "chat", meta)
    assert err.value.key == key and key in str(err.value)


@pytest.mark.parametrize("key", ["pool", "poolTier", "poolSize", "replicaCostPerHour"])
def test_a_pool_key_without_fleet_is_refused(key: str) -> None:
    with pytest.raises(BadMetadata, match=f"{key}.*without fleet") as err:
        parse_trigger("ns", "chat", {**BASE, key: "1"})
    assert err.value.key == key


def test_no_split_while_a_pool_before_the_last_has_no_known_size() -> None:
    # a reservation whose size could not be read would take every demand and tell running burst pools 0
    unsized = PoolSpec("chat", "a100", tier=0, size=None)
    shares = split([reading(unsized, 4.0, unit=10.0), reading(BURST, 3.0, unit=10.0, members=3)])
    assert shares["a100"].value == 4.0 and shares["l4"].value == 3.0  # each its own, as before fleets
    assert shares["a100"].unsized and "size is unknown" in shares["a100"].explain()


def test_a_pool_at_zero_keeps_what_it_starts_without_counting_it_as_the_fleets_demand() -> None:
    from keda_llm_scaler.policy import Composite

    starting = Composite(3.0, 0, 0, 0.0, 0.0, 0.0, 3.0, "assumed", pressure=3.0)
    held = Composite(2.4, 0, 0, 0.0, 0.0, 0.0, 2.4, "gateway", pressure=2.4)
    burst = pool_reading(BURST, starting, 0.9, members=3, known_unit_rps=4.0)
    assert burst.value == 0.0 and burst.holding == 3.0 and burst.unit_rps == 4.0
    shares = split([reading(RESERVED, 2.0, unit=10.0), burst])
    assert shares["l4"].value == 3.0  # its three starting replicas are kept
    assert shares["a100"].value == 2.0 and shares["l4"].work_rps == 0.0  # and nobody else is given them
    # a reservation at zero whose gateway holds requests wakes: the held requests are the fleet's demand
    reserved = pool_reading(RESERVED, held, 0.9, members=0)
    shares = split([reserved, pool_reading(BURST, None, 0.9, members=0)])
    assert shares["a100"].value == 2.4
