"""Records: schema validation with JSON paths, atomic append-only writes, provenance."""
import json

import pytest

from scripts.kit.errors import KitError
from scripts.kit.record import load_record, make_record, records, write_record
from scripts.kit.schema import validate_record
from scripts.kit.variant import load

PAYLOAD = {"ready_s": 1.5, "argv": ["python", "-m", "x"], "endpoints": {"GET /health": {"status": 200, "latency_ms": 1.0}}}


def test_record_roundtrip_and_provenance(tree):
    tree("a", "MODEL=org/m\n")
    rec = make_record("serve_smoke", load("a"), PAYLOAD, command=["python", "-m", "scripts.serve"])
    path = write_record(rec, root=tree.res)
    assert path.parent.name == "a" and path.name.endswith("-serve_smoke.json")
    back = load_record(path)
    prov = back["provenance"]
    assert prov["device"]["kind"] in ("cpu", "gpu") and prov["weights"] == "real" and prov["acceptance"] == "none"
    assert prov["versions"]["python"] and back["config_sha256"] == load("a").config_sha256
    assert [p for p, _ in records("a", "serve_smoke", root=tree.res)] == [path]


def test_writes_never_overwrite(tree):
    tree("a", "MODEL=org/m\n")
    rec = make_record("serve_smoke", load("a"), PAYLOAD)
    p1, p2 = write_record(rec, root=tree.res), write_record(rec, root=tree.res)
    assert p1 != p2 and p1.exists() and p2.exists()
    assert not list(tree.res.rglob("*.tmp"))
    # Both are found by kind, the second's "-2" name included (make tune --jobs once lost one that way).
    assert {p for p, _ in records("a", "serve_smoke", root=tree.res)} == {p1, p2}


@pytest.mark.parametrize("mutate,where", [
    (lambda r: r.pop("provenance"), "$: 'provenance' is a required property"),
    (lambda r: r["provenance"].update(weights="fake"), "$.provenance.weights"),
    (lambda r: r.update(kind="nosuchkind"), "no schema for kind 'nosuchkind'"),
    (lambda r: r["payload"].pop("ready_s"), "$.payload: 'ready_s' is a required property"),
    (lambda r: r["payload"]["endpoints"]["GET /health"].update(status="ok"), "$.payload.endpoints"),
])
def test_bad_records_fail_with_json_path(tree, mutate, where):
    tree("a", "MODEL=org/m\n")
    rec = make_record("serve_smoke", load("a"), json.loads(json.dumps(PAYLOAD)))
    mutate(rec)
    with pytest.raises(KitError) as e:
        validate_record(rec, "r.json")
    assert where in str(e.value) and str(e.value).startswith("r.json: ")


def test_invalid_record_is_not_written(tree):
    tree("a", "MODEL=org/m\n")
    rec = make_record("serve_smoke", load("a"), {"nope": 1})
    with pytest.raises(KitError):
        write_record(rec, root=tree.res)
    assert not list(tree.res.rglob("*"))


def test_load_record_rejects_non_json(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("{not json")
    with pytest.raises(KitError, match="not JSON"):
        load_record(p)


def test_git_state_prefers_the_commit_the_caller_names(monkeypatch):
    """A tree copied to another machine may carry an older .git (the GPU machine's did): the commit
    passed in KIT_GIT_COMMIT wins, always marked dirty; without it, this checkout's own HEAD."""
    import subprocess
    from scripts.kit.paths import ROOT
    from scripts.kit.record import git_state
    monkeypatch.setenv("KIT_GIT_COMMIT", "8cb46de")
    assert git_state() == ("8cb46de", True)
    monkeypatch.delenv("KIT_GIT_COMMIT")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert git_state()[0] == head
