"""METADATA_CACHE (scripts/patches/metadata_cache.py): packages_distributions() answered from a file keyed by the
import path's directories.

Real: fresh interpreters with the repo's sitecustomize.py and the switch, this environment's installed
distributions, transformers' own import (which calls the function), and a distribution installed into a folder on
the import path (a *.dist-info directory, what pip writes). Stood in: nothing.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path

from scripts.kit.variant import load
from scripts.patches import metadata_cache
from tests.fresh_vllm import run_fresh_python


def run(code: str, cache: Path, extra_path: Path | None = None) -> dict:
    return run_fresh_python(code, env={metadata_cache.ENV: str(cache)}, extra_path=extra_path)[0]


MAP = """
    import importlib.metadata as m, json
    got = m.packages_distributions()
    print(json.dumps({"map": got, "real": m.packages_distributions.__wrapped__()}))
"""


def test_a_second_process_takes_the_mapping_the_first_wrote_and_transformers_reads_it(tmp_path):
    first = run(MAP, tmp_path)
    assert first["map"] == first["real"] and "torch" in first["map"]
    files = list(tmp_path.glob("packages-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text()) == first["map"]
    # Second process: the real mapping function cannot run (importlib.metadata.distributions raises), so the
    # mapping transformers holds after its import can only have come from the file.
    second = run("""
        import importlib.metadata as m, json
        def no(*a, **k):
            raise RuntimeError("packages_distributions mapped the distributions again")
        m.distributions = no
        from transformers.utils import import_utils
        print(json.dumps({"map": import_utils.PACKAGE_DISTRIBUTION_MAPPING}))
    """, tmp_path)
    assert second["map"] == first["map"]


def test_installing_a_distribution_on_the_path_misses_and_maps_it(tmp_path):
    cache, site = tmp_path / "cache", tmp_path / "site"
    site.mkdir()
    before = run(MAP, cache, site)
    assert "kitprobe" not in before["map"]
    info = site / "kitprobe-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kitprobe\nVersion: 1.0\n")
    (info / "top_level.txt").write_text("kitprobe\n")
    after = run(MAP, cache, site)
    assert after["map"]["kitprobe"] == ["kitprobe"] and after["map"] == after["real"]
    assert len(list(cache.glob("packages-*.json"))) == 2


def test_an_unreadable_or_unwritable_cache_is_passed_over_with_the_real_answer(tmp_path, capsys):
    real = importlib.metadata.packages_distributions
    real = getattr(real, "__wrapped__", real)
    expected = real()
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    assert metadata_cache.cached(real, blocked)() == expected
    assert "not written" in capsys.readouterr().err
    folder = tmp_path / "cache"
    fn = metadata_cache.cached(real, folder)
    folder.mkdir()
    bad = folder / f"packages-{metadata_cache.key()}.json"
    bad.write_text("{truncated")
    assert fn() == expected
    assert json.loads(bad.read_text()) == expected  # replaced by a whole one


def test_only_the_newest_mappings_stay(tmp_path):
    real = importlib.metadata.packages_distributions
    real = getattr(real, "__wrapped__", real)
    for i in range(metadata_cache.KEEP + 3):  # older mappings, as keys that moved would leave
        old = tmp_path / f"packages-old{i:02d}.json"
        old.write_text("{}")
        os.utime(old, ns=(i * 10**9, i * 10**9))
    metadata_cache.cached(real, tmp_path)()  # a miss: writes the current key's file, then prunes
    left = {p.name for p in tmp_path.glob("packages-*.json")}
    assert len(left) == metadata_cache.KEEP and f"packages-{metadata_cache.key()}.json" in left
    assert "packages-old00.json" not in left and f"packages-old{metadata_cache.KEEP + 2:02d}.json" in left


def test_the_key_puts_the_file_in_the_variants_cache_root():
    v = load("tiny", ["METADATA_CACHE=1"])
    assert v.to_env("cpu")[metadata_cache.ENV] == str(v.cache_root / "kit-metadata")
    assert metadata_cache.ENV not in load("tiny").to_env("cpu")
