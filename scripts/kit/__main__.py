"""Repository-level verbs.

    python -m scripts.kit list                      # variants
    python -m scripts.kit show VARIANT [--set K=V]  # resolved config, each value's source
    python -m scripts.kit golden [--check]          # tests/golden/argv/*.txt from every variant
    python -m scripts.kit new NAME [--base VARIANT] # copy experiments/_template
    python -m scripts.kit ledger                    # add new records' lines to results/ledger.tsv
    python -m scripts.kit gates-data DIR            # offline DATA_DIR for the default gates (stand-in items)
    python -m scripts.kit vllm026-src               # vLLM 0.26's files some tests run, once, into .cache/
    python -m scripts.kit lm-head-check --variant V # LM_HEAD_W8's effect on V's logits (a record)
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from .errors import KitError, run_main
from .paths import EXPERIMENTS, GOLDEN, ROOT
from .variant import NAME_RE, discover, load

# Goldens are written for both platforms where the argv differs (EAGER=auto).
GOLDEN_PLATFORMS = ("gpu", "cpu")


def golden_text(name: str, platform: str) -> str:
    """Path- and interpreter-independent rendering of a variant's server command and env."""
    v = load(name)

    def norm(s: str) -> str:
        return s.replace(str(ROOT), "$KIT_ROOT")
    argv = v.to_argv(platform, python="python")
    env = v.to_env(platform)
    lines = [f"# {name} on {platform}: `make golden` regenerates; review the diff", "[env]"]
    lines += [f"{k}={norm(val)}" for k, val in sorted(env.items())]
    lines += ["[argv]"] + [norm(x) for x in argv]
    return "\n".join(lines) + "\n"


def golden(check: bool) -> int:
    d = GOLDEN / "argv"
    d.mkdir(parents=True, exist_ok=True)
    want = {f"{n}.{p}.txt": golden_text(n, p) for n in discover() for p in GOLDEN_PLATFORMS}
    bad = []
    for fname, text in want.items():
        path = d / fname
        if not path.exists() or path.read_text() != text:
            bad.append(fname)
            if not check:
                path.write_text(text)
    for extra in sorted(set(p.name for p in d.glob("*.txt")) - set(want)):
        bad.append(extra + " (no such variant)")
        if not check:
            (d / extra).unlink()
    if check and bad:
        raise KitError("argv goldens differ (run: make golden, then review the diff): " + ", ".join(bad))
    print(("goldens up to date" if not bad else "updated: " + ", ".join(bad)), file=sys.stderr)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.kit", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="list variants")
    s = sub.add_parser("show", help="resolved config of a variant")
    s.add_argument("variant")
    s.add_argument("--set", action="append", default=[])
    g = sub.add_parser("golden", help="regenerate tests/golden/argv")
    g.add_argument("--check", action="store_true")
    n = sub.add_parser("new", help="new variant from experiments/_template")
    n.add_argument("name")
    n.add_argument("--base", default=None)
    sub.add_parser("ledger", help="add records missing from results/ledger.tsv (existing lines never change)")
    d = sub.add_parser("gates-data", help="write a DATA_DIR (Hugging Face datasets cache) that the default "
                                          "gates' lm-eval tasks load offline, from eval/data/gates_default")
    d.add_argument("dir")
    def text_verb(name, help_, text_help, kit_text):  # a verb run on a variant's weights over text
        v = sub.add_parser(name, help=help_)
        v.add_argument("--variant", required=True)
        v.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
        v.add_argument("--text", action="append", type=Path, metavar="FILE",
                       help=f"{text_help} (repeatable; e.g. a sample of your traffic); default: the kit's {kit_text}")
        return v
    text_verb("draft-vocab", "the token sets SPEC_DRAFT_VOCAB=N drafts from (MTP) and LM_HEAD_VOCAB=N keeps the "
              "target's logits to, beside the weights: the N most frequent tokens of calibration text",
              "calibration text", "calibration text")
    lh = text_verb("lm-head-check", "what LM_HEAD_W8 does to a model's logits: its 16-bit lm_head against the 8-bit "
                   "copies the patch can serve, on text (one lmhead_check record)", "text to run", "held-out text")
    lh.add_argument("--tokens", type=int, default=512, help="positions compared (the text's first N tokens; default 512)")
    lh.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda where there is one")
    lh.add_argument("--results-dir", type=Path, default=None, help="where the record goes (default: results/)")
    sub.add_parser("vllm026-src", help="fetch the vLLM 0.26 source files tests run (scripts/kit/vllm026.py)")
    a = p.parse_args(argv)
    if a.cmd == "list":
        print("\n".join(discover()))
    elif a.cmd == "show":
        v = load(a.variant, a.set)
        print(f"# {v.name}  config_sha256={v.config_sha256}")
        for k in sorted(v.config):
            print(f"{k}={'' if v.config[k] is None else v.config[k]}    # {v.sources.get(k, 'default')}")
    elif a.cmd == "golden":
        return golden(a.check)
    elif a.cmd == "new":
        if not NAME_RE.match(a.name):
            raise KitError(f"bad variant name {a.name!r}")
        dst = EXPERIMENTS / a.name
        if dst.exists():
            raise KitError(f"{dst.relative_to(ROOT)} exists")
        if a.base:
            load(a.base)
        shutil.copytree(EXPERIMENTS / "_template", dst)
        cfg = dst / "config.env"
        cfg.write_text(cfg.read_text().replace("# BASE=", f"BASE={a.base}" if a.base else "# BASE="))
        print(f"created {dst.relative_to(ROOT)}: edit config.env and README.md, then `make golden report`")
    elif a.cmd == "ledger":
        from .ledger import update
        added = update()
        for line in added:
            print(line)
        print(f"ledger: {len(added)} record(s) added", file=sys.stderr)
    elif a.cmd == "draft-vocab":
        from .draft_vocab import make
        texts = source = None
        if a.text:
            missing = [str(f) for f in a.text if not f.is_file()]
            if missing:
                raise KitError(f"--text: no such file: {', '.join(missing)}")
            texts, source = [f.read_text(errors="replace") for f in a.text], "files: " + ", ".join(str(f) for f in a.text)
        for out in make(load(a.variant, a.set), texts, source):
            doc = json.loads(out.read_text())
            print(f"{out.relative_to(ROOT)}: {len(doc['ids'])} ids of {doc['vocab_size']}, covering "
                  f"{100 * doc['coverage']:.2f}% of {doc['calibration_tokens']} calibration tokens")
            if doc["filled_by_rank"]:
                print(f"the text had {doc['distinct_tokens_seen']} distinct tokens: {doc['filled_by_rank']} more were "
                      "taken by BPE rank (lowest ids); more --text makes the set fit your traffic better", file=sys.stderr)
    elif a.cmd == "gates-data":
        from .gates_data import build
        for name, splits in build(a.dir).items():
            print(f"{name}: " + ", ".join(f"{s} {n}" for s, n in splits.items()))
        print(f"wrote {a.dir} (loaded back offline); use it: DATA_DIR={a.dir} or --data-dir {a.dir}", file=sys.stderr)
    elif a.cmd == "lm-head-check":
        if a.tokens < 2:
            raise KitError(f"--tokens {a.tokens}: at least 2")
        from .lm_head_check import main as check
        return check(a)
    elif a.cmd == "vllm026-src":
        from .vllm026 import fetch
        print(fetch())
    return 0


if __name__ == "__main__":
    run_main(main)
