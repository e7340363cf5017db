"""make start-pair: two variants' warm starts of one machine boot, paired round by round, read from committed records."""
import subprocess
import sys

import pytest

from scripts import startpair as P
from scripts.kit.errors import KitError
from scripts.kit.paths import ROOT

V4, MEGA = "qwen3.5-4b-fp8-v4", "qwen3.5-4b-fp8-v4-mega"


BOOT_1114Z = "a5bd5802-875d-42a4-b464-d42f33cfb1e8"


def test_the_h100_pair_of_session_1114z_pairs_its_three_rounds_in_order():
    res = P.pair(V4, MEGA, boot=BOOT_1114Z)  # named: a later session's starts of both would be the default
    assert res["boot"] == BOOT_1114Z and res["gpu"] == "NVIDIA H100 80GB HBM3"
    assert [r["a_minus_b_s"] for r in res["rounds"]] == [41.17, 45.56, 30.92]
    assert [r["a"].rsplit("/", 1)[1][:16] for r in res["rounds"]] == ["20261206T113153Z", "20261206T113318Z",
                                                                     "20261206T113528Z"]
    assert res["a_minus_b_mean_s"] == 39.22 and res["a_minus_b_ci95_s"] == (20.55, 57.88)
    by = {p["phase"]: p for p in res["phases"]}
    assert by["engine process imports"] == {"phase": "engine process imports", "a_median_s": 11.545,
                                            "b_median_s": 0.313}
    out = P.text(res)
    assert "95% t interval [20.55, 57.88] s over 3 rounds: B readier" in out
    assert "results/qwen3.5-4b-fp8-v4-mega/20261206T113425Z-startup.json" in out


def test_six_h200_rounds_give_the_interval_the_session_readme_computed_by_hand():
    """results/gpu-sessions/20261204T1529Z/README.md: -quick minus -mega, a t interval of 1.41 to 6.42 s."""
    res = P.pair("qwen3.5-4b-fp8-v3-loop-quick", "qwen3.5-4b-fp8-v3-loop-mega",
                 boot="edeef208-7ec0-4dde-8354-15933cd96ca9")
    assert len(res["rounds"]) == 6 and res["a_minus_b_ci95_s"] == (1.41, 6.42)
    flipped = P.pair("qwen3.5-4b-fp8-v3-loop-mega", "qwen3.5-4b-fp8-v3-loop-quick",
                     boot="edeef208-7ec0-4dde-8354-15933cd96ca9")
    assert flipped["a_minus_b_ci95_s"] == (-6.42, -1.41) and "A readier" in P.text(flipped)


def test_starts_of_different_machines_are_not_a_pair():
    with pytest.raises(KitError, match="no machine boot holds warm starts of both qwen3.5-4b-fp8-v4 and qwen3-4b-bf16"):
        P.pair(V4, "qwen3-4b-bf16")
    with pytest.raises(KitError, match="--boot nope: no warm starts of both .* boots with both: .*a5bd5802"):
        P.pair(V4, MEGA, boot="nope")


def test_without_a_boot_the_newest_boot_holding_both_is_paired(tmp_path):
    """Copies (here only, under tmp_path) of session 1114Z's starts, and of its first round as if a later machine
    had run it: the default pairs the later boot's one round; naming the old boot still gives its three."""
    import json
    for variant in (V4, MEGA):
        (tmp_path / variant).mkdir()
        starts = P.warm_starts(variant, ROOT / "results")
        for rel, r in starts:
            if r["provenance"]["host"]["boot_id"] == BOOT_1114Z:
                (tmp_path / variant / rel.rsplit("/", 1)[1]).write_text(json.dumps(r))
        rel, r = next((rel, r) for rel, r in starts if r["provenance"]["host"]["boot_id"] == BOOT_1114Z)
        later = json.loads(json.dumps(r))
        later["provenance"]["host"]["boot_id"] = "later-boot"
        later["provenance"]["utc"] = "2027-01-01T00:00:00Z"
        (tmp_path / variant / ("20270101T000000Z-startup.json")).write_text(json.dumps(later))
    res = P.pair(V4, MEGA, tmp_path)
    assert res["boot"] == "later-boot" and [x["a_minus_b_s"] for x in res["rounds"]] == [41.17]
    assert len(P.pair(V4, MEGA, tmp_path, boot=BOOT_1114Z)["rounds"]) == 3


def test_one_pair_has_no_interval():
    assert P.t_interval([3.0]) is None and P.t_interval([1.0, 3.0]) == (-10.71, 14.71)


def test_the_command_names_what_is_missing_and_exits_non_zero(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "scripts.startpair", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
    r = run("--a", "no-such-variant", "--b", MEGA)
    assert r.returncode != 0 and "unknown variant 'no-such-variant'" in r.stderr and not r.stdout
    r = run("--a", V4, "--b", MEGA, "--results-dir", str(tmp_path))
    assert r.returncode != 0 and f"{V4}: no traced warm start" in r.stderr and "make verify-cache" in r.stderr
    r = run("--a", V4, "--b", MEGA, "--json")
    assert r.returncode == 0 and '"a_minus_b_ci95_s"' in r.stdout
