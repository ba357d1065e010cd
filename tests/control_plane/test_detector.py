"""The straggler detector, by tables."""

from __future__ import annotations

import pytest

from drover.control_plane.detector import Detector, DetectorSettings


def feed(
    detector: Detector, series: dict[str, list[float]], waits: dict[str, list[float]] | None = None, first_step: int = 0
) -> None:
    for i in range(max(len(v) for v in series.values())):
        for device, values in series.items():
            if i < len(values):
                detector.observe(
                    device, first_step + i, values[i], (waits or {}).get(device, values)[i] if waits else 0.0
                )


HEALTHY = {"a": [1] * 4, "b": [1] * 4, "c": [1] * 4}


@pytest.mark.parametrize(
    "series, expected",
    [
        ({**HEALTHY, "d": [3, 3, 3, 3]}, {"a": 1.0, "b": 1.0, "c": 1.0, "d": 3.0}),
        # one spike, however large, is noise
        ({**HEALTHY, "d": [1, 5, 1, 1]}, {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0}),
        # two slow steps in four are not "staying slow"
        ({**HEALTHY, "d": [1.5, 1, 1.5, 1]}, {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0}),
        # slow in all but one step of the window: a straggler, at the window's median
        ({**HEALTHY, "d": [2, 1, 2, 2]}, {"a": 1.0, "b": 1.0, "c": 1.0, "d": 2.0}),
        # below the threshold counts as healthy
        ({"a": [1] * 4, "b": [1] * 4, "c": [1.15] * 4}, {"a": 1.0, "b": 1.0, "c": 1.0}),
        # the whole machine slowing down in a step (a busy host) is nobody's straggling
        ({"a": [1, 3, 1, 2], "b": [1, 3, 1, 2], "c": [1, 3, 1, 2]}, {"a": 1.0, "b": 1.0, "c": 1.0}),
        # half of a small job slow: the lower median keeps the reference on the healthy half
        ({"a": [1] * 4, "b": [1] * 4, "c": [3] * 4, "d": [3] * 4}, {"a": 1.0, "b": 1.0, "c": 3.0, "d": 3.0}),
        # the window slides: an old slow spell is forgotten
        ({"a": [1] * 8, "b": [1] * 8, "c": [4, 4, 4, 4, 1, 1, 1, 1]}, {"a": 1.0, "b": 1.0, "c": 1.0}),
        # too little data: no rates yet
        ({"a": [1, 1, 1], "b": [1, 1, 1]}, {}),
        # a device a billion times slower (or a peer reporting nearly nothing) is a millionfold
        # straggler at most: the most a plan's rates may say (planner.cluster.MAX_RATE)
        ({**HEALTHY, "d": [1e9] * 4}, {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1e6}),
    ],
)
def test_rates(series, expected):
    detector = Detector()
    feed(detector, series)
    assert detector.rates() == expected


def test_hysteresis_keeps_a_straggler_until_it_clearly_recovers():
    d = Detector()
    feed(d, {**HEALTHY, "d": [3, 3, 3, 3]})
    assert d.rates()["d"] == 3.0
    # 1.17x: not slow enough to be flagged from healthy, not recovered enough to be cleared
    feed(d, {"a": [1] * 4, "b": [1] * 4, "c": [1] * 4, "d": [1.17] * 4}, first_step=4)
    assert d.rates()["d"] == 1.2  # still judged slow, at its measured median rounded
    feed(d, {"a": [1] * 4, "b": [1] * 4, "c": [1] * 4, "d": [1.05] * 4}, first_step=8)
    assert d.rates()["d"] == 1.0


def test_resent_samples_after_reconnect_are_ignored():
    d = Detector()
    feed(d, {**HEALTHY, "d": [1, 1, 1, 3]})
    d.observe("d", 1, 100.0, 0.0)  # an old step again
    assert d.rates()["d"] == 1.0


def test_slow_link_apart_from_slow_compute():
    d = Detector()
    feed(d, {**HEALTHY, "d": [3] * 4}, waits={"a": [0.1] * 4, "b": [0.1] * 4, "c": [2.0] * 4, "d": [0.1] * 4})
    assert d.slow_links(d.rates()) == ["c"]
    assert d.rates()["d"] == 3.0 and d.rates()["c"] == 1.0


def test_forgotten_device_has_no_rate():
    d = Detector()
    feed(d, {**HEALTHY, "d": [3] * 4})
    d.forget("d")
    assert "d" not in d.rates()


def test_a_new_plan_is_judged_on_its_own_steps():
    d = Detector()
    feed(d, {**HEALTHY, "d": [3] * 4})
    d.discard_before(4)
    assert d.rates() == {}
    feed(d, {"a": [1] * 3, "b": [1] * 3, "c": [1] * 3, "d": [1] * 3}, first_step=4)
    assert d.rates() == {}  # three steps of the new plan: not a window yet
    feed(d, {**HEALTHY, "d": [1] * 4}, first_step=7)
    assert d.rates()["d"] == 1.0


def test_history_stays_bounded_when_a_device_falls_silent():
    d = Detector()
    feed(d, {"a": [1] * 200, "b": [1] * 200, "c": [1] * 3})
    assert len(d._by_step) <= 4 * d.settings.window + 1


@pytest.mark.parametrize(
    "field, value",
    [("window", 1), ("healthy_below", 1.0), ("recovered_below", 1.5), ("min_gain", 1.0), ("cooldown_steps", -1)],
)
def test_bad_settings_are_named(field, value):
    with pytest.raises(ValueError, match=f"{field} = {value}"):
        DetectorSettings(**{field: value})


def test_a_link_that_becomes_slow_shows_in_its_own_gradient_syncs():
    """Both ends of a data-parallel link slow alike, so neither stands out from the job's median;
    each stands out from its own best under the plan."""
    detector = Detector(DetectorSettings(window=4))
    for step in range(12):
        sync = 0.05 if step < 6 else 0.5  # the link is shaped 10x slower from step 6
        for device in ("ib-0/0", "ib-1/0"):
            detector.observe(device, step, 1.0, 0.01, sync)
        for device in ("roce-0/0", "roce-1/0"):
            detector.observe(device, step, 1.0, 0.01, 0.05)
        flagged = detector.slow_links(detector.rates())
        if step < 7:
            assert flagged == [], step  # until half its window is slow (one slow step is noise)
    assert flagged == ["ib-0/0", "ib-1/0"]
    detector.discard_before(12)  # a new plan: its own baseline
    for step in range(12, 16):
        for device in ("ib-0/0", "ib-1/0", "roce-0/0", "roce-1/0"):
            detector.observe(device, step, 1.0, 0.01, 0.5)
    assert detector.slow_links(detector.rates()) == []


def test_waits_behind_a_straggler_are_not_blamed_on_a_link():
    detector = Detector(DetectorSettings(window=4))
    for step in range(12):
        slow = step >= 6
        detector.observe("a", step, 3.0 if slow else 1.0, 0.01, 0.05)  # a straggles from step 6
        for device in ("b", "c", "d"):  # and its partners wait on it
            detector.observe(device, step, 1.0, 0.5 if slow else 0.01, 0.5 if slow else 0.05)
        rates = detector.rates()
        assert detector.slow_links(rates) == [], (step, rates)
    assert detector.rates()["a"] == 3.0
