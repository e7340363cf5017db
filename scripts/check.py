"""`make check-schemas`: validate the whole tree against schemas/ (CPU only, needs just jsonschema).

  1. every file in schemas/ is a valid draft 2020-12 schema;
  2. every experiments/<v>/config.env parses and validates, and the directory has README.md and
     measurements.json;
  3. every JSON under results/ and experiments/ validates (records against run_record + payload
     schema, measurements.json against measurements.schema.json); errors name file and JSON path;
  4. every summary figure a record keeps raw samples for equals what the samples give (latency
     levels, comparison ratios); a latency record without samples agrees with its repeats, and is one
     git saw before samples were kept;
  5. derived files (measurements.json, the README.md and docs/ tables) are fresh;
  6. each record's weights/acceptance labels agree with what its own argv or config says (scripts/kit/labels.py).
  Also (scripts/kit/ledger.py): records match results/ledger.tsv, and where git history exists, each record and
  correction holds its first-committed bytes, none is gone, the ledger only grows; corrections validate,
  git_commit is real.
Exit 1 with one line per problem.
"""
from __future__ import annotations

import argparse
import json
import sys

from scripts.kit import labels, ledger
from scripts.kit.errors import KitError, run_main
from scripts.kit.paths import EXPERIMENTS, RESULTS, ROOT
from scripts.kit.record import load_record
from scripts.kit.summaries.recompute import record_mismatches
from scripts.kit.schema import all_schema_files, validate_measurements
from scripts.kit.summaries.sweep import K_SWEEP_FILE
from scripts.kit.variant import discover, load


def _changed_since_head() -> set | None:
    """Records whose statistics must be recomputed: those not committed as they are. A committed record
    holds its first-committed bytes (ledger.problems checks that against git), and the check that ran when
    it was committed recomputed it; redoing every bootstrap each time took 25-40 s of this check on 2 cores.
    None (recompute all): no git history here, or KIT_CHECK_ALL=1 (what .ci/run sets)."""
    import os
    import subprocess
    if os.environ.get("KIT_CHECK_ALL") or not (ROOT / ".git").exists():
        return None
    try:
        git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        names = git("diff", "--name-only", "HEAD", "--", "results").split() + \
            git("ls-files", "--others", "--exclude-standard", "--", "results").split()
    except (OSError, subprocess.CalledProcessError):
        return None
    return {ROOT / n for n in names}


def problems() -> list[str]:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError
    out = []
    for f in all_schema_files():
        try:
            Draft202012Validator.check_schema(json.loads(f.read_text()))
        except (SchemaError, json.JSONDecodeError) as e:
            out.append(f"{f.relative_to(ROOT)}: invalid schema: {str(e).splitlines()[0]}")
    for name in discover():
        try:
            load(name)
        except KitError as e:
            out.append(str(e))
        for need in ("README.md", "measurements.json"):
            if not (EXPERIMENTS / name / need).is_file():
                out.append(f"experiments/{name}/{need}: missing")
    out += ledger.problems()
    unsampled = []  # latency records without per-request samples: only old ones may (ledger.unsampled_problems)
    fresh = _changed_since_head()
    quantized = labels.quantize_index([json.loads(f.read_text()) for f in sorted(RESULTS.glob("*/*-quantize*.json"))])
    for f in sorted(RESULTS.rglob("*.json")):
        if f.parent == RESULTS / ledger.CORRECTIONS:  # not run records; ledger.problems() checks them
            continue
        if "logs" in f.relative_to(RESULTS).parts or f.name.startswith("."):
            continue
        if f == RESULTS / K_SWEEP_FILE:  # derived from records; report --check below keeps it current
            continue
        try:
            rec = json.loads(f.read_text())
            if "schema_version" in rec and "kind" in rec:
                levels = (rec.get("payload") or {}).get("levels") or []
                if rec["kind"] == "latency" and not all("samples" in lv for lv in levels):
                    unsampled.append(f.relative_to(ROOT).as_posix())
                loaded = load_record(f)
                if fresh is None or f in fresh:
                    out += [f"{f.relative_to(ROOT)}: {m}" for m in record_mismatches(loaded)]
                out += labels.mismatches(f.relative_to(ROOT).as_posix(), rec, loaded, quantized)
            else:
                out.append(f"{f.relative_to(ROOT)}: not a run record (no schema_version/kind)")
        except (KitError, json.JSONDecodeError) as e:
            out.append(str(e) if isinstance(e, KitError) else f"{f.relative_to(ROOT)}: not JSON ({e})")
    out += ledger.unsampled_problems(unsampled)
    for f in sorted(EXPERIMENTS.glob("*/measurements.json")):
        try:
            validate_measurements(json.loads(f.read_text()), str(f.relative_to(ROOT)))
        except (KitError, json.JSONDecodeError) as e:
            out.append(str(e))
    out += __import__("scripts.kit.prose", fromlist=["problems"]).problems()  # cited paths exist, cited figures agree
    if not out:
        from scripts.report import main as report_main
        try:
            report_main(["--check"])
        except KitError as e:
            out.append(str(e))
    return out


def main(argv=None) -> int:
    argparse.ArgumentParser(prog="make check-schemas", description=__doc__.split("\n\n")[0]).parse_args(argv)
    found = problems()
    for line in found:
        print(line, file=sys.stderr)
    files = [f for f in RESULTS.rglob("*.json") if "logs" not in f.parts and f != RESULTS / K_SWEEP_FILE]
    n_fix = sum(1 for f in files if "corrections" in f.relative_to(RESULTS).parts)
    print(f"check-schemas: {len(found)} problem(s); {len(discover())} variants, {len(files) - n_fix} records, "
          f"{n_fix} corrections", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    run_main(main)
