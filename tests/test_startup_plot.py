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
