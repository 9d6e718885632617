"""Every module named in a test tier exists, and no module is in two tiers."""

from __future__ import annotations

from tests.conftest import REPO_ROOT, TIERS, tier_of


def test_tier_lists_name_real_modules_once() -> None:
    modules = {p.stem for p in (REPO_ROOT / "tests").glob("test_*.py")}
    named = [m for names in TIERS.values() for m in names]
    assert sorted(set(named) - modules) == []
    assert len(named) == len(set(named))
    assert tier_of("test_kc_contract") == "contract" and tier_of("test_routing") == "unit"
