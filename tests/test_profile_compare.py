"""`make profile-compare A=RECORD B=RECORD` (scripts/profile.py --compare) on committed profile records: every
figure printed is the records' own, B - A is their difference, the config keys that differ are named (a key added
to the schema after a record ran counts as its default), two records from different GPU leases get the caveat,
and bad input gets one clear line and a non-zero exit."""
from __future__ import annotations

import json
import re
import subprocess
import sys

from scripts.kit.paths import ROOT

REC = "results/qwen3.5-4b-fp8-v2/{}-profile.json"
A, B = REC.format("20261128T171722Z"), REC.format("20261128T210452Z")  # GDN_METADATA_REUSE off, then on


def run(*args):
    return subprocess.run([sys.executable, "-m", "scripts.profile", "--compare", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_compare_prints_the_records_figures_and_their_differences():
    r = run(A, B)
    assert r.returncode == 0, r.stderr
    rows = {m.group(1).strip(): (m.group(2), m.group(3), m.group(4)) for m in
            re.finditer(r"^(.{34}) +(\S+) +(\S+) +(\S+)$", r.stdout, re.M)}
    ra, rb = (json.loads((ROOT / p).read_text())["payload"] for p in (A, B))
    for ph_a, ph_b in zip(ra["phases"], rb["phases"]):
        got = rows[ph_a["phase"]]
        assert float(got[0]) == ph_a["ms_per_step"] and float(got[1]) == ph_b["ms_per_step"]
        assert abs(float(got[2]) - (ph_b["ms_per_step"] - ph_a["ms_per_step"])) < 1e-4
    copy_a = next(k for k in ra["phases"][0]["kinds"] if k["kind"] == "copy")["ms_per_step"]
    assert float(rows["target forward: copy"][0]) == copy_a
    assert float(rows["step (all)"][1]) == rb["step_ms"]
    assert "config: GDN_METADATA_REUSE 'off' -> 'on'" in r.stdout  # and nothing else: keys added since are defaults
    assert "caveat:" in r.stdout and "not in one boot of one machine" in r.stdout  # two leases of the H200
    # the host's gaps by the phase they ran in and by frame, each side's own figure
    for key, label in (("gaps_by_host", "host"), ("gaps_by_frame", "frame")):
        for g in ra[key]:
            k = g[label] if label == "host" else re.sub(r"^(?:.*/)?([^/(]+)\.py\(\d+\): (.*)$", r"\1.\2", g[label])
            got = rows[f"  gaps, {label}: {k}"[:34].strip()]
            assert float(got[0]) == g["ms_per_step"], (k, got)
    assert float(rows["gaps, host: bookkeeping"][1]) == next(g["ms_per_step"] for g in rb["gaps_by_host"]
                                                              if g["host"] == "bookkeeping")


def test_one_record_against_itself_differs_nowhere_and_has_no_caveat():
    r = run(A, A)
    assert r.returncode == 0, r.stderr
    assert "config: the same" in r.stdout and "caveat" not in r.stdout
    assert set(re.findall(r"([+-]\d+\.\d{4})$", r.stdout, re.M)) <= {"+0.0000", "-0.0000"}


def test_bad_input_names_the_file():
    r = run(A, "results/no-such-profile.json")
    assert r.returncode != 0 and "--compare results/no-such-profile.json: no such file" in r.stderr
    other = "results/qwen3.5-4b-fp8-v2/20261129T150731Z-comparison.json"
    r = run(A, other)
    assert r.returncode != 0 and f"--compare {other}: a comparison record, not a profile record" in r.stderr


def test_kernels_lists_what_moved_most_by_name_from_the_two_kept_traces():
    """--kernels N on session 20261130T0158Z's pair (FP8_GEMM=pick against the variant as committed, one H200 lease):
    both kept traces are reduced again with every kernel name, and the N largest moves a step are listed, largest
    first: the Marlin GEMMs that came in and the CUTLASS ones that went, each side's figure the trace's own."""
    gdn = "results/qwen3.5-4b-fp8-v2-gdn/{}-profile.json"
    a, b = gdn.format("20261130T020701Z"), gdn.format("20261130T021533Z")
    r = run(a, b, "--kernels", "5")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("kernels that moved most", 1)[1].splitlines()[1:]
    assert len(lines) == 5
    rows = [re.match(r"^  (.{15}) (.{17}) +(\S+) +(\S+) +(\S+)  (.+)$", line).groups() for line in lines]
    deltas = [float(x[4]) for x in rows]
    assert deltas == sorted(deltas, key=lambda d: -abs(d))
    for phase, kind, fa, fb, d, name in rows:
        assert abs(float(fb) - float(fa) - float(d)) < 2e-4
    marlin = next(x for x in rows if "marlin::Marlin" in x[5])
    assert marlin[1].strip() == "gemm" and float(marlin[2]) == 0.0 and float(marlin[4]) > 0.5
    # the record's own top kernel of the target forward is the trace's
    top = json.loads((ROOT / b).read_text())["payload"]["phases"][0]["top"][0]
    assert "marlin::Marlin" in top["name"] and float(marlin[3]) == top["ms_per_step"]
    assert any("cutlass_3x_gemm_sm90_fp8" in x[5] and float(x[4]) < 0 for x in rows)


def test_kernels_needs_compare_and_a_kept_trace(tmp_path):
    r = subprocess.run([sys.executable, "-m", "scripts.profile", "--kernels", "3"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "--kernels: only with --compare A B" in r.stderr
    rec = json.loads((ROOT / A).read_text())
    rec["payload"]["trace"]["path"] = "results/profiles/no-such.trace.json.gz"  # a trace not here
    lost = tmp_path / "20261128T171722Z-profile.json"
    lost.write_text(json.dumps(rec))
    r = run(str(lost), B, "--kernels")
    assert r.returncode != 0 and "keeps no trace here (results/profiles/no-such.trace.json.gz)" in r.stderr
