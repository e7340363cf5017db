"""tests/server_slots.py: the host-wide cap on tiny servers that tests run at once (make test-all's two workers)."""
from __future__ import annotations

import tempfile

from tests import server_slots as S


def test_a_slot_is_held_until_given_back_and_a_full_set_waits_then_gives_up(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv(S.ENV, "2")
    a, b = S.take("a"), S.take("b")
    assert a is not None and b is not None and S.slot_dir().parent == tmp_path
    assert S.take("c", wait_s=0.2) is None  # both locks held (by other open files, as another process would)
    err = capsys.readouterr().err
    assert "c waits for one of 2 server slots" in err and "still taken" in err and "c starts anyway" in err
    S.give(a)
    c = S.take("c", wait_s=0.2)
    assert c is not None
    S.give(b)
    S.give(c)


def test_the_count_follows_the_hosts_memory_unless_set(monkeypatch):
    monkeypatch.delenv(S.ENV, raising=False)
    n = S.slots()
    assert n >= 1
    monkeypatch.setenv(S.ENV, "7")
    assert S.slots() == 7


def test_only_vllm_servers_take_one():
    assert S.is_vllm(["/x/.venv/bin/python", "-m", "scripts.kit.vllm_main", "--model", "m"])
    assert S.is_vllm(["/usr/bin/vllm", "serve", "m"]) and S.is_vllm(["vllm", "serve", "m"])
    assert not S.is_vllm(["/x/python", "-m", "scripts.kit.router", "--port", "1"])
