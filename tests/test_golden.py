"""Each variant's exact server argv + env is pinned in tests/golden/argv (`make golden` regenerates)."""
import pytest

from scripts.kit.__main__ import GOLDEN_PLATFORMS, golden_text
from scripts.kit.paths import GOLDEN
from scripts.kit.variant import discover


@pytest.mark.parametrize("name", discover())
@pytest.mark.parametrize("platform", GOLDEN_PLATFORMS)
def test_argv_matches_golden(name, platform):
    path = GOLDEN / "argv" / f"{name}.{platform}.txt"
    assert path.exists(), f"no golden for {name}: run `make golden` and review"
    assert golden_text(name, platform) == path.read_text(), f"{path} differs: run `make golden` and review the diff"
