"""What a QUANT variant means, in one place: the modules it quantizes and the ones it must not.

Used twice: by `make quantize` (the llm-compressor recipe) and by dummy-weight folders (a
compressed-tensors quantization_config, so vLLM builds the same W4A16 kernels without a checkpoint).
"""
from __future__ import annotations

# Never quantized: lm_head (dominates quality loss at 4B), the vision tower, the MTP head (vLLM's
# MTP draft inherits the target's quantization config, so it must be listed here or it is built
# as W4A16 and the BF16 mtp.* tensors no longer fit; llm-compressor PR #2486), and Gated-DeltaNet
# projections (their fused layout has no AWQ mapping; llm-compressor #2260, PR #2748 closed).
ALWAYS_IGNORE = ["lm_head", "re:.*visual.*", "re:.*mtp.*", "re:.*linear_attn.*"]
SCOPE_TARGETS = {
    "mlp": ["re:.*mlp\\.(gate|up|down)_proj$"],
    "linear": ["Linear"],
}


def targets(variant) -> list[str]:
    return SCOPE_TARGETS[variant["QUANT_SCOPE"]]


def weight_scheme(variant) -> dict:
    return {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
            "group_size": variant["QUANT_GROUP_SIZE"], "dynamic": False, "actorder": None, "observer": "minmax"}


def dummy_quantization_config(variant, arch_config: dict) -> dict:
    """compressed-tensors W4A16 config as llm-compressor writes it (format pack-quantized)."""
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": targets(variant), "weights": weight_scheme(variant),
                                      "input_activations": None, "output_activations": None,
                                      "format": "pack-quantized"}},
        "ignore": list(ALWAYS_IGNORE),
        "kv_cache_scheme": None,
    }
