from __future__ import annotations

import pytest

from modelopt.config.duration import format_duration, parse_duration
from modelopt.config.run_config import RunConfig
from modelopt.errors import ConfigError


@pytest.mark.parametrize(("given", "seconds"), [("90s", 90.0), ("2m", 120.0), ("1m30s", 90.0), ("1.5h", 5400.0),
                                                ("45", 45.0), (45, 45.0), (" 2M ", 120.0)])
def test_durations_people_write(given, seconds):
    assert parse_duration(given) == seconds


@pytest.mark.parametrize("bad", ["soon", "2x", "m", "1m1m", "-5s", "0", 0.5, True, None, "nan"])
def test_a_bad_duration_is_one_line_naming_it_and_the_forms(bad):
    with pytest.raises(ConfigError, match=r"is not a duration of a second or more; give e\.g\. 90s, 2m") as info:
        parse_duration(bad)
    assert "\n" not in str(info.value)


def test_format_says_it_back():
    assert [format_duration(s) for s in (45, 120, 150, 3900)] == ["45s", "2m", "2m30s", "1h05m"]


def test_a_time_alone_leaves_the_budget_open_and_round_trips_through_run_json():
    timed = RunConfig().replace(time="10m")
    assert timed.time == 600.0 and timed.budget == float("inf")
    assert RunConfig.from_json(timed.to_json()) == timed
    both = RunConfig().replace(time="2m", budget=50)
    assert both.budget == 50 and RunConfig.from_json(both.to_json()).time == 120.0
    with pytest.raises(ConfigError, match="budget must be a positive number"):
        RunConfig(budget=float("inf"))  # open only with a time
