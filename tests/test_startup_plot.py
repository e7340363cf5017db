"""docs/startup.png's bars: labels that wrap, and bytes that follow the records only."""
from scripts.kit.summaries import startup as S

KEYS = {"VLLM_WORKER_MULTIPROC_METHOD": "fork", "VLLM_ENABLE_STARTUP_PLAN": "1", "API_TEXT_ONLY": "1",
        "API_TOKENIZER_POOL_LATE": "1", "API_LEAN_IMPORTS": "1", "STARTUP_PLAN_KEY": "first", "API_TOKENIZER_CACHE": "1"}


def traced(cuts, ready=25.06, utc="2026-11-28T05:33:53Z"):
    return {"record": "results/x/y-startup.json", "utc": utc, "cuts": cuts, "gpu": "NVIDIA H100 80GB HBM3",
            "ready_s": ready, "first_token_s": ready + 0.4,
            "path": [{"phase": "API process start and imports", "s": 8.9}, {"phase": "weights", "s": ready - 8.9}]}


def test_bar_label_wraps_many_start_keys_and_keeps_every_key():
    label = S.bar_label("qwen3.5-4b-bf16-tuned-dvg-quick", traced(KEYS))
    lines = label.split("\n")
    assert lines[0] == "qwen3.5-4b-bf16-tuned-dvg-quick" and lines[-1] == "2026-11-28T05:33, NVIDIA H100 80GB HBM3"
    assert len(lines) > 3 and all(len(x) <= 60 for x in lines[1:-1])
    joined = " ".join(lines[1:-1])
    for k, v in KEYS.items():
        assert f"{k.removeprefix('VLLM_')}={v}" in joined


def test_bar_label_without_keys_says_so():
    assert S.bar_label("qwen3-4b-bf16", traced({})).split("\n") == ["qwen3-4b-bf16", "no cuts",
                                                                   "2026-11-28T05:33, NVIDIA H100 80GB HBM3"]


def test_rows_are_as_tall_as_their_labels_so_labels_do_not_overlap():
    short, tall = "a\nb\nc", "\n".join("x" * 9)
    ys = S.row_centres([short, tall, short])
    assert ys == sorted(ys) and ys[0] == 0.5  # a three-line label takes one bar's height
    # the nine-line label's row is 2.7 tall: its neighbours' centres sit half of each row's height away
    assert abs((ys[1] - ys[0]) - (0.5 + 1.35)) < 1e-9 and abs((ys[2] - ys[1]) - (1.35 + 0.5)) < 1e-9


def test_plot_is_deterministic_and_follows_the_numbers():
    docs = {"v": {"results": {"startup": {"traced": [traced({}), traced(KEYS)]}}}}
    a, b = S.plot_png(docs), S.plot_png(docs)
    assert a[:4] == b"\x89PNG" and a == b
    docs["v"]["results"]["startup"]["traced"][1] = traced(KEYS, ready=28.57)
    assert S.plot_png(docs) != a
    assert S.plot_png({"v": {"results": {}}}) is None


def _rec(utc, boot, ready=20.0, passed=True, expected="hit", trace=True, cuts=None):
    cfg = dict(cuts or {})
    return {"provenance": {"utc": utc, "device": {"name": "NVIDIA H100 80GB HBM3"}, "host": {"boot_id": boot} if boot else {}},
            "config": cfg,
            "payload": {"expected": expected, "passed": passed, "warm": {"ready_s": ready, "first_token_s": ready + 0.2},
                        "trace": {"path": [{"phase": "weights", "s": ready}]} if trace else None}}


def test_last_session_keeps_the_newest_boots_passing_traced_starts_in_order():
    recs = [("r/1", _rec("2026-12-01T10:00:00Z", "A")), ("r/2", _rec("2026-12-06T11:30:00Z", "B", 16.7)),
            ("r/3", _rec("2026-12-06T11:33:00Z", "B", passed=False)), ("r/4", _rec("2026-12-06T11:34:00Z", "B", 15.0)),
            ("r/5", _rec("2026-12-06T11:35:00Z", "B", expected="miss")), ("r/6", _rec("2026-12-07T09:00:00Z", None))]
    last = S._last_session(recs)
    assert [t["record"] for t in last] == ["r/2", "r/4"] and {t["boot"] for t in last} == {"B"}
    assert [t["ready_s"] for t in last] == [16.7, 15.0]


def test_the_session_plot_takes_the_newest_boot_that_started_two_sets_only():
    def start(utc, boot, cuts=None):
        return {**traced(cuts or {}, utc=utc), "boot": boot}
    docs = {"v4": {"results": {"startup": {"last_session": [start("2026-12-06T11:31:53Z", "B"),
                                                            start("2026-12-06T11:35:28Z", "B")]}}},
            "mega": {"results": {"startup": {"last_session": [start("2026-12-06T11:30:27Z", "B", KEYS),
                                                              start("2026-12-06T11:34:25Z", "B", KEYS)]}}},
            # a newer boot that started one variant with one set of keys: no before/after in it
            "other": {"results": {"startup": {"last_session": [start("2026-12-08T01:00:00Z", "C"),
                                                               start("2026-12-08T01:01:00Z", "C")]}}},
            "old": {"results": {"startup": {"last_session": [start("2026-11-01T00:00:00Z", "A"),
                                                             start("2026-11-01T00:01:00Z", "A", KEYS)]}}}}
    rows = S.session_rows(docs)
    assert [(n, t["utc"][11:19]) for n, t in rows] == [("mega", "11:30:27"), ("v4", "11:31:53"), ("mega", "11:34:25"),
                                                       ("v4", "11:35:28")]
    png = S.session_png(docs)
    assert png[:4] == b"\x89PNG" and png == S.session_png(docs)
    del docs["v4"], docs["mega"]
    assert [n for n, _ in S.session_rows(docs)] == ["old", "old"]  # the newest boot with two sets left
    del docs["old"]
    assert S.session_rows(docs) == [] and S.session_png(docs) is None
