"""The shell scripts CI and the GPU sessions run parse (`bash -n`).

gpu-prepare.sh once lost a comment's `#` in a commit and failed on its first line of use, with no test to say so.
"""
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p for p in (ROOT / ".ci").iterdir() if p.suffix == ".sh" or p.name == "run")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_ci_script_parses(script):
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, f"{script.relative_to(ROOT)}: {r.stderr.strip()}"


def test_more_refuses_a_machine_without_the_payload_and_runs_nothing(tmp_path):
    """Session 20261129T0735Z: a leftover loop sent to a machine that had gone back ran on a fresh one and failed 2120
    times in 400 s of device time. `more` checks first and stops."""
    if pathlib.Path("/tmp/site/vllm").exists():
        pytest.skip("this machine has a payload in /tmp/site")
    r = subprocess.run(["bash", str(ROOT / ".ci" / "gpu-session.sh"), "more", "3", "-", "LAZY_IMPORTS=1"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "KIT_GIT_COMMIT": ""})
    assert r.returncode == 2 and "no payload in /tmp/site" in r.stderr
    assert "===" not in r.stdout  # no step ran


@pytest.mark.parametrize("args, says", [
    (["chain", "start13", "4", "++", "gemm4"], "'++' joins modes only under chain"),  # NAME left out
    (["gemm4"], "no MODE after NAME 'gemm4'"),
    (["g", "gemm0"], "'gemm0' is not a mode"),
    (["c", "chain", "start13", "4", "++", "gemm0"], "'gemm0' is not a mode"),
])
def test_detach_refuses_a_command_it_would_misread_and_detaches_nothing(tmp_path, args, says):
    """Session 20261129T1104Z: `detach chain start13 4 ++ gemm4` ran start13 alone as a job named chain, and
    `detach gemm4` detached a job with no mode; both said `detached`."""
    r = subprocess.run(["bash", str(ROOT / ".ci" / "gpu-session.sh"), "detach", *args], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "KIT_GIT_COMMIT": ""})
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert "detached" not in r.stdout and not any(tmp_path.iterdir())


def test_detach_refuses_a_job_name_this_machine_has_used(tmp_path):
    """Session 20261204T1851Z: a second job detached as `m` after a first `m` had ended overwrote its log, and the old
    jobs/m.rc made `collect` call the new job done at once. The job folder is the device's fixed /tmp/kit/jobs."""
    import uuid
    jobs = pathlib.Path("/tmp/kit/jobs")
    made = not jobs.parent.exists()
    name = f"kit-test-{uuid.uuid4().hex[:8]}"
    jobs.mkdir(parents=True, exist_ok=True)
    (jobs / f"{name}.log").write_text("an earlier job's log\n")
    try:
        r = subprocess.run(["bash", str(ROOT / ".ci" / "gpu-session.sh"), "detach", name, "collect", "5"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "KIT_GIT_COMMIT": ""})
        assert r.returncode == 2 and f"a job named {name} ran on this machine already" in r.stderr, r.stderr
        assert "detached" not in r.stdout and (jobs / f"{name}.log").read_text() == "an earlier job's log\n"
    finally:
        (jobs / f"{name}.log").unlink()
        if made:
            import shutil
            shutil.rmtree(jobs.parent, ignore_errors=True)


def test_gpu_session_usage_names_every_mode(tmp_path):
    """An unknown mode prints every mode of the script's case, read from the script itself: the hand-kept usage line
    had fallen 20 modes behind (2026-12-06). A label without a comment is listed too."""
    import re
    script = ROOT / ".ci" / "gpu-session.sh"
    labels = re.findall(r"^  ([a-z0-9][a-z0-9_-]*)\)", script.read_text(), flags=re.M)
    r = subprocess.run(["bash", str(script), "no-such-mode"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "KIT_GIT_COMMIT": ""})
    assert r.returncode == 2
    listed = re.findall(r"^  ([a-z0-9][a-z0-9_-]*)(?:  |$)", r.stderr, flags=re.M)
    assert len(labels) > 90 and listed == labels
    assert re.search(r"^  megastep  issue 32", r.stderr, flags=re.M)  # with the first line of its comment
