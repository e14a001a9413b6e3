"""Shared pieces of the property-based tests: fast settings and YAML-like random values."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# Few examples and no deadline: the suite stays fast on a shared machine; a deeper search is
# MODELOPT_PROPERTY_EXAMPLES=2000 (hypothesis keeps failing inputs in .hypothesis/ and replays them first).
FAST = settings(max_examples=int(os.environ.get("MODELOPT_PROPERTY_EXAMPLES", "80")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.just(""), st.just("\x00"), st.just("é🙂"), st.just(10**400), st.just(-(10**400)),
)


def yaml_values(vocab: Sequence[Any] = ()) -> st.SearchStrategy[Any]:
    """What `yaml.safe_load` can return (None, bools, ints, floats, strings, lists, str/int-keyed
    mappings), with words from `vocab` mixed in so random documents reach past the first check."""
    words = st.sampled_from(list(vocab)) if vocab else st.nothing()
    leaves = st.one_of(SCALARS, words)
    keys = st.one_of(words, st.text(max_size=8), st.integers(-3, 10))
    return st.recursive(leaves, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                       st.dictionaries(keys, kids, max_size=4)), max_leaves=12)
