"""scripts/kit/procstat.py: a local server's threads found from its port, and the scheduler's counters of them around
a window. Real processes and real /proc: a listener that forks a spinning child stands for a server and its engine."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.kit import procstat
from scripts.kit.procs import free_port

LISTENER = r'''
import os, socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
if os.fork() == 0:   # the "engine": a child that keeps a CPU busy until killed
    s.close()
    while True:
        pass
print("listening", flush=True)
sys.stdin.read()     # the "API server": waits until the test closes its stdin
'''


@pytest.fixture
def listener():
    port = free_port()
    p = subprocess.Popen([sys.executable, "-c", LISTENER, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        assert p.stdout.readline().strip() == "listening"
        yield port, p
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # its own session: the forked child goes with it
        p.wait(10)


@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="this kernel keeps no schedstat")
def test_a_local_servers_processes_are_found_from_its_port_and_the_busy_one_leads(listener):
    port, p = listener
    pids = procstat.server_pids(f"http://127.0.0.1:{port}/v1")
    assert p.pid in pids and len(pids) == 2  # the listener and its forked child
    before = procstat.snapshot(pids)
    t0 = time.monotonic()
    time.sleep(0.5)  # the window the counters cover, as a timed pass would be
    s = procstat.pass_summary(before, procstat.snapshot(pids), time.monotonic() - t0)
    assert s["threads"] == 2 and s["busiest"]["run_pct"] > 30 and s["run_s"] >= s["busiest"]["run_s"]
    assert s["busiest"]["wait_pct"] >= 0 and s["busiest"]["forced_switches"] >= 0


def test_nothing_is_read_for_a_remote_url_or_a_port_nothing_listens_on():
    assert procstat.server_pids("http://10.1.2.3:8000") == []
    assert procstat.server_pids(f"http://127.0.0.1:{free_port()}") == []


def test_pass_summary_takes_differences_and_leaves_out_threads_born_in_the_window():
    t = lambda comm, run, wait, forced: {"comm": comm, "run_ns": run, "wait_ns": wait, "forced": forced}
    before = {"1/1": t("api", 0, 0, 0), "2/2": t("engine", 10**9, 0, 5)}
    after = {"1/1": t("api", 2 * 10**8, 10**8, 1), "2/2": t("engine", 18 * 10**8, 4 * 10**8, 9),
             "2/3": t("new", 5 * 10**9, 0, 0)}
    s = procstat.pass_summary(before, after, 2.0)
    assert s == {"threads": 2, "run_s": 1.0, "wait_s": 0.5,
                 "busiest": {"comm": "engine", "run_s": 0.8, "wait_s": 0.4, "run_pct": 40.0, "wait_pct": 20.0,
                             "forced_switches": 4}}
    assert procstat.pass_summary({}, after, 2.0) is None and procstat.pass_summary(before, after, 0) is None


def test_a_descriptor_closed_while_the_scan_reads_does_not_hide_its_process(tmp_path, monkeypatch):
    """The compare tests' fake servers run in the pytest process, whose connections open and close while /proc is
    read: a descriptor listed and then gone made the whole process look like it held no listening socket (its
    passes then had no server_sched, in one test order). A stand-in /proc tree; the vanished fd raises as a real one
    does."""
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    (proc / "net" / "tcp").write_text("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
                                      "timeout inode\n   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 "
                                      "00000000     0        0 4242 1 0000000000000000 100 0 0 10 0\n")
    fd = proc / "77" / "fd"
    fd.mkdir(parents=True)
    for i in range(8):  # gone before it is read: listed first or not, it must not end the process's scan
        (fd / str(i)).symlink_to(f"pipe:[{i}]")
    (fd / "9").symlink_to("socket:[4242]")
    real = os.readlink
    monkeypatch.setattr(os, "readlink", lambda p: (_ for _ in ()).throw(FileNotFoundError(p))
                        if Path(p).name in {str(i) for i in range(8)} else real(p))
    assert procstat.pids_listening(8080, proc) == [77]
