"""GPU check of GDN_PROFILE_STATES (scripts/patches/gdn_profile_states.py) on vLLM 0.26's own GDN layer class, without a
server: one Qwen3.5-4B-shaped layer (dummy parameters) in a profile-like forward (no attention metadata), the peak
CUDA memory of its `_warmup_prefill_kernels` for a batch of TOKENS tokens at MAX_SEQS sequences, as vLLM ships it
and patched. Prints one JSON line. Run on the GPU host after the payload's install:

    PYTHONPATH=/tmp/site:. python3 .ci/gdn_states_check.py [TOKENS] [MAX_SEQS]
"""
from __future__ import annotations

import json
import os
import sys
import time
import types

import torch

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29611")
from transformers import Qwen3_5TextConfig  # noqa: E402
from vllm.config import VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.distributed import init_distributed_environment, initialize_model_parallel  # noqa: E402
import vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn as M  # noqa: E402

from scripts.patches import gdn_profile_states as P  # noqa: E402

tokens, max_seqs = (int(a) for a in (sys.argv[1:] + ["8192", "1024"])[:2])
cfg = Qwen3_5TextConfig(vocab_size=1024, hidden_size=2560, intermediate_size=9216, num_hidden_layers=2,
                        num_attention_heads=16, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
                        linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
                        linear_conv_kernel_dim=4, layer_types=["linear_attention", "full_attention"])
cfg.dtype = torch.bfloat16
vc = VllmConfig()
object.__setattr__(vc, "model_config", types.SimpleNamespace(hf_text_config=cfg, hf_config=cfg, dtype=torch.bfloat16,
                                                           is_moe=False))
vc.scheduler_config.max_num_seqs = max_seqs
vc.additional_config = {"gdn_prefill_backend": "triton"}  # as the kit serves Qwen3.5 (--gdn-prefill-backend triton)
ctx = set_current_vllm_config(vc)
ctx.__enter__()
init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="nccl")
initialize_model_parallel(1, 1)
torch.set_default_device("cuda")
torch.set_default_dtype(torch.bfloat16)
conv_dim = 2 * 16 * 128 + 32 * 128


def peak(layer) -> tuple[float, float]:
    """(GiB above what was allocated before, seconds) of one `_warmup_prefill_kernels` call."""
    qkv = torch.zeros(tokens, conv_dim)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base, t0 = torch.cuda.memory_allocated(), time.perf_counter()
    layer._warmup_prefill_kernels(qkv, 0)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**30, time.perf_counter() - t0


out = {"tokens": tokens, "max_seqs": max_seqs, "gpu": torch.cuda.get_device_name()}
a = M.QwenGatedDeltaNetAttention(cfg, vc, prefix="model.layers.0.linear_attn")
out["backend"] = getattr(a, "gdn_prefill_backend", None)
out["vllm_gib"], out["vllm_s"] = peak(a)  # vLLM's own warm-up: one 64-token sequence
P.patch_class(M.QwenGatedDeltaNetAttention)
b = M.QwenGatedDeltaNetAttention(cfg, vc, prefix="model.layers.2.linear_attn")
out["kit_gib"], out["kit_s"] = peak(b)  # that, then the profile's batch
out["kit_again_gib"], out["kit_again_s"] = peak(b)  # a second profile forward: vLLM's warm-up is done, the batch runs
out["final_states_gib"] = min(tokens, max_seqs) * 32 * 128 * 128 * 4 / 2**30
print("GDNSTATES " + json.dumps(out), flush=True)
