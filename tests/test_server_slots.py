"""KIT_SERVER_SLOTS (scripts/kit/procs.py): a host-wide cap on vLLM servers started at once; the tests' count."""
from __future__ import annotations

import re
import sys
import tempfile

import pytest

from scripts.kit import procs
from scripts.kit.errors import KitError
from tests import server_slots


def test_a_slot_is_held_until_given_back_and_a_full_set_waits_then_starts_anyway(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv(procs.SLOTS_ENV, "2")
    a, b = procs.take_server_slot("a"), procs.take_server_slot("b")
    assert a is not None and b is not None and any(tmp_path.glob("kit-server-slots-*/slot-1"))
    # Both held (each through its own open file, as another process would hold them).
    assert procs.take_server_slot("c", wait_s=0.2) is None
    err = capsys.readouterr().err
    assert "c: waiting for one of 2 server slots (KIT_SERVER_SLOTS)" in err and "c: all 2" in err
    assert "starting anyway" in err
    procs.give_server_slot(a)
    c = procs.take_server_slot("c", wait_s=0.2)
    assert c is not None
    [log] = tmp_path.glob("kit-server-slots-*/waits.log")
    assert re.search(r"pid \d+ c: all 2 server slots \(KIT_SERVER_SLOTS\) still taken after \d+ s; starting anyway",
                     log.read_text())
    procs.give_server_slot(b)
    procs.give_server_slot(c)


def test_unset_means_no_limit_and_a_bad_count_is_named(monkeypatch):
    monkeypatch.delenv(procs.SLOTS_ENV, raising=False)
    assert procs.take_server_slot("x") is None
    monkeypatch.setenv(procs.SLOTS_ENV, "two")
    with pytest.raises(KitError, match=r"KIT_SERVER_SLOTS='two': a number of servers, at least 1"):
        procs.take_server_slot("x")


def test_a_vllm_server_holds_its_slot_from_start_to_stop_and_a_router_takes_none(tmp_path, monkeypatch):
    """Real processes; the 'vLLM server' is a sleeping Python whose argv names vllm_main (vLLM itself cannot start in
    a fast test), so only the slot's life is checked, not vLLM."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv(procs.SLOTS_ENV, "1")
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)", "-m", "scripts.kit.vllm_main"]
    srv = procs.ServerProcess(sleeper, {}, "127.0.0.1", procs.free_port(), log_path=tmp_path / "a.log")
    srv.start()
    try:
        assert procs.take_server_slot("other", wait_s=0.2) is None  # the one slot is the server's
        import threading
        got = []
        t = threading.Thread(target=lambda: got.append(procs.take_server_slot("waiter", wait_s=30)))
        t.start()
        router = procs.ServerProcess([sys.executable, "-c", "import time; time.sleep(60)"], {}, "127.0.0.1",
                                     procs.free_port(), log_path=tmp_path / "r.log")
        router.start()  # not vLLM: starts at once, holds nothing
        router.stop()
    finally:
        srv.stop()
    t.join(timeout=30)
    assert got and got[0] is not None  # the stop handed the slot over
    [log] = tmp_path.glob("kit-server-slots-*/waits.log")
    assert "waiter: slot 0 after" in log.read_text()
    procs.give_server_slot(got[0])


def test_the_tests_count_follows_the_hosts_memory(tmp_path):
    m = tmp_path / "meminfo"
    m.write_text("MemTotal:       24683664 kB\nMemFree: 1 kB\n")
    assert server_slots.for_memory(m) == 5  # (23.5 GiB - 6) / 3.3
    m.write_text("MemTotal:       8000000 kB\n")
    assert server_slots.for_memory(m) == 2
    assert server_slots.for_memory(tmp_path / "none") == 4


def test_only_vllm_servers_count():
    assert procs.is_vllm(["/x/.venv/bin/python", "-m", "scripts.kit.vllm_main", "--model", "m"])
    assert procs.is_vllm(["/usr/bin/vllm", "serve", "m"]) and procs.is_vllm(["vllm", "serve", "m"])
    assert not procs.is_vllm(["/x/.venv/bin/vllm-router", "--port", "1"])
