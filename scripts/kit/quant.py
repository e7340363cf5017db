"""What a QUANT variant means, in one place: the modules it quantizes, the ones it must not, the
llm-compressor recipe built from them, and the kit's own offline calibration / held-out text.

Used twice: by `make quantize` (scripts/quantize.py turns `recipe(variant)` into recipe.yaml) and by
dummy-weight folders (`dummy_quantization_config`, so vLLM builds the same W4A16 or FP8 kernels without a
checkpoint). Both read targets / ignore / weight_scheme / activation_scheme, so they cannot disagree.
Pure Python (no torch): importable in .venv, .venv-quant and CI.

    from scripts.kit.quant import recipe_yaml, kit_texts
    print(recipe_yaml(load("qwen3.5-4b-awq")))
"""
from __future__ import annotations

import ast
import hashlib
import sysconfig
from pathlib import Path

# Never quantized: lm_head (dominates quality loss at 4B), the vision tower, and the MTP head (vLLM's
# MTP draft inherits the target's quantization config, so it must be listed here or it is built
# quantized and the BF16 mtp.* tensors no longer fit; llm-compressor PR #2486).
ALWAYS_IGNORE = ["lm_head", "re:.*visual.*", "re:.*mtp.*"]
# AWQ also leaves the Gated-DeltaNet projections alone: their fused layout has no AWQ smoothing mapping
# (llm-compressor #2260, PR #2748 closed). FP8 needs no mapping, so it quantizes them under QUANT_SCOPE=linear.
AWQ_IGNORE = ["re:.*linear_attn.*"]
SCOPE_TARGETS = {
    "mlp": ["re:.*mlp\\.(gate|up|down)_proj$"],
    "linear": ["Linear"],
}
# compressed-tensors' on-disk format per scheme, as llm-compressor writes it.
FORMATS = {"awq_w4a16": "pack-quantized", "fp8_dynamic": "float-quantized"}
# Calibration samples are drawn with this seed (hub and path sources); recorded in the manifest.
SEED = 0
# The held-out verification text: windows x tokens, from modules disjoint from the calibration ones.
VERIFY_WINDOWS = 8
VERIFY_SEQ_LEN = 256

def targets(variant) -> list[str]:
    return SCOPE_TARGETS[variant["QUANT_SCOPE"]]


def ignore(variant) -> list[str]:
    return ALWAYS_IGNORE + (AWQ_IGNORE if variant["QUANT"] == "awq_w4a16" else [])


def needs_calibration(variant) -> bool:
    """AWQ fits its smoothing scales on text; FP8 dynamic takes weight scales from the weights alone
    and activation scales at run time."""
    return variant["QUANT"] == "awq_w4a16"


def weight_scheme(variant) -> dict:
    if variant["QUANT"] == "fp8_dynamic":
        return {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel", "group_size": None,
                "dynamic": False, "actorder": None, "observer": "minmax"}
    return {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
            "group_size": variant["QUANT_GROUP_SIZE"], "dynamic": False, "actorder": None, "observer": "minmax"}


def activation_scheme(variant) -> dict | None:
    """FP8 dynamic: each token's activations cast to FP8 with a scale computed at run time (W8A8)."""
    if variant["QUANT"] == "fp8_dynamic":
        return {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "group_size": None,
                "dynamic": True, "actorder": None, "observer": None}
    return None


def _group(variant) -> dict:
    g = {"targets": targets(variant), "weights": weight_scheme(variant)}
    if activation_scheme(variant):
        g["input_activations"] = activation_scheme(variant)
    return g


def dummy_quantization_config(variant, arch_config: dict) -> dict:
    """compressed-tensors config as llm-compressor writes it for the variant's scheme."""
    fmt = FORMATS[variant["QUANT"]]
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": targets(variant), "weights": weight_scheme(variant),
                                      "input_activations": activation_scheme(variant), "output_activations": None,
                                      "format": fmt}},
        "ignore": ignore(variant),
        "kv_cache_scheme": None,
    }


def recipe(variant) -> dict:
    """llm-compressor recipe. awq_w4a16: AWQ smoothing (mappings inferred per architecture; for Qwen3.5
    the hybrid mappings, whose linear_attn and q/k/v entries are skipped when nothing they balance is
    targeted), then W4A16 group quantization of exactly `targets`, minus `ignore`. fp8_dynamic: the
    quantization step alone (per-channel FP8 weights, per-token dynamic FP8 activations)."""
    if variant["QUANT"] not in FORMATS:
        raise ValueError(f"no recipe for QUANT={variant['QUANT']}")
    mods = {}
    if variant["QUANT"] == "awq_w4a16":
        mods["AWQModifier"] = {"duo_scaling": True, "n_grid": variant["QUANT_N_GRID"]}
    mods["QuantizationModifier"] = {"ignore": ignore(variant), "config_groups": {"group_0": _group(variant)}}
    return {"quant_stage": {"quant_modifiers": mods}}


def recipe_yaml(variant) -> str:
    import yaml
    return yaml.safe_dump(recipe(variant), sort_keys=False)


# -- the kit's offline text ----------------------------------------------------------------------
# Real English prose that every Python install carries: docstrings of well-documented stdlib modules.
# Two disjoint module lists, so verification never scores text the scales were fitted on. The text
# (and so its sha256, recorded) depends on the Python minor version.
CALIB_MODULES = ["argparse", "asyncio/events", "asyncio/tasks", "collections/__init__", "concurrent/futures/_base",
                 "configparser", "contextlib", "csv", "dataclasses", "datetime", "difflib", "email/message",
                 "enum", "functools", "gettext", "heapq", "http/client", "http/server", "inspect", "ipaddress",
                 "json/__init__", "logging/__init__", "logging/handlers", "mailbox", "multiprocessing/pool",
                 "optparse", "os", "pathlib", "pickle", "pydoc", "shutil", "smtplib", "socket", "ssl",
                 "statistics", "string", "subprocess", "tarfile", "tempfile", "threading", "typing",
                 "unittest/case", "urllib/request", "uuid", "warnings", "zipfile"]
HELDOUT_MODULES = ["decimal", "fractions", "textwrap", "calendar", "queue", "sched", "selectors",
                   "imaplib", "ftplib", "random", "bisect", "locale", "netrc", "shlex", "trace", "turtle"]


def _docstrings(module: str) -> list[str]:
    path = Path(sysconfig.get_paths()["stdlib"]) / f"{module}.py"
    if not path.is_file():  # a module moved between Python versions: the hash records what we used
        return []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in [tree, *ast.walk(tree)]:
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            # Short docstrings ("Return self.") are noise; keep paragraphs with some prose in them.
            if doc and len(doc) >= 200 and doc not in out:
                out.append(doc)
    return out


def kit_texts(split: str) -> list[str]:
    """Deterministic list of documents: split 'calib' or 'heldout'."""
    mods = {"calib": CALIB_MODULES, "heldout": HELDOUT_MODULES}[split]
    return [d for m in mods for d in _docstrings(m)]


def texts_sha256(texts: list[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(hashlib.sha256(t.encode()).digest())
    return h.hexdigest()
