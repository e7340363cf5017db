"""Labels follow facts (`make check-schemas`, issue 30 item 2).

A record's `provenance.weights` and `provenance.acceptance` say what its numbers stand for. They are
derived here again from what the record keeps as it was written (its bytes, not its corrections), and
the label after corrections must agree; so a correction can fix a label that the config got wrong,
but cannot relabel dummy weights real against the record's own `--load-format dummy`.

  - the server argv the record keeps (payload.argv; a comparison's sides): weights "dummy" iff
    `--load-format dummy`, acceptance from `--speculative-config` (record.facts_from_argv);
  - else its config (a probe of a server by --url: the caller's config is that server's);
  - a quantized checkpoint whose latest quantize record before it says `random_source`: weights
    "random", the real checkpoint format holding random values, where the record's own server argv
    loaded it (2026-11-24: four AWQ records said "real" for checkpoints quantized from random
    weights); a probe of a server by --url could have held another checkpoint: "real" or "random";
  - a quantize record with `random_source`: not "real";
  - tune, sweep and variance records merge their servers' labels (record.facts_from_records): not derived here.

    from scripts.kit import labels
    labels.mismatches(rel, raw, corrected, labels.quantize_index(raw_records))  # -> [problem, ...]
"""
from __future__ import annotations

from pathlib import Path

from .paths import ROOT
from .record import facts_from_argv, merged

SESSION_KINDS = ("tune", "sweep", "variance")  # several servers: their labels merged


def quant_key(config) -> tuple:
    return tuple(config.get(k) for k in ("MODEL", "QUANT", "QUANT_GROUP_SIZE", "QUANT_SCOPE"))


def quantize_index(raws: list[dict]) -> dict[tuple, list[tuple[str, bool]]]:
    """{(MODEL, QUANT, group, scope): [(utc, random_source), ...] sorted} over the quantize records
    that published a checkpoint."""
    out: dict[tuple, list] = {}
    for r in raws:
        p = r.get("payload") or {}
        if r.get("kind") == "quantize" and p.get("published", True):
            out.setdefault(quant_key(r.get("config") or {}), []).append((r["provenance"]["utc"], bool(p.get("random_source"))))
    return {k: sorted(v) for k, v in out.items()}


def _from_config(config: dict) -> dict:
    spec = config.get("SPEC_METHOD", "none") not in ("none", None)
    return {"weights": "dummy" if config.get("WEIGHTS") == "dummy" else "real",
            "acceptance": "none" if not spec else ("synthetic" if config.get("SPEC_ACCEPTANCE") else "real")}


def expected(raw: dict, index: dict) -> tuple[dict[str, set], str]:
    """({label: the values the facts allow}, where the facts come from); {} where none are derived."""
    kind, p, config = raw.get("kind"), raw.get("payload") or {}, raw.get("config") or {}
    if kind in SESSION_KINDS:
        return {}, ""
    if kind == "quantize":
        return ({"weights": {"dummy", "random"}}, "its payload.random_source") if p.get("random_source") else ({}, "")
    sides = [s for s in ((p.get("sides") or {}).values()) if isinstance(s, dict) and s.get("argv")]
    if kind == "comparison" and sides:
        facts = [facts_from_argv(s["argv"], {}) for s in sides]
        got, src = {k: merged(f[k] for f in facts) for k in ("weights", "acceptance")}, "its sides' server argv"
        # A synthetic side beside a non-speculating one is "mixed" in the record, as in merged().
    elif p.get("argv"):
        got, src = facts_from_argv(p["argv"], {}), "its server argv (payload.argv)"
        got = {k: got[k] for k in ("weights", "acceptance")}
    else:
        got, src = _from_config(config), "its config"
    out = {k: {v} for k, v in got.items()}
    if got["weights"] == "real" and config.get("QUANT", "none") != "none":
        before = [rs for utc, rs in index.get(quant_key(config), []) if utc <= raw["provenance"]["utc"]]
        if before and before[-1]:
            # Its own server's argv names the kit's checkpoint: random. A server probed by --url may have
            # held another checkpoint, so either label stands there.
            out["weights"] = {"random"} if src != "its config" else {"real", "random"}
            src += " and the quantize record of its checkpoint (random source)"
    return out, src


def mismatches(rel: str, raw: dict, corrected: dict, index: dict, root: Path = ROOT) -> list[str]:
    """One line per label of the record at root/rel that its facts contradict, naming the correction
    that set it where one did."""
    from .ledger import corrections_for
    want, src = expected(raw, index)
    out = []
    for label, allowed in sorted(want.items()):
        have = corrected["provenance"].get(label)
        if have in allowed:
            continue
        by = [c["file"] for c in corrections_for(root / rel) if c["pointer"] == f"/provenance/{label}"]
        fix = (f"the correction that set it contradicts them: {', '.join(by)}" if by and have != raw["provenance"].get(label)
               else "write a correction (results/corrections/)")
        out.append(f"{rel}: provenance.{label} is {have!r} but {src} says {' or '.join(sorted(map(repr, allowed)))}: "
                   f"labels follow facts; {fix}")
    return out
