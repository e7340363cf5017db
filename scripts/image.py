"""`make build | build-import | verify-image | k8s`: ship a variant as a Docker image with its baked cache.

    python -m scripts.image build  --variant V [--weights copy|mount]   # GPU host with Docker
    python -m scripts.image build  --variant V --cache cache_import.tar.gz  # cache baked elsewhere
    python -m scripts.image verify --variant V     # run it, /health, one completion, prove the hit
    python -m scripts.image k8s    --variant V [--image TAG] [--out DIR]    # manifests (stdout)
    ... --dry-run                                  # print every docker command, run none

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

verify writes results/<variant>/<UTC>-image_verify.json (schemas/payloads/image_verify.schema.json).
Every docker command line comes from a pure function below (tested in tests/test_image.py).
"""
from __future__ import annotations

import argparse
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
from scripts.kit.errors import KitError, run_main
from scripts.kit.paths import ROOT
from scripts.kit.procs import free_port
from scripts.kit.record import git_state, make_record, write_record
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


# -- names and paths -------------------------------------------------------------------------
def image_tag(v, runtime: bool = False) -> str:
    return f"{REPOSITORY}:{v.name}" + ("-runtime" if runtime else "")


def rel(path: Path, root: Path = ROOT) -> str:
    return str(path.relative_to(root))


def in_image(path: Path, root: Path = ROOT) -> str:
    return k8s.in_image(path, root)


def set_args(overrides) -> list[str]:
    return k8s.server_args(overrides)


# -- docker command lines (pure) ------------------------------------------------------------
def build_argv(v, tag: str, target: str, weights: str, git_commit: str, root: Path = ROOT) -> list[str]:
    """docker build of one Dockerfile target for v (target: runtime | image; weights: copy | mount)."""
    argv = ["docker", "build", "--file", str(root / "Dockerfile"), "--target", target, "--tag", tag,
            "--build-arg", f"VARIANT={v.name}", "--build-arg", f"WEIGHTS={weights}",
            "--build-arg", f"CONFIG_SHA256={v.config_sha256}", "--build-arg", f"GIT_COMMIT={git_commit}"]
    if weights == "copy":
        argv += ["--build-arg", f"WEIGHTS_DIR={rel(v.weights_dir, root)}"]
    return argv + [str(root)]


def gpu_run_flags() -> list[str]:
    # --ipc=host: NCCL (TP/DP > 1) and vLLM's shared-memory broadcast need more than Docker's
    # 64 MiB /dev/shm. --init reaps the server's children under PID 1.
    return ["--gpus", "all", "--ipc=host", "--init"]


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


def run_argv(v, overrides, tag: str, name: str, host_port: int, weights: str, root: Path = ROOT) -> list[str]:
    """docker run of the shipped image, detached, its port published on 127.0.0.1 only."""
    argv = ["docker", "run", "--detach", *gpu_run_flags(), "--name", name,
            "--publish", f"127.0.0.1:{host_port}:{v['PORT']}",
            # A cache miss becomes a start failure instead of a silent recompile (not in the key).
            "--env", "VLLM_FORCE_AOT_LOAD=1"]
    if weights == "mount":
        argv += ["--volume", f"{v.weights_dir}:{in_image(v.weights_dir, root)}:ro"]
    return argv + [tag, *set_args(overrides)]


def labels_argv(tag: str) -> list[str]:
    return ["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", tag]


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


# -- checks (pure) --------------------------------------------------------------------------
def check_cache_members(members: list[tarfile.TarInfo], variant_name: str) -> list[str]:
    """Problems with a cache tarball's layout: it must hold weights/cache/<variant>/ and nothing else."""
    prefix = PurePosixPath("weights", "cache", variant_name)
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
        prefix = f"weights/cache/{v.name}/"
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


def cache_evidence(log: str, diff: str, cache_in_image: str) -> dict:
    """Did the container load the baked cache? Log markers plus the files it added under the cache.

    diff is `docker diff` output ("A /path", "C /path"): a compile artifact added or changed under
    the cache root means something was compiled at start, whatever the log says.
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
    return {"hit": bool(loads) and not compiles and not graphs, "direct_loads": len(loads),
            "compiles": len(compiles), "new_artifacts": sorted(added)[:20], "new_artifact_count": len(added),
            "compile_total_s": total[-1] if total else None, "evidence": (loads + compiles)[:10]}


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
class Docker:
    """Runs (or, with dry_run, prints) docker command lines."""

    def __init__(self, dry_run: bool):
        self.dry_run = dry_run
        if not dry_run and not shutil.which("docker"):
            raise KitError("docker is not on PATH: building and verifying images needs Docker (and the "
                           "NVIDIA Container Toolkit for the GPU steps); --dry-run prints the commands")

    def show(self, argv, env=None):
        prefix = " ".join(f"{k}={v}" for k, v in (env or {}).items())
        print((prefix + " " if prefix else "") + shlex.join(argv))

    def run(self, argv, env=None, capture=False, check=True, quiet=False) -> str:
        if self.dry_run:
            self.show(argv, env)
            return ""
        if not quiet:
            print("+ " + shlex.join(argv), file=sys.stderr)
        p = subprocess.run(argv, env={**os.environ, **(env or {})}, text=True,
                           stdout=subprocess.PIPE if capture else None,
                           stderr=subprocess.STDOUT if capture else None)
        if check and p.returncode != 0:
            tail = ("\n" + p.stdout[-2000:]) if capture and p.stdout else ""
            raise KitError(f"{argv[0]} {argv[1]} failed with exit code {p.returncode}{tail}")
        return p.stdout or ""


def image_facts(docker: Docker, tag: str) -> dict | None:
    out = docker.run(facts_argv(tag), capture=True)
    if docker.dry_run:
        return None
    return json.loads(out.strip().splitlines()[-1])


def import_cache(v, tarball: Path, dry_run: bool, dest: Path | None = None) -> dict:
    """Check a cache tarball and extract it to weights/cache/<variant>/ (atomically); returns its manifest."""
    if not tarball.is_file():
        raise KitError(f"--cache {tarball}: no such file")
    with tarfile.open(tarball) as tar:
        members = tar.getmembers()
        problems = check_cache_members(members, v.name)
        if problems:
            raise KitError(f"{tarball}: not a cache of {v.name}: " + "; ".join(problems[:5]))
        mname = next(m for m in members if m.name.removeprefix("./") == f"weights/cache/{v.name}/{cachekey.MANIFEST_NAME}")
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
            (tmp / "weights" / "cache" / v.name).rename(dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return doc


def cmd_build(a, v) -> int:
    docker = Docker(a.dry_run)
    sha, _dirty = git_state()
    tag = a.tag or image_tag(v)
    if not a.dry_run and (a.weights == "copy" or not a.cache):
        from scripts.kit import weights
        weights.require(v)
    if a.cache:
        doc = import_cache(v, Path(a.cache).resolve(), a.dry_run)
    else:
        # Bake in the image's own environment (see the module docstring). The runtime image mounts
        # the weights, so this step never copies them.
        docker.run(build_argv(v, image_tag(v, runtime=True), "runtime", "mount", sha), env=BUILD_ENV)
        passthrough = {k: os.environ[k] for k in ("KIT_DEVICE_NAME", "KIT_DEVICE_CC") if os.environ.get(k)}
        docker.run(bake_argv(v, a.set, image_tag(v, runtime=True), sha, os.getuid(), os.getgid(),
                             passthrough=passthrough))
        doc = None if a.dry_run else cachekey.load_manifest(v)
        if doc is None and not a.dry_run:
            raise KitError(f"the bake wrote no manifest under {rel(v.cache_root)}")
    docker.run(build_argv(v, tag, "image", a.weights, sha), env=BUILD_ENV)
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
    docker = Docker(a.dry_run)
    tag = a.tag or image_tag(v)
    weights_mode = a.weights
    if not a.dry_run:
        labels = json.loads(docker.run(labels_argv(tag), capture=True).strip() or "{}") or {}
        if labels.get("kit.config_sha256") != v.config_sha256:
            raise KitError(f"{tag} was built for config {labels.get('kit.config_sha256', '?')[:12]}, "
                           f"{v.name} resolves to {v.config_sha256[:12]}: rebuild, or pass the same SET as the build")
        weights_mode = weights_mode or labels.get("kit.weights", "mount")
    weights_mode = weights_mode or "mount"
    if weights_mode == "mount" and not a.dry_run:
        from scripts.kit import weights
        weights.require(v)
    port = free_port()
    name = f"kit-verify-{k8s.k8s_name(v.name)}-{os.getpid()}"
    started = time.time()
    run = run_argv(v, a.set, tag, name, port, weights_mode)
    if a.dry_run:
        cid = "CONTAINER_ID"
        docker.show(run)
        print(f"# poll http://127.0.0.1:{port}/health until 200 (READY_TIMEOUT_S={v['READY_TIMEOUT_S']}), "
              f"then POST /v1/completions, then:")
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
                    raise KitError(f"container {cid[:12]} exited before it was ready:\n"
                                   + docker.run(logs_argv(cid), capture=True, check=False)[-3000:])
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
        token_ids = v["WEIGHTS"] == "dummy" and v["DUMMY_TOKENIZER"] == "none"
        t = time.perf_counter()
        r = requests.post(url + "/v1/completions", timeout=300, json={
            "model": v.name, "prompt": [1, 2, 3, 4] if token_ids else "The capital of France is",
            "max_tokens": 16, "temperature": 0})
        completion = {"status": r.status_code, "latency_ms": round((time.perf_counter() - t) * 1e3, 2)}
        if r.status_code != 200:
            raise KitError(f"POST /v1/completions answered {r.status_code}: {r.text[:300]}")
        body = r.json()
        completion.update(sample=body["choices"][0].get("text", "")[:200], tokens=body["usage"]["completion_tokens"])
        docker.run(stop_argv(cid), capture=True)
        log = docker.run(logs_argv(cid), capture=True)
        evidence = cache_evidence(log, docker.run(diff_argv(cid), capture=True), in_image(v.cache_root))
    finally:
        docker.run(rm_argv(cid), capture=True, check=False)
    payload = {"image": tag, "weights": weights_mode, "docker_run": run, "ready_s": round(ready_s, 2),
               "completion": completion, "cache": evidence}
    path = write_record(make_record("image_verify", v, payload, started=started))
    print(f"record: {path}", file=sys.stderr)
    refresh_after_write(path)
    if not evidence["hit"]:
        raise KitError(f"{tag}: the baked cache was NOT hit ({evidence['direct_loads']} direct loads, "
                       f"{evidence['compiles']} compiles, {evidence['new_artifact_count']} new artifacts); see {path}")
    print(f"{tag}: ready in {ready_s:.1f} s, completion {completion['latency_ms']} ms, cache hit "
          f"({evidence['direct_loads']} direct loads, no compile)", file=sys.stderr)
    return 0


def render_k8s(v, image: str, overrides, **kw) -> list[tuple[str, str]]:
    """(file name, YAML text) per resource, in apply order."""
    import yaml
    docs = k8s.render(v, image, ROOT, overrides=overrides, **kw)
    return [(f"{i:02d}-{d['kind'].lower()}.yaml", yaml.safe_dump(d, sort_keys=False)) for i, d in enumerate(docs)]


def cmd_k8s(a, v) -> int:
    files = render_k8s(v, a.image or image_tag(v), a.set, namespace=a.namespace, max_replicas=a.max_replicas,
                       waiting_per_pod=a.waiting_per_pod, storage_class=a.storage_class,
                       cache_on_pvc=a.cache_on_pvc, policy=a.policy, router_image=a.router_image)
    head = k8s.header(v, k8s.gpu_count(v))
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

    def common(sp):
        sp.add_argument("--variant", default="tiny", help="experiments/<variant>/ (default: tiny)")
        sp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config key (repeatable); pass the same to build, verify and k8s")
        sp.add_argument("--dry-run", action="store_true", help="print the docker commands; run none")
    b = sub.add_parser("build", help="bake in the runtime image, then build the shipped image")
    common(b)
    b.add_argument("--cache", help="cache tarball baked elsewhere (skips the bake)")
    b.add_argument("--weights", choices=["copy", "mount"], default="copy",
                   help="copy the weights into the image (default) or mount them at run time")
    b.add_argument("--tag", help=f"image tag (default {REPOSITORY}:<variant>)")
    ver = sub.add_parser("verify", help="run the image on the GPU, one completion, prove the cache hit")
    common(ver)
    ver.add_argument("--tag", help=f"image tag (default {REPOSITORY}:<variant>)")
    ver.add_argument("--weights", choices=["copy", "mount"], default=None,
                     help="mount the host's weights read-only (default: from the image's kit.weights label)")
    kk = sub.add_parser("k8s", help="render Kubernetes manifests (stdout, or --out DIR)")
    common(kk)
    kk.add_argument("--image", help=f"image reference (default {REPOSITORY}:<variant>)")
    kk.add_argument("--out", help="write one YAML per resource into this folder")
    kk.add_argument("--namespace")
    kk.add_argument("--max-replicas", type=int, default=4)
    kk.add_argument("--waiting-per-pod", type=int, default=4, help="HPA target: queued requests per pod")
    kk.add_argument("--storage-class")
    kk.add_argument("--cache-on-pvc", action="store_true",
                    help="mount weights/cache/<variant> from the PVC instead of using the image's baked cache")
    kk.add_argument("--policy", help="vllm-router's policy (default: the variant's FLEET_POLICY; make k8s POLICY=)")
    kk.add_argument("--router-image", help="image with vllm-router on PATH (default: the --image)")
    a = p.parse_args(argv)
    v = load(a.variant, a.set)
    return {"build": cmd_build, "verify": cmd_verify, "k8s": cmd_k8s}[a.verb](a, v)


if __name__ == "__main__":
    run_main(main)
