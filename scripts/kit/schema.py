"""JSON Schema access: every record shape lives in schemas/, validated with jsonschema (draft 2020-12).

Payload schemas are referenced by kind (schemas/payloads/<kind>.schema.json), so a new record
kind is one schema file plus the script that writes it.
"""
from __future__ import annotations

import functools
import json
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


def validate_record(rec: dict, where: str = "record") -> None:
    """Envelope first, then the payload against its kind's schema; errors name file and JSON path."""
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
