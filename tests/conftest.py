from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
METRICS = FIXTURES / "metrics"


def fixture_text(name: str) -> str:
    return (METRICS / name).read_text()


@pytest.fixture
def metrics_dir() -> Path:
    return METRICS
