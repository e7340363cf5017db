"""Prose that cannot go stale (`make check-schemas`, issue 18 item 7).

The generated tables follow from records by construction; the prose around them does not. Two rules
make it checkable, in README.md, experiments/*/README.md, docs/**/*.md and the session READMEs under results/:

  1. A cited path exists. Every token in `backticks` or in a markdown link target that starts with
     one of PREFIXES names a file or folder of the tree (glob characters must match at least one;
     a trailing `:line` or `#anchor` is dropped; `<placeholders>` and `...` are not paths). A session
     README under results/ may cite a file by the path it had then, when MOVED says where it went.
  2. A cited figure agrees with its record. A figure carries its source as an HTML comment right
     after the number, which rendered markdown hides:

         TPOT 2.418<!-- results/v/20261125T082532Z-latency.json#/payload/levels/0/tpot_ms/p50 --> ms

     The part after `#` is an RFC 6901 pointer into that JSON file (a run record is read through
     record.load_record, so its corrections apply; any other JSON, e.g. a comparison's derived ratio,
     with json.load). The figure must equal the value rounded to the figure's decimals. A unit or a
     `%` / `x` after the comment is the prose's business: only the number is compared.
  3. A figure with a unit (ms, x, req/s, tok/s, GiB) carries a marker (rule 2), in README.md, docs/
     and results/findings/ (UNMARKED_DOCS), except on a line that says it is a floor, a seed's figure, an input, a
     target or the SLO (EXEMPT), and a GiB figure on a line that says KV or budget (a memory setting).
     Generated blocks, code and code spans are not prose. Only a number right before its unit is
     seen: in "4.909 vs 4.19 ms" the first figure is the writer's to mark.

Pure Python, no git: it runs inside `make check-schemas`.
"""
from __future__ import annotations

import json
import re
import sys
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path
from urllib.parse import unquote

from .paths import ROOT

DOCS = ("README.md", "experiments/*/README.md", "docs/**/*.md", "results/**/README.md")
PREFIXES = ("results/", "experiments/", "scripts/", "schemas/", "tests/", "weights/configs/", "docs/", "eval/",
            ".ci/")
GLOB_CHARS = set("*?[")
# Files that moved, old path -> new. The session READMEs under results/ are append-only and keep citing
# the old path, checked at its new place; every other document must cite the new one.
MOVED = {f"scripts/{old}.py": f"scripts/patches/{new}.py" for old, new in (
    ("_cache_patch", "device_name"), ("_draft_vocab_patch", "draft_vocab"), ("_gdn_reuse_patch", "gdn_reuse"),
    ("_draft_graph_patch", "draft_graph"), ("_on_import", "on_import"), ("_w4a16_kernel", "w4a16_kernel"))}

_FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[^\n]*$", re.S | re.M)
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_CODE = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.S)
_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_MARK = re.compile(r"<!--\s*([^\s#]+\.json)#(\S*)\s*-->")
# A sign only after a space, a bracket or the like: in "526<!-- a -->-902" the dash is a range's.
_NUM = re.compile(r"(?:(?:(?<=[\s(\[=:,;])|^)[-+])?(?<![\w.])(?:\d+(?:\.\d+)?|\.\d+)$")
# Rule 3. "x" only right after the number (2.85x): "248320 x 2560" is a shape, not a ratio.
_UNIT_FIG = re.compile(r"(?<![\w.\-/#~])(\d+(?:\.\d+)?)(?:(x)|\s?(ms|req/s|tok/s|GiB))(?![\w/])")
UNMARKED_DOCS = ("README.md", "docs/**/*.md", "results/findings/**/*.md")
EXEMPT = re.compile(r"\b(floor|seed|input|target|SLO)", re.I)  # the line says what the figure is
EXEMPT_GIB = re.compile(r"\b(KV|budget)")  # a GiB figure on such a line is a memory setting, an input
_GENERATED = re.compile(r"<!-- ([\w-]+):begin -->.*?<!-- \1:end -->", re.S)
_TRAIL = re.compile(r"(?::\d+(?:-\d+)?)?(?:#.*)?$")


def documents(root: Path = ROOT) -> list[Path]:
    seen = []
    for pat in DOCS:
        for p in sorted(root.glob(pat)):
            if p.is_file() and p not in seen:
                seen.append(p)
    return seen


def _blank(m: re.Match) -> str:
    """Keep offsets and line numbers: a removed span becomes spaces, its newlines stay."""
    return re.sub(r"[^\n]", " ", m.group(0))


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _path_token(tok: str) -> str | None:
    """The repo path a token cites, or None when it is not one (placeholder, ellipsis, other prefix)."""
    tok = tok.strip().strip("\"'(),;")
    if not tok.startswith(PREFIXES) or "<" in tok or ">" in tok or "..." in tok or "$" in tok:
        return None
    tok = _TRAIL.sub("", tok).rstrip("/.,;:")
    return tok or None


def _exists(root: Path, path: str) -> bool:
    if GLOB_CHARS & set(path):
        try:
            return next(iter(root.glob(path)), None) is not None
        except (ValueError, NotImplementedError):
            return False
    return (root / path).exists()


def cited_paths(text: str) -> list[tuple[int, str]]:
    """(line, path) for every path a document cites in inline code or a link target."""
    body = _FENCE.sub(_blank, text)
    body = _COMMENT.sub(_blank, body)  # figure markers are checked as figures, not as cited paths
    out = []
    for m in _CODE.finditer(body):
        if "\n\n" in m.group(2):  # an unmatched backtick: no code span crosses a paragraph
            continue
        for t in re.finditer(r"\S+", m.group(2)):
            p = _path_token(t.group(0))
            if p:
                out.append((_line(body, m.start(2) + t.start()), p))
    for m in _LINK.finditer(body):
        p = _path_token(m.group(1))
        if p:
            out.append((_line(body, m.start(1)), p))
    return sorted(set(out))


class _Missing(Exception):
    pass


def resolve(doc, pointer: str):
    """RFC 6901: '' is the whole document; '/a/0/b~1c' walks keys and list indices."""
    if pointer == "":
        return doc
    if not pointer.startswith("/"):
        raise _Missing(f"pointer {pointer!r} does not start with '/'")
    cur, walked = doc, ""
    for raw in pointer[1:].split("/"):
        key = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(cur, dict):
            if key not in cur:
                raise _Missing(f"no key {key!r} at {walked or '/'}")
            cur = cur[key]
        elif isinstance(cur, list):
            if not re.fullmatch(r"0|[1-9]\d*", key) or int(key) >= len(cur):
                raise _Missing(f"no index {key!r} at {walked or '/'} (length {len(cur)})")
            cur = cur[int(key)]
        else:
            raise _Missing(f"{walked or '/'} is a {type(cur).__name__}, not an object or array")
        walked += "/" + raw
    return cur


def _load(root: Path, rel: str, cache: dict):
    if rel not in cache:
        path = root / rel
        try:
            data = json.loads(path.read_text())
            if isinstance(data, dict) and "schema_version" in data and "kind" in data:
                from .record import load_record  # a run record: validated, corrections applied
                data = load_record(path)
            cache[rel] = (data, None)
        except FileNotFoundError:
            cache[rel] = (None, "which does not exist")
        except Exception as e:  # not JSON, or a record that fails its schema
            cache[rel] = (None, f"which does not load ({str(e).splitlines()[0] if str(e) else type(e).__name__})")
    return cache[rel]


def _agrees(said: str, value) -> tuple[bool, str]:
    """Does the prose figure equal the value rounded to the figure's decimals? (either tie rule)"""
    decimals = len(said.split(".", 1)[1]) if "." in said else 0
    q = Decimal(1).scaleb(-decimals)
    try:
        v = Decimal(repr(float(value)))
        got = Decimal(said.lstrip("+")).quantize(q)
        shown = [v.quantize(q, rounding=r) for r in (ROUND_HALF_UP, ROUND_HALF_EVEN)]
        return got in shown, str(got if got in shown else shown[0])
    except InvalidOperation:
        return False, str(value)


def cited_figures(text: str) -> list[tuple[int, str | None, str, str]]:
    """(line, figure or None when no number precedes the marker, file, pointer) for every marker."""
    body = _FENCE.sub(_blank, text)
    body = _CODE.sub(lambda m: m.group(0) if "\n\n" in m.group(2) else _blank(m), body)  # `<!-- x.json#/a -->` shows syntax
    out = []
    for m in _MARK.finditer(body):
        n = _NUM.search(body, max(0, m.start() - 40), m.start())
        out.append((_line(body, m.start()), n.group(0) if n else None, m.group(1), unquote(m.group(2))))
    return out


def unmarked_figures(text: str) -> list[tuple[int, str]]:
    """(line, figure with its unit) for each figure of rule 3 with no marker after its number."""
    body = _GENERATED.sub(_blank, text)
    body = _FENCE.sub(_blank, body)
    body = _CODE.sub(lambda m: m.group(0) if "\n\n" in m.group(2) else _blank(m), body)
    body = _COMMENT.sub(lambda m: "\0" * len(m.group(0)), body)  # a marker between number and unit: marked
    lines = body.split("\n")
    out = []
    for m in _UNIT_FIG.finditer(body):
        n = _line(body, m.start())
        if not (EXEMPT.search(lines[n - 1]) or (m.group(3) == "GiB" and EXEMPT_GIB.search(lines[n - 1]))):
            out.append((n, m.group(0)))
    return out


def unmarked(root: Path = ROOT, patterns=UNMARKED_DOCS) -> list[str]:
    out = []
    for pat in patterns:
        for doc in sorted(Path(root).glob(pat)):
            name = doc.relative_to(root).as_posix()
            out += [f"{name}:{line}: {fig} carries no record marker (write 2.418<!-- results/....json#/pointer --> ms, "
                    f"or say on the line that it is a floor, a seed's figure or an input)"
                    for line, fig in unmarked_figures(doc.read_text())]
    return out


def check(root: Path = ROOT) -> list[tuple[bool, str]]:
    """Every citation of every document: (ok, line). problems() keeps the failures."""
    root = Path(root)
    out, cache = [], {}
    for doc in documents(root):
        name = doc.relative_to(root).as_posix()
        text = doc.read_text()
        for line, path in cited_paths(text):
            if _exists(root, path):
                out.append((True, f"{name}:{line}: cites {path} ok"))
            elif name.startswith("results/") and path in MOVED and _exists(root, MOVED[path]):
                out.append((True, f"{name}:{line}: cites {path} ok (moved to {MOVED[path]})"))
            else:
                what = "which matches no file" if GLOB_CHARS & set(path) else "which does not exist"
                out.append((False, f"{name}:{line}: cites {path}, {what}"))
        for line, said, rel, pointer in cited_figures(text):
            cite = f"{rel}#{pointer}"
            if said is None:
                out.append((False, f"{name}:{line}: a citation of {cite} follows no number (write it right "
                                   f"after the figure: 2.418<!-- {cite} -->)"))
                continue
            if not rel.startswith(PREFIXES) or ".." in Path(rel).parts:
                out.append((False, f"{name}:{line}: {said} cites {rel}, which is outside the tree's cited folders"))
                continue
            data, err = _load(root, rel, cache)
            if err:
                out.append((False, f"{name}:{line}: {said} cites {rel}, {err}"))
                continue
            try:
                value = resolve(data, pointer)
            except _Missing as e:
                out.append((False, f"{name}:{line}: {said} cites {cite}: no such value ({e})"))
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                out.append((False, f"{name}:{line}: {said} cites {cite}, which is {json.dumps(value)[:60]}, "
                                   f"not a number"))
                continue
            ok, shown = _agrees(said, value)
            out.append((True, f"{name}:{line}: {said} cites {cite} = {value} → {shown} ok") if ok else
                       (False, f"{name}:{line}: says {said}, record says {value} ({cite})"))
    return out


def problems(root: Path = ROOT) -> list[str]:
    return [line for ok, line in check(root) if not ok] + unmarked(root)


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m scripts.kit.prose", description=__doc__.split("\n\n")[0])
    p.add_argument("-v", "--verbose", action="store_true", help="list the citations that agree too")
    p.add_argument("--unmarked", nargs="*", metavar="GLOB",
                   help="list figures with units but no marker in these files (default: rule 3's)")
    a = p.parse_args(argv)
    if a.unmarked is not None:
        found = unmarked(ROOT, a.unmarked or UNMARKED_DOCS)
        print("\n".join(found) or "none")
        return 1 if found else 0
    found = check()
    for ok, line in found:
        if a.verbose or not ok:
            print(line, file=sys.stdout if ok else sys.stderr)
    bad = sum(1 for ok, _ in found if not ok)
    print(f"prose: {bad} problem(s) in {len(found)} citation(s)", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
