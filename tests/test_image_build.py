"""The tiny image built and served for real, with the container engine on PATH (podman on CI: .ci/run
installs it): `make build-base`, `make build VARIANT=tiny`, `make verify-image VARIANT=tiny`, then a
rebuild after one file of scripts/ changed, from a copy of the build context, which must take the deps
layer from the cache and redo only the steps from the code layer on.

Slow (`make test-all`): on a clean machine the base (mmdebstrap) and the wheelhouse take minutes; both
are kept (the base by its inputs' tag, the wheelhouse under wheelhouse/), so later runs only build.
"""
from __future__ import annotations

import json
import os
import shutil

import pytest

from scripts import image
from scripts.kit import record
from scripts.kit.errors import KitError
from scripts.kit.procs import server_slot
from scripts.kit.paths import ROOT
from scripts.kit.variant import load

pytestmark = pytest.mark.slow


def engine_or_skip() -> str:
    try:
        return image.pick_engine(None, False)[0]
    except KitError as e:
        pytest.skip(f"{e} (.ci/run installs podman)")


def _link(src, dst) -> None:
    """os.link, but a temporary file of an atomic write (a dot-name) gone since the folder was listed is skipped:
    under `make test-all`'s two jobs a tiny server of another test can be writing into tiny's cache root."""
    try:
        os.link(src, dst)
    except FileNotFoundError:
        if not os.path.basename(src).startswith("."):
            raise


def copy_context(dest, v) -> None:
    """What the CPU build reads, hard-linked (the wheelhouse is GBs); a file to change is replaced, never
    written through its link."""
    keep = ["Dockerfile", ".dockerignore", "pyproject.toml", "sitecustomize.py", "schemas", "experiments",
            "weights/configs", "scripts", image.rel(v.weights_dir), image.rel(v.cache_root), image.WHEELHOUSE]
    for r in keep:
        src, dst = ROOT / r, dest / r
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, copy_function=_link, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            os.link(src, dst)


def test_tiny_image_builds_serves_and_rebuilds_only_the_code_layer(tmp_path, monkeypatch):
    engine = engine_or_skip()
    v = load("tiny")
    tag = image.engine_tag(image.image_tag(v), engine)
    assert image.main(["base", "--engine", engine]) == 0
    assert image.main(["build", "--variant", "tiny", "--target", "cpu", "--engine", engine]) == 0
    first = image.load_builds(tag)[-1]

    monkeypatch.setattr(record, "RESULTS", tmp_path / "results")
    with server_slot("the image's tiny server"):  # a container's server: no ServerProcess here to take one
        assert image.main(["verify", "--variant", "tiny", "--engine", engine]) == 0
    [path] = (tmp_path / "results" / "tiny").glob("*-image_verify.json")
    rec = record.load_record(path)  # validated against the schema on the way in and out
    p = rec["payload"]
    assert p["engine"] == engine and p["platform"] == "cpu" and p["image_id"] == first["image_id"]
    assert p["completion"]["status"] == 200 and p["completion"]["tokens"] > 0 and p["completion"]["sample"].strip()
    assert p["cache"]["mode"] == "eager" and p["cache"]["passed"] and p["cache"]["compiles"] == 0
    assert p["size_bytes"] > 0 and sum(layer["size_bytes"] for layer in p["layers"]) > 0
    assert p["ready_s"] > 0 and p["builds"][-1]["image_id"] == p["image_id"]

    ctx = tmp_path / "context"
    copy_context(ctx, v)
    serve = ctx / "scripts" / "serve.py"
    text = serve.read_text()
    serve.unlink()
    serve.write_text(text + "\n# changed by tests/test_image_build.py\n")
    rebuilt_tag = tag + "-rebuild-test"
    shutil.copy(image.builds_file(tag), image.builds_file(rebuilt_tag))  # the history the rebuild follows
    try:
        assert image.main(["build", "--variant", "tiny", "--target", "cpu", "--engine", engine,
                           "--context", str(ctx), "--tag", rebuilt_tag]) == 0
        again = image.load_builds(rebuilt_tag)[-1]
        assert again["changed"] == ["scripts/serve.py"]
        # Every step before the code layer (deps, weights, labels) came from the cache; the code layer
        # and the few after it did not.
        assert again["rebuilt"] and again["rebuilt"][0] == "COPY scripts/ scripts/", again["rebuilt"]
        # after the code layer: USER, EXPOSE, HEALTHCHECK, ENTRYPOINT, then the image stage's ARG VARIANT,
        # ARG CACHE_DIR (the variant's cache root, since 2026-11-30) and the cache's COPY
        assert len(again["rebuilt"]) <= 8 and again["cached_steps"] == again["steps"] - len(again["rebuilt"])
        docker = image.Docker(False, engine, say=False)
        old, new = image.image_layers(docker, tag)[2], image.image_layers(docker, rebuilt_tag)[2]
        deps = next(i for i, layer in enumerate(new) if "--mount=type=bind" in layer["created_by"])
        assert new[deps] == old[deps], "the deps layer is the same layer"
    finally:
        docker = image.Docker(False, engine, say=False)
        docker.run(["docker", "rmi", "--force", rebuilt_tag], capture=True, check=False, quiet=True)
        image.builds_file(rebuilt_tag).unlink(missing_ok=True)
