from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run unless asked to explore: a CI run must not fail on a
# counterexample no one has seen. `HYPOTHESIS_PROFILE=explore pytest tests/test_policy.py` searches anew;
# add what it finds as an @example.
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("explore", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

FIXTURES = Path(__file__).parent / "fixtures"
METRICS = FIXTURES / "metrics"


def fixture_text(name: str) -> str:
    return (METRICS / name).read_text()


@pytest.fixture
def metrics_dir() -> Path:
    return METRICS
