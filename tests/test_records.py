"""Records: schema validation with JSON paths, atomic append-only writes, provenance."""
import json

import pytest

from scripts.kit.errors import KitError
from scripts.kit.record import load_record, make_record, records, write_record
from scripts.kit.schema import validate_record
from scripts.kit.variant import load

PAYLOAD = {"ready_s": 1.5, "argv": ["python", "-m", "x"], "endpoints": {"GET /health": {"status": 200, "latency_ms": 1.0}}}


def test_record_roundtrip_and_provenance(tree):
    tree("a", "MODEL=org/m\n")
    rec = make_record("serve_smoke", load("a"), PAYLOAD, command=["python", "-m", "scripts.serve"])
    path = write_record(rec, root=tree.res)
    assert path.parent.name == "a" and path.name.endswith("-serve_smoke.json")
    back = load_record(path)
    prov = back["provenance"]
    assert prov["device"]["kind"] in ("cpu", "gpu") and prov["weights"] == "real" and prov["acceptance"] == "none"
    assert prov["versions"]["python"] and back["config_sha256"] == load("a").config_sha256
    assert prov["host"]["cpu_model"] and prov["host"]["python_loop_ms"] > 0  # to tell a slow host from a fast one
    assert [p for p, _ in records("a", "serve_smoke", root=tree.res)] == [path]


def test_the_python_loop_figure_measures_the_loop():
    from scripts.kit.device import python_loop_ms
    # 400 times the work must take longer than 1x: a figure that did not move with the loop would tell hosts nothing
    assert python_loop_ms(n=400_000, runs=1) > python_loop_ms(n=1_000, runs=1) > 0


def test_writes_never_overwrite(tree):
    tree("a", "MODEL=org/m\n")
    rec = make_record("serve_smoke", load("a"), PAYLOAD)
    p1, p2 = write_record(rec, root=tree.res), write_record(rec, root=tree.res)
    assert p1 != p2 and p1.exists() and p2.exists()
    assert not list(tree.res.rglob("*.tmp"))
    # Both are found by kind, the second's "-2" name included (make tune --jobs once lost one that way).
    assert {p for p, _ in records("a", "serve_smoke", root=tree.res)} == {p1, p2}


@pytest.mark.parametrize("mutate,where", [
    (lambda r: r.pop("provenance"), "$: 'provenance' is a required property"),
    (lambda r: r["provenance"].update(weights="fake"), "$.provenance.weights"),
    (lambda r: r.update(kind="nosuchkind"), "no schema for kind 'nosuchkind'"),
    (lambda r: r["payload"].pop("ready_s"), "$.payload: 'ready_s' is a required property"),
    (lambda r: r["payload"]["endpoints"]["GET /health"].update(status="ok"), "$.payload.endpoints"),
])
def test_bad_records_fail_with_json_path(tree, mutate, where):
    tree("a", "MODEL=org/m\n")
    rec = make_record("serve_smoke", load("a"), json.loads(json.dumps(PAYLOAD)))
    mutate(rec)
    with pytest.raises(KitError) as e:
        validate_record(rec, "r.json")
    assert where in str(e.value) and str(e.value).startswith("r.json: ")


def test_invalid_record_is_not_written(tree):
    tree("a", "MODEL=org/m\n")
    rec = make_record("serve_smoke", load("a"), {"nope": 1})
    with pytest.raises(KitError):
        write_record(rec, root=tree.res)
    assert not list(tree.res.rglob("*"))


def test_load_record_rejects_non_json(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("{not json")
    with pytest.raises(KitError, match="not JSON"):
        load_record(p)


def test_git_state_prefers_the_commit_the_caller_names(monkeypatch):
    """A tree copied to another machine may carry an older .git (the GPU machine's did): the commit
    passed in KIT_GIT_COMMIT wins, always marked dirty; without it, this checkout's own HEAD."""
    import subprocess
    from scripts.kit.paths import ROOT
    from scripts.kit.record import git_state
    full = "8cb46de61a5cf230808ba66f554b2bb2ea895d4f"
    monkeypatch.setenv("KIT_GIT_COMMIT", full)
    assert git_state() == (full, True)
    monkeypatch.setenv("KIT_GIT_COMMIT", "8cb46de")  # short, or made up: refused before a run
    with pytest.raises(KitError, match="full commit sha"):
        git_state()
    monkeypatch.delenv("KIT_GIT_COMMIT")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert git_state()[0] == head


# -- provenance from facts (issue #18 item 3) ------------------------------------------------
from scripts.kit.paths import GOLDEN  # noqa: E402
from scripts.kit.record import facts_from_argv, facts_from_records, log_ref  # noqa: E402

GOLDENS = sorted((GOLDEN / "argv").glob("*.txt"))


def read_golden(path) -> tuple[list[str], dict]:
    """(argv, env) of a tests/golden/argv file: `[env]` KEY=VALUE lines, then `[argv]` one arg a line."""
    argv, env, part = [], {}, None
    for line in path.read_text().splitlines():
        if line.startswith("#") or not line:
            continue
        if line in ("[env]", "[argv]"):
            part = line
        elif part == "[env]":
            k, _, val = line.partition("=")
            env[k] = val
        else:
            argv.append(line)
    return argv, env


def pair(argv: list[str], flag: str) -> str | None:
    return next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag), None)


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: p.stem)
def test_facts_from_golden_argv(path):
    """Every golden: dummy iff it passes --load-format dummy, acceptance from its --speculative-config,
    and both agree with the variant it pins (the goldens are the configs' real server commands)."""
    argv, env = read_golden(path)
    facts = facts_from_argv(argv, env)
    assert facts["weights"] == ("dummy" if pair(argv, "--load-format") == "dummy" else "real")
    sc = pair(argv, "--speculative-config")
    assert facts["acceptance"] == ("none" if sc is None else
                                   "synthetic" if json.loads(sc).get("rejection_sample_method") == "synthetic" else "real")
    v = load(path.name.rsplit(".", 2)[0])  # <variant>.<platform>.txt
    assert (facts["weights"], facts["acceptance"]) == (v["WEIGHTS"], v.acceptance)
    assert facts["shimmed_name"] is None


def test_goldens_cover_speculation_and_plain():
    """The golden parametrization above is not vacuous: both kinds of server command are pinned."""
    seen = {facts_from_argv(*read_golden(p))["acceptance"] for p in GOLDENS}
    assert {"none", "real"} <= seen


def test_facts_follow_the_argv_not_the_config():
    """What the server was given decides: the dummy and synthetic spellings vLLM accepts, the shim name."""
    argv, env = read_golden(GOLDEN / "argv" / "qwen3.5-4b-awq-seq8-mtp4.gpu.txt")
    assert facts_from_argv(argv, env) == {"weights": "real", "acceptance": "real", "shimmed_name": None}
    assert facts_from_argv(argv + ["--load-format", "dummy"], env)["weights"] == "dummy"
    assert facts_from_argv(argv + ["--load-format=dummy"], env)["weights"] == "dummy"
    assert facts_from_argv(argv + ["--load-format", "safetensors"], env)["weights"] == "real"
    i = argv.index("--speculative-config") + 1
    synth = argv[:i] + [json.dumps({**json.loads(argv[i]), "rejection_sample_method": "synthetic",
                                    "synthetic_acceptance_rates": [0.9]})] + argv[i + 1:]
    assert facts_from_argv(synth, env)["acceptance"] == "synthetic"
    assert facts_from_argv(argv, {**env, "KIT_DEVICE_NAME": "NVIDIA H100 PCIe"})["shimmed_name"] == "NVIDIA H100 PCIe"
    # The kit's own command for the run conditions says so too (Variant.to_argv is the only writer).
    v = load("qwen3.5-4b-awq-seq8-mtp4", ["WEIGHTS=dummy", "SPEC_ACCEPTANCE=0.98,0.82,0.70,0.54"])
    facts = facts_from_argv(v.to_argv("gpu"), v.to_env("gpu"))
    assert (facts["weights"], facts["acceptance"]) == ("dummy", "synthetic")


GPU = {"kind": "gpu", "name": "NVIDIA H100 80GB HBM3", "count": 1, "driver": "580", "compute_capability": "9.0",
       "memory_mib": 81559, "shimmed_name": None}


def test_record_facts_come_from_the_server_that_ran(tree, monkeypatch):
    """A config that says real/none, a server that ran dummy + synthetic with a shim name: the record
    says what ran (the 2026-11 records said what the config asked for)."""
    import scripts.kit.record as R
    monkeypatch.setattr(R, "device_provenance", lambda: dict(GPU))
    monkeypatch.delenv("KIT_DEVICE_NAME", raising=False)
    tree("a", "MODEL=org/m\n")
    argv = ["python", "-m", "vllm", "--load-format", "dummy",
            "--speculative-config", '{"method":"mtp","rejection_sample_method":"synthetic"}']
    prov = make_record("serve_smoke", load("a"), PAYLOAD, server_argv=argv,
                       server_env={"KIT_DEVICE_NAME": "NVIDIA H100 PCIe"})["provenance"]
    assert (prov["weights"], prov["acceptance"], prov["device"]["shimmed_name"]) == \
        ("dummy", "synthetic", "NVIDIA H100 PCIe")
    plain = make_record("serve_smoke", load("a"), PAYLOAD, server_argv=["python", "-m", "vllm"])["provenance"]
    assert (plain["weights"], plain["acceptance"], plain["device"]["shimmed_name"]) == ("real", "none", None)


def candidate(tree, weights: str, acceptance: str = "none") -> dict:
    argv = ["python", "-m", "vllm"] + (["--load-format", "dummy"] if weights == "dummy" else []) + \
        ({"none": [], "real": ["--speculative-config", '{"method":"mtp"}'],
          "synthetic": ["--speculative-config", '{"method":"mtp","rejection_sample_method":"synthetic"}']}[acceptance])
    return make_record("tune", load("a"), {"scope": "candidate"}, server_argv=argv)


def test_tune_session_merges_its_candidates(tree):
    """A session record starts no server: all candidates alike -> their value; differing -> mixed."""
    tree("a", "MODEL=org/m\n")
    both = [candidate(tree, "dummy", "none"), candidate(tree, "real", "synthetic")]
    prov = make_record("tune", load("a"), {"scope": "session"}, sources=both)["provenance"]
    assert (prov["weights"], prov["acceptance"]) == ("mixed", "mixed")
    same = [candidate(tree, "dummy", "synthetic"), candidate(tree, "dummy", "synthetic")]
    prov = make_record("tune", load("a"), {"scope": "session"}, sources=same)["provenance"]
    assert (prov["weights"], prov["acceptance"]) == ("dummy", "synthetic")


def test_session_written_elsewhere_takes_its_points_device():
    """sweep --resume on a CPU host over points that ran on the H100: the record's device and
    versions are the points' (2026-11-23 one said CPU / vLLM 0.32); on the same host, its own."""
    cpu = {"kind": "cpu", "name": "AMD EPYC", "count": 2}
    pts = [{"provenance": {"weights": "dummy", "acceptance": a, "device": dict(GPU), "versions": {"vllm": "0.26.0"}}}
           for a in ("none", "synthetic")]
    cpu_pt = {"provenance": {"weights": "dummy", "acceptance": "none", "device": cpu, "versions": {"vllm": "0.32.0"}}}
    got = facts_from_records(pts + [cpu_pt], cpu)
    assert got["device"]["name"] == GPU["name"] and got["versions"] == {"vllm": "0.26.0"}
    assert got["acceptance"] == "mixed" and got["weights"] == "dummy"
    assert "device" not in facts_from_records(pts, dict(GPU))


def test_quantize_from_a_random_source_is_dummy(tree):
    """No server ran: the payload's own fact decides (random_source -> the weights were random)."""
    tree("a", "MODEL=org/m\n")
    assert make_record("quantize", load("a"), {"random_source": True})["provenance"]["weights"] == "dummy"
    assert make_record("quantize", load("a"), {"random_source": False})["provenance"]["weights"] == "real"


def test_log_ref_keeps_only_existing_files(tmp_path):
    from scripts.kit.paths import ROOT
    assert log_ref(tmp_path / "missing.log") is None and log_ref(None) is None
    assert log_ref(ROOT / "pyproject.toml") == "pyproject.toml"


@pytest.mark.slow  # ~40 s: make report over a copy of the tree: `make test` stays under its 10 minutes
def test_a_record_written_refreshes_what_derives_from_it(kit_copy, tmp_path):
    """Issue #20: after `make eval-quality`, `make check-schemas` failed ("derived files are stale")
    until `make report`. On a copy of the tree: a new record makes report --check fail, the refresh
    makes it pass; a record written outside results/<variant>/ (tests, tune candidates, sweep points)
    refreshes nothing."""
    import sys
    kit = kit_copy.root

    def run(code: str):
        return kit_copy([sys.executable, "-c", code])
    # A smoke record of tiny, with the payload of the latest one in the tree (summaries read it all).
    write = ("from scripts.kit.record import make_record, records, write_record; "
             "from scripts.kit.variant import load; p = records(kind='serve_smoke')[-1][1]['payload']; "
             "print(write_record(make_record('serve_smoke', load('tiny'), p)))")
    r = run(write)
    assert r.returncode == 0, r.stderr[-2000:]
    path = r.stdout.strip().splitlines()[-1]
    check = [sys.executable, "-m", "scripts.report", "--check"]
    stale = kit_copy(check)
    assert stale.returncode != 0 and "experiments/tiny/measurements.json" in stale.stderr
    deeper = str(kit / "results" / "sweeps" / "tiny" / "x.json")
    r = run(f"from scripts.report import refresh_after_write; print(refresh_after_write({path!r}), "
            f"refresh_after_write({str(tmp_path / 'elsewhere' / 'tiny' / 'x.json')!r}), refresh_after_write({deeper!r}))")
    assert r.returncode == 0 and r.stdout.split() == ["True", "False", "False"], r.stderr[-2000:]
    fresh = kit_copy(check)
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    assert path.rsplit("/", 1)[-1] in (kit / "experiments/tiny/measurements.json").read_text()


def test_every_command_that_writes_a_record_refreshes_the_derived_files():
    """One rule (issue #33): a command that writes a record under results/ leaves measurements.json, the
    README blocks and docs/results.md current, as eval-quality does: it calls report.refresh_after_write
    (tune runs the report itself). A new entry point that writes records fails here until it does."""
    from scripts.kit.paths import ROOT
    # scripts/kit too (record.py defines it): lm-head-check's record once left a measurements.json stale in CI.
    writers = [f for f in sorted((ROOT / "scripts").rglob("*.py"))
               if "write_record(" in f.read_text() and f != ROOT / "scripts" / "kit" / "record.py"]
    assert {f.stem for f in writers} >= {"probe", "compare", "evaluate", "bake", "serve", "sweep", "profile",
                                         "lm_head_check"}
    missing = [f.name for f in writers
               if "refresh_after_write(" not in f.read_text() and "report_main([])" not in f.read_text()]
    assert missing == []


def test_record_text_is_the_same_json_with_scalar_lists_on_one_line(tmp_path):
    """New records keep json.dumps(indent=2, sort_keys=True)'s layout except that a list of scalars is one
    line: the same JSON, and a committed fleet comparison (one sample a line) comes out under half its size."""
    import json as _json
    from scripts.kit.paths import ROOT
    from scripts.kit.record import record_text
    x = {"b": [1, 2.5, None, 'a"b', True], "a": {"z": [], "y": {}, "x": [{"k": [1]}, [1, 2]]}, "c": "é"}
    text = record_text(x)
    assert _json.loads(text) == x
    assert '  "b": [1, 2.5, null, "a\\"b", true],' in text.splitlines()
    assert [l.strip()[:4] for l in text.splitlines() if l.strip().startswith('"')] == ['"a":', '"x":', '"k":', '"y":', '"z":', '"b":', '"c":']
    assert text == _json.dumps(x, indent=2, sort_keys=True).replace(
        '[\n          1\n        ]', '[1]').replace('[\n        1,\n        2\n      ]', '[1, 2]').replace(
        '[\n    1,\n    2.5,\n    null,\n    "a\\"b",\n    true\n  ]', '[1, 2.5, null, "a\\"b", true]')
    old = (ROOT / "results/qwen3-4b-bf16/20261127T114850Z-comparison.json").read_text()
    new = record_text(_json.loads(old)) + "\n"
    assert _json.loads(new) == _json.loads(old) and len(new) < 0.5 * len(old)


def test_a_record_seen_valid_is_not_validated_again_and_an_edit_or_a_schema_change_is(tmp_path, monkeypatch):
    """validate_record keeps a marker for a pass (KIT_SCHEMA_CACHE): the same record under the same schemas skips
    jsonschema; an edited record, a failing one, or another schema set is validated in full."""
    import json as _json
    from scripts.kit import schema as S
    from scripts.kit.errors import KitError
    from scripts.kit.paths import ROOT
    monkeypatch.setenv("KIT_SCHEMA_CACHE", str(tmp_path / "valid"))
    rec = _json.loads((ROOT / "results/qwen3.5-4b-bf16-tuned-dvg-quick/20261127T082425Z-startup.json").read_text())
    S.validate_record(rec)
    assert len(list((tmp_path / "valid").rglob("*"))) == 2  # one folder, one marker
    calls = []
    real = S._validate_record
    monkeypatch.setattr(S, "_validate_record", lambda r, w: (calls.append(w), real(r, w)))
    S.validate_record(rec, "again")
    assert calls == []
    bad = _json.loads(_json.dumps(rec))
    bad["payload"]["new_artifacts"] = "many"
    with pytest.raises(KitError, match=r"bad: \$\.payload\.new_artifacts"):
        S.validate_record(bad, "bad")
    with pytest.raises(KitError):  # a failure leaves no marker: it fails again, with its message
        S.validate_record(bad, "bad")
    assert calls == ["bad", "bad"]
    monkeypatch.setattr(S, "_schemas_digest", lambda: "other schemas")
    S.validate_record(rec, "new schemas")
    assert calls[-1] == "new schemas"
    monkeypatch.setenv("KIT_SCHEMA_CACHE", "off")
    S.validate_record(rec, "off")
    S.validate_record(rec, "off")
    assert calls[-2:] == ["off", "off"]


def test_a_record_that_is_not_json_is_refused_by_validation_not_by_the_marker(tmp_path, monkeypatch):
    from scripts.kit import schema as S
    from scripts.kit.errors import KitError
    monkeypatch.setenv("KIT_SCHEMA_CACHE", str(tmp_path / "valid"))
    with pytest.raises(KitError, match="where"):
        S.validate_record({"kind": "bake", "payload": {1, 2}}, "where")
    assert not (tmp_path / "valid").exists()
