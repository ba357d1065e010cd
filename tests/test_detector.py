"""The straggler detector, by tables."""

from __future__ import annotations

import pytest

from drover.control_plane.detector import Detector, DetectorConfig


def feed(detector: Detector, series: dict[str, list[float]], waits: dict[str, list[float]] | None = None) -> None:
    for step in range(max(len(v) for v in series.values())):
        for device, values in series.items():
            if step < len(values):
                detector.observe(device, step, values[step], (waits or {}).get(device, [0.0] * 99)[step])


@pytest.mark.parametrize("series, expected", [
    ({"a": [1, 1, 1], "b": [1, 1, 1], "c": [1, 1, 1], "d": [3, 3, 3]}, {"a": 1.0, "b": 1.0, "c": 1.0, "d": 3.0}),
    # one noisy step does not make a straggler: the window's median
    ({"a": [1, 1, 1], "b": [1, 1, 1], "c": [1, 1, 1], "d": [1, 5, 1]}, {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0}),
    # below the healthy threshold counts as healthy
    ({"a": [1, 1, 1], "b": [1, 1, 1], "c": [1.15, 1.15, 1.15]}, {"a": 1.0, "b": 1.0, "c": 1.0}),
    # the window slides: an old slow spell is forgotten
    ({"a": [1] * 6, "b": [1] * 6, "c": [4, 4, 4, 1, 1, 1]}, {"a": 1.0, "b": 1.0, "c": 1.0}),
    # too little data: no rates yet
    ({"a": [1, 1], "b": [1, 1]}, {}),
])
def test_rates(series, expected):
    detector = Detector()
    feed(detector, series)
    assert detector.rates() == expected


def test_moved_needs_the_hysteresis_delta():
    d = Detector(DetectorConfig(replan_delta=0.3))
    assert d.moved({"x": 3.0}, {"x": 3.2, "y": 1.0}) == {}
    assert d.moved({"x": 3.0}, {"x": 1.0}) == {"x": 1.0}
    assert d.moved({}, {"x": 1.5}) == {"x": 1.5}


def test_resent_samples_after_reconnect_are_ignored():
    d = Detector()
    feed(d, {"a": [1, 1, 1], "b": [1, 1, 1], "c": [1, 1, 3]})
    d.observe("c", 1, 100.0, 0.0)  # an old step again
    assert d.rates()["c"] == 1.0


def test_slow_link_apart_from_slow_compute():
    d = Detector()
    feed(d, {"a": [1] * 3, "b": [1] * 3, "c": [1] * 3, "d": [3] * 3},
         waits={"a": [0.1] * 3, "b": [0.1] * 3, "c": [2.0] * 3, "d": [0.1] * 3})
    assert d.slow_links() == ["c"]
    assert d.rates()["d"] == 3.0 and d.rates()["c"] == 1.0


def test_forgotten_device_has_no_rate():
    d = Detector()
    feed(d, {"a": [1, 1, 1], "b": [1, 1, 1], "c": [3, 3, 3]})
    d.forget("c")
    assert "c" not in d.rates()
