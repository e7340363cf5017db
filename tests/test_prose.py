"""scripts/kit/prose.py: cited paths exist, cited figures agree with the record they cite (issue 18 item 7)."""
import json
import shutil

import pytest

from scripts.kit import prose
from scripts.kit.paths import ROOT


def tree(tmp_path, readme: str, files: dict | None = None, name: str = "README.md"):
    for rel, data in (files or {}).items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(data if isinstance(data, str) else json.dumps(data))
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(readme)
    return tmp_path


DATA = {"results/v/20261125T000000Z-comparison.json": {"payload": {"levels": [{"tpot_ms": {"p50": 2.418}}],
                                                                     "ratio": 1.7349, "pct": 66.91, "tok": 970.5,
                                                                     "name": "x", "a/b": 3.0}}}
CITE = "results/v/20261125T000000Z-comparison.json"


# -- cited paths ------------------------------------------------------------------------------

def test_missing_cited_path_fails(tmp_path):
    root = tree(tmp_path, "intro\n\nsee `results/v/x.json` and `scripts/gone.py:12`\n", {"results/v/y.json": "{}"})
    assert prose.problems(root) == ["README.md:3: cites results/v/x.json, which does not exist",
                                    "README.md:3: cites scripts/gone.py, which does not exist"]


def test_existing_paths_pass_and_non_paths_are_ignored(tmp_path):
    readme = ("`results/v/y.json#top`, `scripts/a.py:3-9`, `eval/` and `.ci/run.sh`;\n"
              "`bash .ci/run.sh --out results/v/` (a command: each token counts);\n"
              "placeholders `results/<variant>/<UTC>-<kind>.json`, `.../20261125T0808Z/README.md`,\n"
              "`results/.../x.json`, other roots `weights/Qwen--Qwen3-4B/bf16/`, `../shared/gpu/README.md`.\n")
    root = tree(tmp_path, readme, {"results/v/y.json": "{}", "scripts/a.py": "", "eval/g.yaml": "",
                                   ".ci/run.sh": ""})
    assert prose.problems(root) == []
    cited = [p for _, p in prose.cited_paths(readme)]
    assert cited == [".ci/run.sh", "eval", "results/v/y.json", "scripts/a.py", ".ci/run.sh", "results/v"]


def test_a_moved_file_is_found_at_its_new_place_from_a_session_readme_only(tmp_path):
    """Session READMEs under results/ are append-only: they keep the path a file had when they were written."""
    text = "`scripts/_draft_graph_patch.py` and `scripts/_gone.py`\n"
    root = tree(tmp_path, text, {"scripts/patches/draft_graph.py": "", "README.md": text},
                name="results/gpu-sessions/20261126T0546Z/README.md")
    assert prose.problems(root) == [
        "README.md:1: cites scripts/_draft_graph_patch.py, which does not exist",
        "README.md:1: cites scripts/_gone.py, which does not exist",
        "results/gpu-sessions/20261126T0546Z/README.md:1: cites scripts/_gone.py, which does not exist"]
    (root / "scripts/patches/draft_graph.py").unlink()
    assert "results/gpu-sessions/20261126T0546Z/README.md:1: cites scripts/_draft_graph_patch.py, which does not " \
           "exist" in prose.problems(root)


def test_markdown_link_targets_are_checked(tmp_path):
    root = tree(tmp_path, "[the log](results/v/log.txt#L3) and [docs](docs/missing.md)\n",
                {"results/v/log.txt": ""})
    assert prose.problems(root) == ["README.md:1: cites docs/missing.md, which does not exist"]


def test_glob_citations_need_one_match(tmp_path):
    root = tree(tmp_path, "`results/v/*-serve_smoke.json`\n\n`results/v/*-bake.json`\n",
                {"results/v/20261125T000000Z-serve_smoke.json": "{}"})
    assert prose.problems(root) == ["README.md:3: cites results/v/*-bake.json, which matches no file"]


def test_fenced_code_and_generated_lines_keep_line_numbers(tmp_path):
    readme = "```\n`results/nope.json` in a fence\n```\n\n`results/also-nope.json`\n"
    root = tree(tmp_path, readme)
    assert prose.problems(root) == ["README.md:5: cites results/also-nope.json, which does not exist"]


def test_experiment_and_docs_readmes_are_checked(tmp_path):
    tree(tmp_path, "# kit\n")
    tree(tmp_path, "`results/x.json`\n", name="experiments/v/README.md")
    tree(tmp_path, "\n`tests/none.py`\n", name="docs/deep/a.md")
    assert prose.problems(tmp_path) == ["experiments/v/README.md:1: cites results/x.json, which does not exist",
                                        "docs/deep/a.md:2: cites tests/none.py, which does not exist"]


# -- cited figures ----------------------------------------------------------------------------

def test_figure_that_agrees_passes(tmp_path):
    readme = (f"TPOT 2.418<!-- {CITE}#/payload/levels/0/tpot_ms/p50 --> ms, rounded 2.42<!-- {CITE}#/payload/levels/0/tpot_ms/p50 -->,\n"
              f"1.73<!-- {CITE}#/payload/ratio -->x, 67<!-- {CITE}#/payload/pct -->%, 970<!-- {CITE}#/payload/tok --> and "
              f"971<!-- {CITE}#/payload/tok --> (a tie rounds either way), 3<!--{CITE}#/payload/a~1b-->\n")
    root = tree(tmp_path, readme, DATA)
    assert prose.problems(root) == []
    oks = [line for ok, line in prose.check(root) if ok]
    assert f"README.md:1: 2.42 cites {CITE}#/payload/levels/0/tpot_ms/p50 = 2.418 → 2.42 ok" in oks


def test_figure_disagreeing_with_its_record_fails(tmp_path):
    root = tree(tmp_path, f"intro\nTPOT 2.41<!-- {CITE}#/payload/levels/0/tpot_ms/p50 --> ms, 1.7<!-- {CITE}#/payload/ratio -->x\n"
                          f"and 66<!-- {CITE}#/payload/pct -->%\n", DATA)
    assert prose.problems(root) == [
        f"README.md:2: says 2.41, record says 2.418 ({CITE}#/payload/levels/0/tpot_ms/p50)",
        f"README.md:3: says 66, record says 66.91 ({CITE}#/payload/pct)"]


def test_bad_pointer_fails(tmp_path):
    root = tree(tmp_path, f"2.418<!-- {CITE}#/payload/levels/3/tpot_ms/p50 -->\n"
                          f"2.418<!-- {CITE}#/payload/nope -->\n2.418<!-- {CITE}#payload -->\n", DATA)
    got = prose.problems(root)
    assert len(got) == 3
    assert got[0].startswith(f"README.md:1: 2.418 cites {CITE}#/payload/levels/3/tpot_ms/p50: no such value (no index '3'")
    assert got[1].startswith(f"README.md:2: 2.418 cites {CITE}#/payload/nope: no such value (no key 'nope'")
    assert "does not start with '/'" in got[2]


def test_unknown_file_not_a_number_and_orphan_marker_fail(tmp_path):
    root = tree(tmp_path, "2.4<!-- results/v/gone.json#/a -->\n"
                          f"2.4<!-- {CITE}#/payload/name -->\n"
                          f"TPOT<!-- {CITE}#/payload/ratio -->\n", DATA)
    got = prose.problems(root)
    assert got[0] == "README.md:1: 2.4 cites results/v/gone.json, which does not exist"
    assert got[1].startswith(f"README.md:2: 2.4 cites {CITE}#/payload/name, which is \"x\", not a number")
    assert got[2].startswith(f"README.md:3: a citation of {CITE}#/payload/ratio follows no number")


def test_range_dash_is_not_a_sign(tmp_path):
    data = {CITE: {"payload": {"lo": 525.78, "hi": 901.62, "neg": -0.5}}}
    root = tree(tmp_path, f"526<!-- {CITE}#/payload/lo -->-902<!-- {CITE}#/payload/hi --> tok/s, "
                          f"-0.5<!-- {CITE}#/payload/neg --> and (-0.5<!-- {CITE}#/payload/neg -->)\n", data)
    assert prose.problems(root) == []
    assert [f for _, f, _, _ in prose.cited_figures((root / "README.md").read_text())] == ["526", "902", "-0.5", "-0.5"]


def test_marker_syntax_inside_inline_code_is_not_a_citation(tmp_path):
    root = tree(tmp_path, "write `2.418<!-- results/v/x.json#/payload/a -->` to cite\n")
    assert prose.problems(root) == []


def test_run_records_load_through_load_record(tmp_path):
    """A run record (schema_version + kind) is read with record.load_record: validated, corrected."""
    src = "results/qwen3.5-4b-bf16-tuned/20261125T082532Z-latency.json"
    (tmp_path / src).parent.mkdir(parents=True)
    shutil.copy(ROOT / src, tmp_path / src)
    root = tree(tmp_path, f"2.418<!-- {src}#/payload/levels/0/tpot_ms/p50 --> and 2.5<!-- {src}#/payload/levels/0/tpot_ms/p50 -->\n")
    assert prose.problems(root) == [f"README.md:1: says 2.5, record says 2.418 ({src}#/payload/levels/0/tpot_ms/p50)"]
    bad = tmp_path / "results/v/20261125T000000Z-latency.json"
    bad.parent.mkdir(parents=True, exist_ok=True)
    bad.write_text(json.dumps({"schema_version": 1, "kind": "latency", "payload": {"x": 1}}))
    (tmp_path / "README.md").write_text("1<!-- results/v/20261125T000000Z-latency.json#/payload/x -->\n")
    got = prose.problems(root)
    assert len(got) == 1 and "which does not load" in got[0]


@pytest.mark.parametrize("said,value,ok", [("2.42", 2.418, True), ("2.4", 2.418, True), ("2", 2.418, True),
                                           ("2.5", 2.418, False), ("12.80", 12.7993, True), ("-0.5", -0.5, True),
                                           ("0.89", 0.8867, True), ("0.88", 0.8867, False)])
def test_rounding(said, value, ok):
    assert prose._agrees(said, value)[0] is ok


def test_the_tree_prose_is_clean():
    """README.md, experiments/*/README.md and docs/: every cited path exists, every cited figure agrees."""
    assert prose.problems(ROOT) == []


def test_unmarked_figures_with_units_are_found(tmp_path):
    """Issue 30 item 5: an edited figure with no marker passed. Rule 3: README.md and docs/ figures with a
    unit carry a marker, unless the line says it is a floor, a seed's figure or an input (SLO, KV budget)."""
    text = ("TPOT was 2.418 ms at c=1 and 1.73x faster, 970 tok/s, 12.5 req/s, 3.92 GiB loaded.\n"
            f"Marked: 2.418<!-- {CITE}#/payload/levels/0/tpot_ms/p50 --> ms and 1.73<!-- {CITE}#/payload/ratio -->x.\n"
            "The roofline floor is 2.82 ms. At 6 GiB of KV a side. The SLO: TTFT p99 500 ms. An input of 4 GiB.\n"
            "A 248320 x 2560 head, 128 x 512 tokens; `4.1 ms` in code; 2026-11-25; v0.26; 1,024 requests.\n"
            "<!-- results-x:begin -->\n| 5.24x [5.01, 5.46] | 9.9 ms |\n<!-- results-x:end -->\n")
    root = tree(tmp_path, text, DATA)
    tree(root, "A doc: 7.5 ms.\n", name="docs/d.md")
    tree(root, "Findings: 8.5 ms.\n", name="results/findings/README.md")
    got = prose.unmarked(root)
    assert [g.split(" carries")[0] for g in got] == [
        "README.md:1: 2.418 ms", "README.md:1: 1.73x", "README.md:1: 970 tok/s", "README.md:1: 12.5 req/s",
        "README.md:1: 3.92 GiB", "docs/d.md:1: 7.5 ms", "results/findings/README.md:1: 8.5 ms"]
    assert got[0].endswith("or say on the line that it is a floor, a seed's figure or an input)")
    assert set(got) <= set(prose.problems(root))
    # KV on a line makes its GiB figures a setting, not its other figures.
    tree(root, "At 20 GiB of KV the TPOT was 4.19 ms.\n", name="docs/d.md")
    assert [g.split(" carries")[0] for g in prose.unmarked(root, ["docs/*.md"])] == ["docs/d.md:1: 4.19 ms"]
