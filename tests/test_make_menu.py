"""The make menu as a new user meets it (issue #33): `make help` explains every variable a recipe
reads, generated from the Makefile's own lines; `make compare` without A= or B= says so in make's
terms; SET's PORT for compare follows one printed rule; PROBE= reaches compare; an A/A verdict names
the side."""
from __future__ import annotations

import argparse
import re
import subprocess

import pytest

from scripts import compare
from scripts.kit import compare as C
from scripts.kit.errors import KitError
from scripts.kit.paths import ROOT
from scripts.kit.procs import free_port, port_free


def make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_help_lists_every_variable_a_recipe_reads():
    """Every $(NAME) the Makefile reads is a variable the user may set; help names each as NAME=, in the
    variables block (the Makefile's `#:` lines) or on its target's line. Make's own and the Makefile's
    internal ones are excluded."""
    text = (ROOT / "Makefile").read_text()
    code = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    used = set(re.findall(r"\$\(([A-Z][A-Z0-9_]*)\)", code)) - {"PY", "QPY", "V", "IMG", "MAKEFILE_LIST", "CURDIR", "PYTHONPATH"}
    out = make("help")
    assert out.returncode == 0, out.stderr
    assert {"VARIANT", "SET", "SET_A", "SET_B", "URL", "BASE", "SLO", "DRY_RUN", "PROBE", "A", "B"} <= used
    missing = sorted(n for n in used if f"{n}=" not in out.stdout)
    assert missing == [], f"make help does not explain: {missing}"
    variables = out.stdout.split("Variables", 1)[1]
    assert "SET=PORT=8001" in variables and "SET_B=PORT=N" in variables  # how to set the port
    # Generated: the block is the Makefile's `#:` lines, as written.
    assert all(line[3:] in out.stdout for line in text.splitlines() if line.startswith("#: "))


def test_make_compare_without_a_or_b_names_them_in_make_terms():
    for args, names in (([], "A= and B="), (["A=tiny"], "B="), (["B=tiny"], "A=")):
        r = make("compare", *args)
        assert r.returncode != 0
        assert f"error: {names} not given: make compare A=" in r.stderr, r.stderr
        assert "expected one argument" not in r.stderr and "Traceback" not in r.stderr
    assert make("-n", "compare", "A=tiny", "B=tiny").stdout.split()[3:7] == ["--a", "tiny", "--b", "tiny"]


def test_probe_flags_reach_compare_through_make():
    r = make("-n", "compare", "A=tiny", "B=tiny", "PROBE=--concurrency 1 --requests 4", "SET=PORT=8001")
    assert r.returncode == 0, r.stderr
    assert "--set PORT=8001" in r.stdout and r.stdout.rstrip().endswith("--concurrency 1 --requests 4")
    a = compare.parser().parse_args(["--a", "tiny", "--b", "tiny", "--concurrency", "1", "--requests", "4"])
    assert a.concurrency == (1,) and a.requests == 4


def _sides(**kw):
    ns = argparse.Namespace(a="tiny", b="tiny", set=[], set_a=[], set_b=[], url_a=None, url_b=None)
    for k, v in kw.items():
        setattr(ns, k, v)
    return compare.load_sides(ns)


def test_one_port_in_set_gives_a_that_port_and_b_the_next_free_one_said_on_screen(capsys):
    p = free_port()
    va, vb = _sides(set=[f"PORT={p}"])
    assert va["PORT"] == p and vb["PORT"] > p and port_free(vb["HOST"], vb["PORT"])
    assert vb.sources["PORT"] == "--set"
    err = capsys.readouterr().err
    assert f"B (tiny) on port {vb['PORT']}, the next free one above A's {p}" in err and "SET_B=PORT=N" in err
    # Ports of their own are kept, and said nothing about.
    va, vb = _sides(set_a=[f"PORT={p}"], set_b=[f"PORT={p + 7}"])
    assert (va["PORT"], vb["PORT"]) == (p, p + 7) and capsys.readouterr().err == ""
    # Two running servers: ports are theirs, nothing moves.
    va, vb = _sides(set=[f"PORT={p}"], url_a="http://127.0.0.1:1", url_b="http://127.0.0.1:2")
    assert va["PORT"] == vb["PORT"] == p


def test_b_given_as_port_a_has_is_refused():
    p = free_port()
    with pytest.raises(KitError, match=f"SET_B=PORT={p}: A has port {p} too"):
        _sides(set=[f"PORT={p}"], set_b=[f"PORT={p}"])


def test_a_verdict_on_screen_names_the_side_when_a_and_b_are_one_variant():
    row = {"metric": "tpot_p50_ms", "concurrency": 1, "a": 4.19, "b": 2.42, "ratio": 1.731,
           "ci95": [1.7, 1.76], "verdict": "b better"}
    assert C.describe(row, "tiny", "tiny") == \
        "tpot_p50_ms c=1: A tiny 4.19 vs B tiny 2.42, B 1.731x [1.700, 1.760]: B (tiny) better"
    assert C.describe({**row, "verdict": "a better"}, "tiny", "tiny").endswith(": A (tiny) better")
