"""ServerProcess: readiness by /health, crash vs timeout, busy port, group teardown.
The server here is a stdlib HTTP server (a stand-in for vLLM's readiness contract only)."""
import re
import socket
import sys
import textwrap

import pytest

from scripts.kit.errors import KitError
from scripts.kit.procs import ServerProcess, free_port, group_members

# Serves /health after a delay and spawns a grandchild, so teardown must take the whole group.
STANDIN = textwrap.dedent("""
    import http.server, subprocess, sys, time
    delay, port = float(sys.argv[1]), int(sys.argv[2])
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    time.sleep(delay)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404); self.end_headers()
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


def standin(tmp_path, delay=0.5, port=None, timeout=30):
    port = port or free_port()
    script = tmp_path / "standin.py"
    script.write_text(STANDIN)
    return ServerProcess([sys.executable, str(script), str(delay), str(port)], {}, "127.0.0.1", port,
                         ready_timeout_s=timeout, log_path=tmp_path / "log.txt")


def test_ready_then_whole_group_stopped(tmp_path):
    srv = standin(tmp_path, delay=1.0)
    with srv:
        assert srv.ready_s >= 1.0
        pgid = srv.proc.pid
        assert len(group_members(pgid)) == 2  # server + grandchild
    assert group_members(pgid) == []


def test_a_shown_start_counts_the_wait_on_stderr_and_keeps_the_callers_on_wait(tmp_path, capfd):
    """`srv.shown(desc)` (bake, standby): a seconds counter while the server starts, the caller's on_wait still
    called, the group stopped at the end; a start that fails still raises and leaves nothing up."""
    srv, seen = standin(tmp_path, delay=2.5), []
    srv.on_wait = seen.append
    with srv.shown("starting the stand-in") as s:
        assert s is srv and srv.alive() and srv.ready_s >= 2.5
        pgid = srv.proc.pid
    assert group_members(pgid) == [] and seen and max(seen) >= 2.0 and srv.on_wait == seen.append
    err = capfd.readouterr().err
    counts = [int(n) for n in re.findall(r"starting the stand-in: (\d+)s", err)]
    assert counts and counts[-1] >= 2 and "s/s" not in err, err  # the last count, no rate
    assert err.count("starting the stand-in") <= 2, err  # into a file: the first and last draw, not one a second
    bad = standin(tmp_path, delay=60, timeout=2)
    with pytest.raises(KitError, match="not ready after 2 s"):
        with bad.shown("starting a slow one"):
            pass
    assert group_members(bad.proc.pid) == []


def test_crash_before_ready_is_reported_as_crash(tmp_path):
    port = free_port()
    srv = ServerProcess([sys.executable, "-c", "print('boom: bad flag'); raise SystemExit(3)"], {}, "127.0.0.1",
                        port, ready_timeout_s=30, log_path=tmp_path / "log.txt")
    with pytest.raises(KitError, match=r"(?s)exited with code 3 before it was ready.*boom: bad flag"):
        with srv:
            pass


def test_timeout_stops_the_server(tmp_path):
    srv = standin(tmp_path, delay=60, timeout=2)
    with pytest.raises(KitError, match="not ready after 2 s"):
        with srv:
            pass
    assert group_members(srv.proc.pid) == []


def test_busy_port_is_refused_before_starting(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        srv = standin(tmp_path, port=port)
        with pytest.raises(KitError, match=f"port {port} on 127.0.0.1 is already in use"):
            srv.start()
        assert srv.proc is None


def test_busy_port_hint_names_the_make_form_that_works(tmp_path):
    """Issue 20: the hint said `PORT=...`, a make variable the kit never reads; only SET= reaches it,
    and of several SET= make keeps the last, so several overrides go in one quoted SET."""
    from scripts.kit.procs import busy_port_message, port_free
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        msg = busy_port_message("127.0.0.1", port)
        alt = int(msg.split('SET="PORT=')[1].split('"')[0])
        assert alt != port and port_free("127.0.0.1", alt)  # a port that is free now
        assert f'SET="PORT={alt}"' in msg and f'SET="PORT={alt} WEIGHTS=dummy"' in msg
        assert f"--set PORT={alt}" in msg
        assert "PORT=" not in msg.replace('SET="PORT=', "").replace("--set PORT=", "")  # no bare PORT=
        srv = standin(tmp_path, port=port)
        with pytest.raises(KitError) as e:
            srv.start()
        assert 'SET="PORT=' in str(e.value)


def test_a_starting_server_holds_the_gpu_lock_shared_until_ready(tmp_path, monkeypatch):
    """KIT_PROBE_LOCK (set by .ci/gpu-session.sh): a probe times under it exclusively; a server holds
    it shared from spawn to ready, so no probe times beside a neighbour's start-up (2026-11-25, H100:
    a tune's seeds were timed while DFlash servers started), and a start waits for a timing probe."""
    import fcntl
    import threading
    from scripts.kit.procs import flock
    lock = tmp_path / "gpu.lock"
    monkeypatch.setenv("KIT_PROBE_LOCK", str(lock))

    def probe_could_time() -> bool:
        with open(lock, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                return False

    # 1. A probe is timing: the server is not spawned until it is done.
    srv = standin(tmp_path, delay=0.2)
    holding = flock(lock)
    holding.__enter__()
    t = threading.Thread(target=srv.start)
    t.start()
    t.join(timeout=2)
    assert t.is_alive() and srv.proc is None
    holding.__exit__(None, None, None)
    t.join(timeout=30)
    assert srv.proc is not None
    # 2. While it starts, no probe may time; other start-ups may (shared); once ready, the lock is free.
    assert not probe_could_time()
    with flock(lock, shared=True):
        pass
    srv.wait_ready()
    assert probe_could_time()
    srv.stop()
    # 3. A server that could not be spawned, or was stopped before it was ready, lets go of it too.
    missing = ServerProcess([str(tmp_path / "no-such-server")], {}, "127.0.0.1", free_port())
    with pytest.raises(FileNotFoundError):
        missing.start()
    assert probe_could_time()
    slow = standin(tmp_path, delay=60, timeout=1)
    with pytest.raises(KitError, match="not ready after 1 s"):
        with slow:
            pass
    assert probe_could_time()


def test_a_failed_start_names_the_engines_exception_not_the_api_servers_wrapper(tmp_path):
    """2026-11-25 on the H100: the log's last 25 lines were the API server's traceback ending in
    'Engine core initialization failed'; the cause was 40 lines above. The replay is that server's
    own log (committed), printed by a process that then exits 1, as vLLM did."""
    from scripts.kit.paths import ROOT
    real = ROOT / "results/gpu-sessions/20261125T1033Z/logs/qwen3.5-4b-bf16/serve-20261125T105052-8202.log"
    srv = ServerProcess([sys.executable, "-c", f"import sys; sys.stdout.write(open({str(real)!r}).read()); sys.exit(1)"],
                        {}, "127.0.0.1", free_port(), ready_timeout_s=30, log_path=tmp_path / "log.txt")
    with pytest.raises(KitError, match=r"cause \(line \d+ of the log\): ValueError: max_num_seqs \(1024\) exceeds "
                                       r"available Mamba cache blocks \(248\).*; fix: set SERVE_MAX_NUM_SEQS to at most 248 "
                                       r"\(it is 1024\), or give the KV cache more memory \(SERVE_KV_CACHE_MEMORY_BYTES"):
        with srv:
            pass
    # The fd-limit warning quotes an OSError on every start; it is not a cause.
    (tmp_path / "w.txt").write_text("WARNING x: fd limit errors like `OSError: [Errno 24] Too many open files`\n")
    srv.log_path = tmp_path / "w.txt"
    assert srv.root_cause() is None


@pytest.mark.parametrize("log, size", [
    # -mega's warm start on its bake's startup plan, out of memory in vLLM's V2 warm-up
    ("20261206T0552Z/logs/qwen3.5-4b-fp8-v4-mega/settle-20261206T060152.log.gz", "1.71 GiB"),
    # v4's cold bake, out of memory in FlashInfer's autotune pass
    ("20261206T0747Z/logs/qwen3.5-4b-fp8-v4/bake-20261206T075318.log.gz", "2.00 GiB")])
def test_a_start_out_of_gpu_memory_names_the_allocation_and_the_keys_that_leave_room(tmp_path, log, size):
    """2026-12-06 on the H100, two engines out of memory in the GDN prefill after the KV cache was allocated. The
    replay is each engine's own log (committed, gzipped), printed by a process that then exits 1."""
    import gzip
    from scripts.kit.paths import ROOT
    real = ROOT / "results/gpu-sessions" / log
    (tmp_path / "replay.log").write_bytes(gzip.decompress(real.read_bytes()))
    srv = ServerProcess([sys.executable, "-c", f"import sys; sys.stdout.write(open({str(tmp_path / 'replay.log')!r})"
                         ".read()); sys.exit(1)"], {}, "127.0.0.1", free_port(), ready_timeout_s=30,
                        log_path=tmp_path / "log.txt")
    s = re.escape(size)
    with pytest.raises(KitError, match=rf"cause \(line \d+ of the log\): torch\.OutOfMemoryError: CUDA out of memory\. "
                                       rf"Tried to allocate {s}.*; fix: leave the engine more than the {s} it "
                                       r"asked for: fewer sequences \(SERVE_MAX_NUM_SEQS.*; the allocation is a Gated "
                                       r"DeltaNet prefill's per-sequence states.*GDN_PROFILE_STATES=on"):
        with srv:
            pass


def test_an_out_of_memory_start_without_a_gdn_frame_gets_no_gdn_hint(tmp_path):
    log = tmp_path / "replay.log"
    log.write_text("INFO starting\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a "
                   "total capacity of 79.18 GiB of which 1.00 GiB is free.\n")
    srv = ServerProcess([sys.executable, "-c", f"import sys; sys.stdout.write(open({str(log)!r}).read()); sys.exit(1)"],
                        {}, "127.0.0.1", free_port(), ready_timeout_s=30, log_path=tmp_path / "log.txt")
    with pytest.raises(KitError, match=r"fix: leave the engine more than the 3\.00 GiB") as e:
        with srv:
            pass
    assert "Gated DeltaNet" not in str(e.value)


# Says it is up, serves /health, and on SIGTERM does what vLLM does at every stop: prints a traceback
# and leak warnings, and leaves a vllm_dist_* file in the temp folder.
NOISY = textwrap.dedent("""
    import http.server, os, signal, sys, tempfile, threading
    port = int(sys.argv[1])
    open(os.path.join(tempfile.gettempdir(), "vllm_dist_0123abcd"), "w").write("store")
    def on_term(*_):
        sys.stderr.write("Traceback (most recent call last):\\nvllm.v1.engine.exceptions.EngineDeadError: "
                         "EngineCore encountered an issue\\n")
        sys.stderr.write("resource_tracker: There appear to be 1 leaked semaphore objects to clean up\\n")
        sys.stderr.flush()
        os._exit(1)
    signal.signal(signal.SIGTERM, on_term)
    print(f"serving on {port}", flush=True)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers()
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


def test_our_stop_is_quiet_and_leaves_no_temp_files(tmp_path, monkeypatch, capfd):
    """Issue #20: every stop printed vLLM's EngineDeadError traceback and leak warnings to the
    terminal of `make serve` (no log file: the server's output is ours), and left vllm_dist_* in
    the temp folder. The server's output before the stop still reaches the terminal."""
    import tempfile
    import time
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    script = tmp_path / "noisy.py"
    script.write_text(NOISY)
    port = free_port()
    srv = ServerProcess([sys.executable, str(script), str(port)], {}, "127.0.0.1", port, ready_timeout_s=30)
    seen = ""
    with srv:
        assert [p.name for p in temp.iterdir()][0].startswith("kit-server-")  # its TMPDIR, under ours
        assert list(temp.glob("kit-server-*/vllm_dist_*"))
        for _ in range(50):
            seen += capfd.readouterr().out
            if "serving on" in seen:
                break
            time.sleep(0.1)
    assert f"serving on {port}" in seen
    err = capfd.readouterr().err
    assert "Traceback" not in err and "EngineDeadError" not in err and "leaked" not in err
    assert list(temp.iterdir()) == []  # the server's temp folder went with it


def test_a_crash_is_still_shown_without_a_log(tmp_path, capfd):
    """Silence is for the stop we asked for: a server that dies on its own still shows why."""
    srv = ServerProcess([sys.executable, "-c", "import sys; sys.stderr.write('boom: bad flag\\n'); sys.exit(3)"],
                        {}, "127.0.0.1", free_port(), ready_timeout_s=30)
    with pytest.raises(KitError, match="exited with code 3 before it was ready"):
        with srv:
            pass
    assert "boom: bad flag" in capfd.readouterr().err


def test_a_group_member_that_ignores_sigterm_is_killed_and_the_stop_says_so(tmp_path, capfd):
    """A grandchild that ignores SIGTERM holds the group past the grace: the stop says how many
    processes were still up after SIGTERM, SIGKILLs them, and reports how long it took."""
    port = free_port()
    script = tmp_path / "stubborn.py"
    script.write_text(STANDIN.replace(
        '"import time; time.sleep(600)"',
        '"import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"'))
    srv = ServerProcess([sys.executable, str(script), "0.2", str(port)], {}, "127.0.0.1", port, ready_timeout_s=30)
    srv.start()
    srv.wait_ready()
    pgid = srv.proc.pid
    srv.stop(grace_s=1)
    assert group_members(pgid) == []
    err = capfd.readouterr().err
    assert "1 process(es) still up" in err and "SIGTERM" in err


def test_a_terminated_test_run_still_stops_the_servers_its_fixtures_started(tmp_path):
    """SIGTERM to pytest (a CI timeout) runs fixture teardown, as Ctrl-C does: the group a fixture started is
    gone once pytest has exited (2026-11-26: a terminated run left three vLLM servers running)."""
    import os
    import signal
    import subprocess
    import time
    from scripts.kit.paths import ROOT
    marker = tmp_path / "group"
    (tmp_path / "test_child.py").write_text(textwrap.dedent(f"""
        import os, signal, subprocess, time, pytest

        @pytest.fixture
        def server():
            p = subprocess.Popen(["sleep", "300"], start_new_session=True)
            open({str(marker)!r}, "w").write(str(p.pid))
            yield p
            os.killpg(p.pid, signal.SIGTERM)
            p.wait()

        def test_waits(server):
            time.sleep(300)
        """))
    child = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
                              str(tmp_path / "test_child.py")], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not (marker.exists() and marker.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    pgid = int(marker.read_text())
    assert group_members(pgid), "the fixture's process did not start"
    child.send_signal(signal.SIGTERM)
    child.wait(timeout=60)
    assert group_members(pgid) == [], child.stdout.read().decode()[-2000:]


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_an_entry_point_started_in_the_background_still_stops_on_int_and_term(tmp_path, sig):
    """A shell script's `cmd &` hands the job SIGINT ignored; stop_on_signals (every entry point calls it)
    makes INT and TERM both reach the cleanup. Real processes and real signals."""
    import signal
    import subprocess
    child = textwrap.dedent("""
        import signal, sys, time
        from scripts.kit.procs import stop_on_signals
        print("inherited-ignored", signal.getsignal(signal.SIGINT) is signal.SIG_IGN, flush=True)
        stop_on_signals()
        try:  # "armed" inside the try: a signal right after it must reach the cleanup, not the interpreter
            print("armed", flush=True)
            time.sleep(60)
        except KeyboardInterrupt:
            print("cleanup ran", flush=True)
            sys.exit(0)
        sys.exit(3)
    """)
    p = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert p.stdout.readline().split() == ["inherited-ignored", "True"]
        assert p.stdout.readline().strip() == "armed"
        p.send_signal(getattr(signal, sig))
        assert p.wait(timeout=20) == 0
        assert p.stdout.read().strip() == "cleanup ran"
    finally:
        if p.poll() is None:
            p.kill()


def _allowed(pid: int) -> set[int]:
    from scripts.kit.procs import parse_cpus
    return parse_cpus(open(f"/proc/{pid}/status").read().split("Cpus_allowed_list:")[1].split()[0])


@pytest.mark.skipif(not hasattr(__import__("os"), "sched_setaffinity"), reason="Linux CPU affinity")
def test_a_server_started_from_a_narrowed_thread_gets_every_cpu_of_the_process(tmp_path):
    """A server started without a slice gets its parent's whole CPU set, whatever the starting thread's (the
    supervisor restarts replicas from its own threads)."""
    import os
    import threading
    every = os.sched_getaffinity(0)
    if len(every) < 2:
        pytest.skip("one CPU: nothing to narrow")
    allowed = {}

    def start_narrowed():
        os.sched_setaffinity(0, {min(every)})  # this thread only
        srv.start()
        allowed["child"] = _allowed(srv.proc.pid)
        allowed["thread"] = os.sched_getaffinity(0)

    srv = standin(tmp_path, delay=0.2)
    try:
        t = threading.Thread(target=start_narrowed)
        t.start()
        t.join(30)
        assert allowed["thread"] == {min(every)}  # the narrowing took, on the starting thread
        srv.wait_ready()
    finally:
        srv.stop()
    assert allowed["child"] == every  # the process's whole set, not the starting thread's one CPU


@pytest.mark.skipif(not hasattr(__import__("os"), "sched_setaffinity"), reason="Linux CPU affinity")
def test_a_server_given_a_cpu_slice_and_what_it_starts_stay_on_it(tmp_path):
    """2026-11-28: MKL's core count at `import torch` moves a process onto each allowed CPU in turn; a restarted
    replica moved onto its neighbour's saturated CPU stopped in the kernel and outlived SIGKILL. A replica's
    processes, the ones its server starts included, are held to its slice."""
    import os
    every = os.sched_getaffinity(0)
    if len(every) < 2:
        pytest.skip("one CPU: nothing to slice")
    one = {max(every)}
    srv = standin(tmp_path, delay=0.5)
    srv.cpus = one
    try:
        srv.start()
        srv.wait_ready()  # the stand-in has started its own child by now
        members = group_members(srv.proc.pid)
        assert len(members) == 2 and all(_allowed(pid) == one for pid in members)
    finally:
        srv.stop()


@pytest.mark.parametrize("spec, cpus", [("0", {0}), ("0,1", {0, 1}), ("0-3,6", {0, 1, 2, 3, 6}), (" 2 ", {2}),
                                        ("auto", None), ("nobind", None), ("0-1|2-3", None), ("", None), (None, None)])
def test_parse_cpus_reads_one_slice_and_nothing_else(spec, cpus):
    from scripts.kit.procs import parse_cpus
    assert parse_cpus(spec) == cpus


def test_spare_ports_are_free_blocks_outside_the_ephemeral_range():
    """A port from the kernel's ephemeral range can be taken by any outgoing connection or port-0 bind (vLLM's
    engines) before the server that was given it binds it; spare_ports (and free_port) choose outside it."""
    from scripts.kit.procs import EPHEMERAL_RANGE, port_free, spare_ports
    lo, hi = map(int, EPHEMERAL_RANGE.read_text().split())
    bases = spare_ports(5, span=3)
    blocks = [set(range(b, b + 3)) for b in bases]
    assert len(set().union(*blocks)) == 15  # five blocks, none overlapping
    for b in blocks:
        assert all(not lo <= p <= hi and port_free("127.0.0.1", p) for p in b)
    assert not lo <= free_port() <= hi
