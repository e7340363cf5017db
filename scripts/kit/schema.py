"""JSON Schema access: every record shape lives in schemas/, validated with jsonschema (draft 2020-12).

Payload schemas are referenced by kind (schemas/payloads/<kind>.schema.json), so a new record
kind is one schema file plus the script that writes it.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

from .errors import KitError
from .paths import SCHEMAS

SCHEMA_VERSION = 1


@functools.cache
def load_schema(rel: str) -> dict:
    return json.loads((SCHEMAS / rel).read_text())


def all_schema_files() -> list[Path]:
    return sorted(SCHEMAS.rglob("*.schema.json"))


def _validator(schema: dict):
    from jsonschema import Draft202012Validator
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def first_error(instance, schema: dict):
    """The most relevant validation error, or None."""
    from jsonschema.exceptions import best_match
    return best_match(_validator(schema).iter_errors(instance))


def json_path(err) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)


def payload_kinds() -> list[str]:
    return sorted(p.name.removesuffix(".schema.json") for p in (SCHEMAS / "payloads").glob("*.schema.json"))


@functools.cache
def _schemas_digest() -> str:
    """Every schema file's path and bytes, and jsonschema's version: what a record's verdict depends on besides itself."""
    from importlib.metadata import version
    h = hashlib.sha256(version("jsonschema").encode())
    for f in all_schema_files():
        h.update(str(f.relative_to(SCHEMAS)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _valid_marker(rec: dict) -> Path | None:
    """Where a record that passed validation leaves an empty file named by the hash of its content and of the schemas,
    so the next load skips jsonschema: records never change, and validating the 281 of 2026-11-27 was most of the
    20 s of `make report` (0.75 s for a fleet comparison, 0.03 s to hash it). KIT_SCHEMA_CACHE: the folder, or off.
    Only passes are kept; a failure is worked out again, for its message."""
    where = os.environ.get("KIT_SCHEMA_CACHE", "")
    if where.lower() in ("off", "0", "no"):
        return None
    root = Path(where) if where else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm-serving-kit" / "valid"
    try:
        text = json.dumps(rec, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):  # not JSON at all: validation says what is wrong, and nothing is kept
        return None
    h = hashlib.sha256(_schemas_digest().encode() + text.encode())
    key = h.hexdigest()
    return root / key[:2] / key


def validate_record(rec: dict, where: str = "record") -> None:
    """Envelope first, then the payload against its kind's schema; errors name file and JSON path. A record seen
    valid before, byte for byte under the same schemas, is not validated again (_valid_marker)."""
    marker = _valid_marker(rec)
    if marker is not None and marker.exists():
        return
    _validate_record(rec, where)
    if marker is not None:
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
        except OSError:  # a read-only home: validate every time, as before
            pass


def _validate_record(rec: dict, where: str) -> None:
    err = first_error(rec, load_schema("run_record.schema.json"))
    if err:
        raise KitError(f"{where}: {json_path(err)}: {err.message}")
    kind = rec["kind"]
    if kind not in payload_kinds():
        raise KitError(f"{where}: $.kind: no schema for kind {kind!r} (known: {', '.join(payload_kinds())})")
    err = first_error(rec["payload"], load_schema(f"payloads/{kind}.schema.json"))
    if err:
        raise KitError(f"{where}: $.payload{json_path(err)[1:]}: {err.message}")


def validate_measurements(doc: dict, where: str) -> None:
    err = first_error(doc, load_schema("measurements.schema.json"))
    if err:
        raise KitError(f"{where}: {json_path(err)}: {err.message}")
