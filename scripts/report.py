"""`make report`: fold results/ into each experiments/<v>/measurements.json and the tables of README.md
and docs/ (DOC_FILES).

Derived files only; `--check` (run by `make check-schemas`) fails when regenerating would change
them. A record kind gets its summary from scripts/kit/summaries/<kind>.py (`summarize(variant,
records) -> dict`, optional `readme_table(all_measurements) -> str`); kinds without one are listed.
Kinds in ALSO_LISTED (comparison) also summarize records from other variants' folders that name the
variant (`also_listed`) and keep a block in each experiments/<v>/README.md (`variant_block`).

    python -m scripts.report            # regenerate everything
    python -m scripts.report --check    # exit 1 if anything is stale
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys

from scripts.kit.errors import KitError, run_main
from scripts.kit.paths import EXPERIMENTS, ROOT, atomic_write
from scripts.kit.record import records
from scripts.kit.schema import validate_measurements
from scripts.kit.variant import discover, load
from scripts.patches import PATCHES

README = ROOT / "README.md"
# Files whose marked blocks (`<!-- tag:begin -->` ... `<!-- tag:end -->`) make report fills: each file
# gets every block it has markers for. README.md keeps results-comparison; docs/config.md the variants,
# keys and patches tables; docs/results.md the per-variant results tables.
DOC_FILES = (README, ROOT / "docs" / "config.md", ROOT / "docs" / "results.md")
ALSO_LISTED = ("comparison",)  # kinds whose summary lists records from other variants' folders too


def summarizer(kind: str):
    try:
        return importlib.import_module(f"scripts.kit.summaries.{kind}")
    except ModuleNotFoundError:
        return None


def model_block(v) -> dict:
    from scripts.kit.tune import weight_scheme  # one rule for what a variant's linears hold when served
    transforms = []
    if v["QUANT"] != "none":  # FP8 dynamic has one scale a channel: no group
        group = "" if v["QUANT"] == "fp8_dynamic" else f" g{v['QUANT_GROUP_SIZE']}"
        transforms.append(f"{v['QUANT']}{group} scope={v['QUANT_SCOPE']} (llm-compressor)")
    spec = "none" if v["SPEC_METHOD"] == "none" else f"{v['SPEC_METHOD']} k={v['SPEC_K']}"
    return {"starting_weights": f"{v['MODEL']}@{v['REVISION']}", "weight_transformations": transforms,
            "weight_dtype": weight_scheme(v.config), "speculation": spec}


def build(name: str) -> dict:
    v = load(name)
    doc = {"schema_version": 1, "variant": name, "config_sha256": v.config_sha256, "model": model_block(v),
           "results": {}, "stale_records": []}
    by_kind: dict[str, list] = {}
    for path, rec in records(name):
        rel = str(path.relative_to(ROOT))
        # A record measured under another config is kept on disk but not summarized: the numbers
        # would describe a variant that no longer exists.
        if not v.describes(rec):
            doc["stale_records"].append(rel)
            continue
        by_kind.setdefault(rec["kind"], []).append((rel, rec))
    # Records under another variant's folder that name this one (a comparison's A side): a summary's
    # `also_listed(name)` gives them, each with the config it measured this variant under.
    for kind in ALSO_LISTED:
        for rel, rec in summarizer(kind).also_listed(name):
            if v.describes(rec):
                by_kind.setdefault(kind, []).append((rel, rec))
            else:
                doc["stale_records"].append(rel)
    for kind, recs in sorted(by_kind.items()):
        mod = summarizer(kind)
        summary = mod.summarize(v, recs) if mod else {}
        doc["results"][kind] = {**summary, "records": [r for r, _ in recs]}
    validate_measurements(doc, f"experiments/{name}/measurements.json")
    return doc


def render(doc: dict) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def variant_table(docs: dict) -> str:
    rows = ["| variant | parent | weights | speculation | what it changes |", "|---|---|---|---|---|"]
    for name, doc in docs.items():
        v = load(name)
        first = next((l.lstrip("# ").strip() for l in (EXPERIMENTS / name / "config.env").read_text().splitlines()
                      if l.startswith("#")), "")
        rows.append(f"| `{name}` | {v['BASE'] or '-'} | {doc['model']['weight_dtype']} | "
                    f"{doc['model']['speculation']} | {first} |")
    return "\n".join(rows)


def keys_table() -> str:
    """The config.env key reference, generated from the schema (the one place defaults live)."""
    from scripts.kit.schema import load_schema
    sch = load_schema("variant.schema.json")
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for k, p in sch["properties"].items():
        d = p.get("default")
        rows.append(f"| `{k}` | `{'' if d is None else d}` | {p['description']} |")
    for pat, p in sch["patternProperties"].items():
        rows.append(f"| `{pat}` | | {p['description']} |")
    out = sch["x-changes-output"]
    rows += ["", "**Keys that change the output** (" + ", ".join(f"`{k}`" for k in out["keys"]) + "): "
             + out["description"]]
    return "\n".join(rows)


def patches_table() -> str:
    """What the kit changes in vLLM, from the one table of its patches (scripts/patches/__init__.py)."""
    rows = ["| change | key (variable) | module | written for | upstream | tests |", "|---|---|---|---|---|---|"]
    for p in PATCHES:
        key = ("none" if p.switch is None else f"`{p.switch}`" if p.key in (None, p.switch)
               else f"`{p.key}` (`{p.switch}`)")
        tests = ", ".join(f"`{t}`" for t in p.tests)
        rows.append(f"| {p.what} | {key} | `scripts/patches/{p.module}.py` | {p.targets} | {p.upstream} | {tests} |")
    return "\n".join(rows)


def replace_block(text: str, tag: str, body: str) -> str:
    begin, end = f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->"
    if begin not in text or end not in text:
        return text
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def readme_text(docs: dict, path=README) -> str:
    text = path.read_text() if path.exists() else ""
    text = replace_block(text, "variants", variant_table(docs))
    text = replace_block(text, "keys", keys_table())
    text = replace_block(text, "patches", patches_table())
    for kind in sorted({k for d in docs.values() for k in d["results"]}):
        mod = summarizer(kind)
        if mod and hasattr(mod, "readme_table"):
            text = replace_block(text, f"results-{kind}", mod.readme_table(docs))
        for tag, body in (mod.readme_blocks(docs).items() if mod and hasattr(mod, "readme_blocks") else ()):
            text = replace_block(text, tag, body)
    return text


def variant_readme_text(name: str, docs: dict) -> str | None:
    """experiments/<name>/README.md with the blocks summaries generate for one variant (a summary's
    VARIANT_TAG and variant_block(name, docs)). A missing block is appended, under the summary's
    VARIANT_HEADING, only once it has something to say; an existing one is always refreshed."""
    path = EXPERIMENTS / name / "README.md"
    if not path.exists():
        return None
    text = path.read_text()
    for kind in ALSO_LISTED:
        mod = summarizer(kind)
        body = mod.variant_block(name, docs)
        if f"<!-- {mod.VARIANT_TAG}:begin -->" in text:
            text = replace_block(text, mod.VARIANT_TAG, body or mod.empty_block(name, load(name)["BASELINE"]))
        elif body:
            text = (text.rstrip("\n") + f"\n\n{mod.VARIANT_HEADING}\n{mod.VARIANT_LEAD}\n\n"
                    f"<!-- {mod.VARIANT_TAG}:begin -->\n{body}\n<!-- {mod.VARIANT_TAG}:end -->\n")
        # The headline goes under the title, where a reader starts; it is made from comparison records only.
        tag, body = mod.HEADLINE_TAG, mod.headline_block(name)
        if f"<!-- {tag}:begin -->" in text:
            text = replace_block(text, tag, body)
        else:
            title, _, rest = text.partition("\n")
            text = f"{title}\n\n<!-- {tag}:begin -->\n{body}\n<!-- {tag}:end -->\n\n{rest.lstrip(chr(10))}"
    return text


def left_out_lines() -> list[str]:
    """What make report prints: every record no table holds, and why (issue 30: 21 of 30 comparison
    records had gone silently)."""
    return [f"left out of README's {kind} table: {rel}: {why}" for kind in ALSO_LISTED
            for rel, why in summarizer(kind).left_out()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="make report", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="fail if any derived file is stale; write nothing")
    a = p.parse_args(argv)
    docs = {name: build(name) for name in discover()}
    stale = []
    for name, doc in docs.items():
        path = EXPERIMENTS / name / "measurements.json"
        new = render(doc)
        if not path.exists() or path.read_text() != new:
            stale.append(str(path.relative_to(ROOT)))
            if not a.check:
                atomic_write(path, new)
    for name in docs:
        new = variant_readme_text(name, docs)
        path = EXPERIMENTS / name / "README.md"
        if new is not None and path.read_text() != new:
            stale.append(str(path.relative_to(ROOT)))
            if not a.check:
                atomic_write(path, new)
    for doc in DOC_FILES:
        new_text = readme_text(docs, doc)
        if doc.exists() and doc.read_text() != new_text:
            stale.append(str(doc.relative_to(ROOT)))
            if not a.check:
                atomic_write(doc, new_text)
    # Binary artifacts (plots) a summary derives from the same records, compared byte for byte.
    for kind in sorted({k for d in docs.values() for k in d["results"]}):
        mod = summarizer(kind)
        for path, data in (mod.artifacts(docs).items() if mod and hasattr(mod, "artifacts") else ()):
            if not path.exists() or path.read_bytes() != data:
                stale.append(str(path.relative_to(ROOT)))
                if not a.check:
                    atomic_write(path, data)
    if a.check and stale:
        raise KitError("derived files are stale (run: make report): " + ", ".join(stale))
    if not a.check:
        for line in left_out_lines():
            print(line, file=sys.stderr)
    print(("up to date" if not stale else ("stale: " if a.check else "wrote: ") + ", ".join(stale)), file=sys.stderr)
    return 0


def refresh_after_write(record_path) -> bool:
    """The rule for every command that writes a record (tests/test_records.py checks each one calls
    this, after its own plots): regenerate what derives from results/, so `make check-schemas` does not
    fail on "derived files are stale" until someone runs `make report` (issues #20, #33). Only a record
    that report reads, results/<variant>/<file>, feeds derived files; one written elsewhere (a test's
    tmp folder, a sweep's points, a tune's candidates: their batch's own record refreshes) is left alone. Runs `python -m scripts.report` with the interpreter `make check-schemas`
    uses (.venv's when there is one): `make quantize` runs in .venv-quant, whose plotting need not
    draw the same bytes. Best effort: the record stands whatever happens here, and a failure says to
    run `make report`. True when the derived files were refreshed."""
    import os
    import subprocess
    from pathlib import Path
    from scripts.kit.paths import RESULTS
    if Path(record_path).resolve().parent.parent != RESULTS.resolve():
        return False
    venv = ROOT / ".venv" / "bin" / "python"
    py = str(venv) if venv.exists() else sys.executable
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    try:
        r = subprocess.run([py, "-m", "scripts.report"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"derived files not refreshed ({e}); run: make report", file=sys.stderr)
        return False
    last = (r.stderr.strip().splitlines() or [""])[-1]
    if r.returncode != 0:
        print(f"derived files not refreshed (make report: {last}); run: make report", file=sys.stderr)
        return False
    print(f"report: {last}", file=sys.stderr)
    return True


if __name__ == "__main__":
    run_main(main)
