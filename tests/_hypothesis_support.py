"""Example counts for the property tests, scaled by the active Hypothesis profile.

The counts in the tests are the everyday suite's. `--hypothesis-profile=thorough` (registered in
tests/conftest.py) multiplies every one of them by ten, for a fuzzing session:

    python -m pytest -q -n 2 --hypothesis-profile=thorough tests/test_fuzz.py tests/test_metrics.py
"""

from __future__ import annotations

from hypothesis import settings


def examples(n: int) -> int:
    """`n` examples under Hypothesis' default profile, scaled by the active profile's max_examples."""
    return max(1, round(n * settings().max_examples / settings.get_profile("default").max_examples))
