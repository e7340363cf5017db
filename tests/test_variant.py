"""config.env grammar, precedence, invariants and argv/env rendering (scripts/kit/variant.py)."""
import json

import pytest

from scripts.kit.errors import KitError
from scripts.kit.paths import ROOT
from scripts.kit.variant import discover, load, parse_file


def test_minimal_variant_gets_schema_defaults(tree):
    tree("a", "MODEL=org/m\n")
    v = load("a")
    assert v["MODEL"] == "org/m" and v["PORT"] == 8000 and v["QUANT"] == "none"
    assert v.sources["MODEL"].endswith("a/config.env:1") and v.sources["PORT"] == "default"


@pytest.mark.parametrize("body,needle", [
    ("export MODEL=x\n", "drop 'export'"),
    ("MODEL=$HOME\n", "'$' is not allowed"),
    ("MODEL x\n", "expected one KEY=value"),
    ("MODEL=a b\n", "expected one KEY=value"),
    ("MODEL='unclosed\n", "cannot parse"),
    ("model=x\n", "bad key"),
    ("MODEL=a\nMODEL=b\n", "already set on line 2"),
    ("MAX_MODEL_LENN=5\n", "unknown key MAX_MODEL_LENN"),
    ("PORT=eighty\n", "is not an integer"),
    ("QUANT=int3\n", "QUANT"),
    ("SPEC_ACCEPTANCE=1.5\n", "SPEC_ACCEPTANCE"),
    # Unquoted JSON: the shell reading strips its double quotes ({pass_config:...}); named before vLLM sees it.
    ('SERVE_COMPILATION_CONFIG={"pass_config":{"fuse_allreduce_rms":false}}\n', "wrap the whole value in single quotes"),
])
def test_grammar_and_type_errors_name_file_and_line(tree, body, needle):
    tree("bad", "# header\n" + body)
    with pytest.raises(KitError) as e:
        load("bad")
    assert needle in str(e.value)
    assert "bad/config.env:" in str(e.value)


def test_unknown_key_suggests_the_close_one(tree):
    tree("t", "SPEC_KK=2\n")
    with pytest.raises(KitError, match=r"did you mean SPEC_K\?"):
        load("t")


def test_quotes_comments_and_blank_lines(tree):
    tree("q", '\n# c\nMODEL="org/m"   # trailing comment\nSERVE_CUDAGRAPH_CAPTURE_SIZES="1 2 4"\n')
    v = load("q")
    assert v["MODEL"] == "org/m"
    assert v.serve_flags() == ["--cudagraph-capture-sizes", "1", "2", "4"]


def test_serve_flags_booleans_json_and_values(tree):
    tree("f", "SERVE_ENABLE_PREFIX_CACHING=true\nSERVE_ENFORCE_EAGER=false\nSERVE_MAX_NUM_SEQS=8\n"
              "SERVE_COMPILATION_CONFIG='{\"pass_config\": {\"x\": true}}'\n")
    flags = load("f").serve_flags()
    assert flags == ["--compilation-config", '{"pass_config": {"x": true}}', "--enable-prefix-caching",
                     "--no-enforce-eager", "--max-num-seqs", "8"]


def test_base_chain_precedence_and_set_override(tree):
    tree("p", "MODEL=org/m\nSERVE_MAX_NUM_SEQS=1\nPORT=9000\n")
    tree("c", "BASE=p\nSERVE_MAX_NUM_SEQS=8\n")
    v = load("c", ["PORT=9100"])
    assert v["MODEL"] == "org/m" and v["SERVE_MAX_NUM_SEQS"] == "8" and v["PORT"] == 9100
    assert v.sources["MODEL"].endswith("p/config.env:1") and v.sources["PORT"] == "--set"
    assert v["BASE"] == "p"


def test_base_cycle_is_an_error(tree):
    tree("x", "BASE=y\n")
    tree("y", "BASE=x\n")
    with pytest.raises(KitError, match="BASE cycle"):
        load("x")


def test_unknown_variant_lists_the_variants(tree):
    tree("alpha", "MODEL=a/b\n")
    tree("beta", "MODEL=a/b\n")
    with pytest.raises(KitError) as e:
        load("alpah")
    assert "did you mean alpha" in str(e.value) and "alpha, beta" in str(e.value)


@pytest.mark.parametrize("body,needle", [
    ("SPEC_K=2\n", "K>0 needs a method"),
    ("SPEC_METHOD=mtp\n", "a method needs K>0"),
    ("SPEC_METHOD=dflash\nSPEC_K=4\n", "needs SPEC_MODEL"),
    ("SPEC_METHOD=mtp\nSPEC_K=2\nSPEC_ACCEPTANCE=0.9\n", "1 rates for SPEC_K=2"),
    ("SPEC_METHOD=mtp\nSPEC_K=2\nSPEC_ACCEPTANCE=0.5,0.9\n", "must not increase"),
    ("SPEC_ACCEPTANCE=0.9,0.6,0.4\n", None),  # no speculation: rates unused (tune from a K=0 BASE)
    ("SPEC_ACCEPTANCE=0.5,0.9\n", "must not increase"),
    ("WEIGHTS=dummy\n", "needs ARCH_CONFIG"),
    ("ARCH_CONFIG=nope.json\n", "does not exist"),
    ("BASELINE=ghost\n", "is not a variant"),
    ("SPEC_SCHEDULE=1-8:2\n", "needs SPEC_METHOD"),
    ("SPEC_METHOD=mtp\nSPEC_K=4\nSPEC_SCHEDULE=1-1:4,2-8:2\n", None),
    ("SPEC_METHOD=mtp\nSPEC_K=4\nSPEC_SCHEDULE=1-1:3,2-8:2\n", "must equal SPEC_K=4"),
    ("SPEC_METHOD=mtp\nSPEC_K=2\nSPEC_SCHEDULE=8-1:2\n", "starts after it ends"),
    ("SPEC_METHOD=mtp\nSPEC_K=2\nSPEC_SCHEDULE=1-8\n", "SPEC_SCHEDULE"),
])
def test_invariants(tree, body, needle):
    tree("i", body)
    if needle is None:  # the valid neighbour of the cases around it
        load("i")
        return
    with pytest.raises(KitError, match=needle):
        load("i")


def test_spec_schedule_reaches_the_speculative_config(tree):
    tree("s", "SPEC_METHOD=mtp\nSPEC_K=3\nSPEC_SCHEDULE=1-1:3,2-8:1,9-1024:0\n")
    argv = load("s").to_argv("gpu")
    sc = json.loads(argv[argv.index("--speculative-config") + 1])
    assert sc["num_speculative_tokens_per_batch_size"] == [[1, 1, 3], [2, 8, 1], [9, 1024, 0]]


def test_speculative_config_synthetic_acceptance(tree):
    tree("s", "SPEC_METHOD=mtp\nSPEC_K=2\nSPEC_ACCEPTANCE=0.9,0.6\n")
    v = load("s")
    argv = v.to_argv("gpu")
    sc = json.loads(argv[argv.index("--speculative-config") + 1])
    assert sc == {"method": "mtp", "num_speculative_tokens": 2, "rejection_sample_method": "synthetic",
                  "synthetic_acceptance_rates": [0.9, 0.6]}
    assert v.acceptance == "synthetic"


def test_config_hash_ignores_run_conditions_only(tree):
    tree("h", "MODEL=org/m\nARCH_CONFIG=weights/configs/qwen3-4b.json\n")
    base = load("h").config_sha256
    assert load("h", ["PORT=9999", "WEIGHTS=dummy"]).config_sha256 == base
    assert load("h", ["SERVE_MAX_NUM_SEQS=4"]).config_sha256 != base


def test_humming_background_builds_are_a_start_key_passed_to_the_server(tree):
    """HUMMING_DISABLE_PARALLEL_BUILD: allow-listed, read by humming-kernels in the server's processes; how a server
    starts, so a record made with it still describes the variant."""
    tree("h", "MODEL=org/m\nARCH_CONFIG=weights/configs/qwen3-4b.json\n")
    v = load("h", ["HUMMING_DISABLE_PARALLEL_BUILD=1"])
    assert v.to_env("gpu")["HUMMING_DISABLE_PARALLEL_BUILD"] == "1"
    assert v.config_sha256 == load("h").config_sha256
    with pytest.raises(KitError, match="unknown key HUMMING_OTHER"):
        load("h", ["HUMMING_OTHER=1"])


def test_eager_auto_follows_platform_and_env_passthrough(tree):
    tree("e", "VLLM_USE_V2_MODEL_RUNNER=0\nSERVE_MAX_NUM_SEQS=2\n")
    v = load("e")
    assert "--enforce-eager" in v.to_argv("cpu") and "--enforce-eager" not in v.to_argv("gpu")
    env = v.to_env("gpu")
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "0" and env["HF_HUB_OFFLINE"] == "1"
    assert not any(k.startswith("SERVE_") for k in env)


def test_dummy_weights_select_the_dummy_folder_and_load_format(tree):
    tree("d", "MODEL=Qwen/Qwen3-4B\nARCH_CONFIG=weights/configs/qwen3-4b.json\nQUANT=awq_w4a16\n")
    v = load("d", ["WEIGHTS=dummy"])
    assert v.weights_dir.name == "dummy-awq-w4a16-g32-mlp" and v.weights_dir.parent.name == "Qwen--Qwen3-4B"
    assert "--load-format" in v.to_argv("gpu") and "--skip-tokenizer-init" in v.to_argv("gpu")


def test_parse_file_returns_line_numbers(tmp_path):
    p = tmp_path / "config.env"
    p.write_text("# c\n\nA=1\nB='x y'\n")
    assert parse_file(p) == [("A", "1", 3), ("B", "x y", 4)]


def test_the_shipped_catalog_loads():
    names = discover()
    assert {"tiny", "qwen3.5-4b-bf16", "qwen3-4b-bf16"} <= set(names)
    for n in names:
        assert load(n).config_sha256


def test_describes_judges_a_record_by_its_stored_config_under_todays_rules(tree):
    tree("d", "MODEL=org/m\nSERVE_MAX_NUM_SEQS=8\n")
    v = load("d")
    old = {k: val for k, val in v.config.items() if k not in ("SPEC_SCHEDULE", "GATES")}  # keys added later
    assert v.describes({"config": old})
    # Run conditions (memory budget, port, synthetic rates) do not make a record stale...
    assert v.describes({"config": {**v.config, "SERVE_KV_CACHE_MEMORY_BYTES": "6442450944", "PORT": 8101}})
    # ...a served setting does.
    assert not v.describes({"config": {**v.config, "SERVE_MAX_NUM_SEQS": "16"}})
    assert not v.describes({"config": {**old, "SERVE_ENABLE_PREFIX_CACHING": "true"}})


def test_dummy_draft_folder_comes_from_spec_arch_config(tree, tmp_path, monkeypatch):
    """A dummy-weights drafter (DFlash) is its config.json alone; serving refuses until it exists,
    and a variant with no SPEC_ARCH_CONFIG gets told which key to set."""
    import scripts.kit.variant as variant
    from scripts.kit import weights
    monkeypatch.setattr(variant, "WEIGHTS", tmp_path / "w")
    base = "MODEL=Qwen/Qwen3-4B\nARCH_CONFIG=weights/configs/qwen3-4b.json\nSPEC_METHOD=dflash\nSPEC_K=15\nSPEC_MODEL=z-lab/D\n"
    tree("nodraft", base)
    with pytest.raises(KitError, match="needs SPEC_ARCH_CONFIG"):
        weights.build_dummy_draft(load("nodraft", ["WEIGHTS=dummy"]))
    tree("dd", base + "SPEC_ARCH_CONFIG=weights/configs/qwen3-4b-dflash-b16.json\n")
    v = load("dd", ["WEIGHTS=dummy"])
    with pytest.raises(KitError, match=r"draft weights for dd are missing: .*SET=WEIGHTS=dummy"):
        weights.require(v)
    d = weights.build_dummy_draft(v)
    assert d == v.draft_dir and weights.is_complete(d)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["dflash_config"]["target_layer_ids"]
    assert f'"model":"{d}"' in " ".join(v.to_argv("gpu"))


def test_output_changes_name_what_the_quality_gates_must_clear():
    """The schema's x-changes-output keys where a variant differs from its BASELINE (the README's answer
    prints them beside its speed figures): weights and lm_head schemes count, speed-only patches do not."""
    assert load("qwen3.5-4b-fp8-v4").output_changes() == {"QUANT": "fp8_dynamic", "LM_HEAD_W8": "int8"}
    assert load("qwen3.5-4b-fp8-v4", ["LM_HEAD_W8=off"]).output_changes() == {"QUANT": "fp8_dynamic"}
    assert load("qwen3.5-4b-bf16-tuned-dvg").output_changes() == {}  # speculation and draft patches only
    assert load("qwen3.5-4b-bf16-tuned-dvg", ["SERVE_KV_CACHE_DTYPE=fp8"]).output_changes() == \
        {"SERVE_KV_CACHE_DTYPE": "fp8"}
    assert load("qwen3.5-4b-bf16", ["QUANT=fp8_dynamic"]).output_changes() == {}  # a baseline is its own reference
    assert load("qwen3.5-4b-bf16-tuned-dvg", ["SERVE_KV_CACHE_DTYPE=auto"]).output_changes() == {}  # vLLM's default


def test_every_output_changing_key_is_a_key_the_kit_knows():
    schema = json.loads((ROOT / "schemas" / "variant.schema.json").read_text())
    for k in schema["x-changes-output"]["keys"]:
        assert k in schema["properties"] or k.startswith("SERVE_"), k
