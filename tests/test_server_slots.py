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
    assert "c: waiting for 1 of 2 server slots (KIT_SERVER_SLOTS)" in err and "c: 1 of 2 server slots" in err
    assert "starting anyway" in err
    procs.give_server_slot(a)
    c = procs.take_server_slot("c", wait_s=0.2)
    assert c is not None
    [log] = tmp_path.glob("kit-server-slots-*/waits.log")
    assert re.search(r"pid \d+ c: 1 of 2 server slots \(KIT_SERVER_SLOTS\) not free after \d+ s; starting anyway",
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


def test_a_group_takes_its_slots_all_at_once_or_holds_none_while_it_waits(tmp_path, monkeypatch, capsys):
    """Two groups each holding part of what they need would wait on each other: a group that cannot have all of its
    slots holds none, so a single start can still go ahead while it waits."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv(procs.SLOTS_ENV, "3")
    other = procs.take_server_slot("other")  # another process's server
    assert procs.take_server_slots(3, "fleet of 3", wait_s=0.2) == []  # 2 free of the 3 it needs: none kept
    assert "fleet of 3: 3 of 3 server slots (KIT_SERVER_SLOTS) not free" in capsys.readouterr().err
    two = [procs.take_server_slot("x", wait_s=0.2), procs.take_server_slot("y", wait_s=0.2)]
    assert None not in two  # the group's failed try left both free
    for fd in two:
        procs.give_server_slot(fd)
    with pytest.raises(KitError, match=r"fleet of 4: 4 servers at once, but KIT_SERVER_SLOTS=3 lets at most 3"):
        procs.take_server_slots(4, "fleet of 4")
    procs.give_server_slot(other)


def test_a_groups_servers_use_its_slots_and_a_nested_group_uses_what_is_left(tmp_path, monkeypatch):
    """server_slots(k): the next k starts in this process take the group's slots instead of new ones; a group inside
    it (a fleet started by a test that reserved for two fleets) takes none while enough are unused; what no server
    took is given back at the end."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv(procs.SLOTS_ENV, "4")
    with procs.server_slots(4, "two fleets"):
        assert procs.take_server_slots(1, "outsider", wait_s=0.2) == []  # all four are the group's
        with procs.server_slots(2, "first fleet"):
            a, b = procs.take_server_slot("a", wait_s=0), procs.take_server_slot("b", wait_s=0)
        assert None not in (a, b)
        with procs.server_slots(2, "second fleet"):
            c = procs.take_server_slot("c", wait_s=0)  # one of the two left; the fourth stays unused
        assert c is not None
        assert procs.take_server_slots(1, "outsider", wait_s=0.2) == []  # the unused one is the group's until its end
    got = procs.take_server_slots(1, "outsider", wait_s=0.2)
    assert len(got) == 1  # given back at the end
    for fd in [a, b, c, *got]:
        procs.give_server_slot(fd)


def test_a_batch_of_children_is_counted_by_its_parent(tmp_path, monkeypatch):
    """sweep's batch: the parent holds the batch's slots, and the children's environment drops KIT_SERVER_SLOTS so
    they do not take more."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv(procs.SLOTS_ENV, "2")
    with procs.slots_for_children(2, "sweep's batch of 2") as env:
        assert procs.SLOTS_ENV not in env and env["PATH"] == __import__("os").environ["PATH"]
        assert procs.take_server_slots(1, "outsider", wait_s=0.2) == []
    monkeypatch.delenv(procs.SLOTS_ENV)
    with procs.slots_for_children(2, "unlimited") as env:
        assert env is None


def test_the_tests_count_follows_the_hosts_memory(tmp_path):
    m = tmp_path / "meminfo"
    m.write_text("MemTotal:       24683664 kB\nMemFree: 1 kB\n")
    none = (tmp_path / "no-cgroup",)
    assert server_slots.for_memory(m, none) == 6  # (23.5 GiB - 6) / 2.8
    (tmp_path / "memory.max").write_text("max\n")  # cgroup v2 without a limit
    assert server_slots.for_memory(m, (tmp_path / "memory.max",)) == 6
    (tmp_path / "limit_in_bytes").write_text(f"{16 * 2**30}\n")  # a 16 GiB container on that host
    assert server_slots.for_memory(m, (tmp_path / "memory.max", tmp_path / "limit_in_bytes")) == 3
    m.write_text("MemTotal:       8000000 kB\n")
    assert server_slots.for_memory(m, none) == 2
    assert server_slots.for_memory(tmp_path / "none", none) == 4


def test_only_vllm_servers_count():
    assert procs.is_vllm(["/x/.venv/bin/python", "-m", "scripts.kit.vllm_main", "--model", "m"])
    assert procs.is_vllm(["/usr/bin/vllm", "serve", "m"]) and procs.is_vllm(["vllm", "serve", "m"])
    assert not procs.is_vllm(["/x/.venv/bin/vllm-router", "--port", "1"])
