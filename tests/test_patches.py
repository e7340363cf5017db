"""The table of what the kit changes in vLLM (scripts/patches/__init__.py): every row's module and tests
exist, sitecustomize.py loads exactly the rows whose variable is set and survives one that fails, and
docs/config.md shows the table as it is."""
from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys

from scripts.kit.paths import ROOT
from scripts.kit.schema import load_schema
from scripts.patches import PATCHES
from scripts.report import patches_table

PKG = ROOT / "scripts" / "patches"


def test_a_start_key_sets_its_rows_switch_only_when_set_and_leaves_the_variants_identity():
    """Each row whose key is a start key (scripts/kit/variant.py START_KEYS): a non-default value of the key puts the
    row's switch in the server's environment, the default leaves it out, and the variant's config hash (what its
    records are matched by) is the same either way."""
    from scripts.kit.variant import START_KEYS, load
    props = load_schema("variant.schema.json")["properties"]
    needs = {"API_TEXT_ONLY": ["SERVE_LANGUAGE_MODEL_ONLY=true"],  # the variant's own checks ask for these
             "API_TOKENIZER_PREFETCH": ["API_TOKENIZER_CACHE=1"], "STANDBY_CACHE": ["STANDBY=1"]}
    rows = [p for p in PATCHES if p.key in START_KEYS]
    assert {"STARTUP_PLAN_KEY", "STARTUP_PROFILE_RUN", "API_LEAN_IMPORTS"} <= {p.key for p in rows}
    for p in rows:
        prop, base = props[p.key], load("tiny", needs.get(p.key, []))
        value = next(v for v in prop.get("enum", [1]) if v != prop["default"])
        on = load("tiny", needs.get(p.key, []) + [f"{p.key}={value}"])
        assert on.to_env("cpu").get(p.switch), (p.key, value)
        assert p.switch not in base.to_env("cpu"), p.key
        assert on.config_sha256 == base.config_sha256, p.key


def test_every_row_names_a_module_with_install_its_tests_and_a_key_the_schema_knows():
    schema = load_schema("variant.schema.json")
    allowed = [re.compile(pat) for pat in schema["patternProperties"]]
    for p in PATCHES:
        src = PKG / f"{p.module}.py"
        assert src.is_file(), p.module
        assert p.tests and all((ROOT / t).is_file() for t in p.tests), p.tests
        assert p.targets.startswith("vLLM ") and p.what and p.upstream
        if p.switch is None:
            assert p.key is None, p.module
            continue
        assert p.switch.startswith("KIT_"), p.switch
        funcs = {n.name for n in ast.parse(src.read_text()).body if isinstance(n, ast.FunctionDef)}
        assert "install" in funcs, f"{src}: a switched row's module needs install()"
        # A key is a typed key of the schema or a variable config.env passes through; None: the environment's.
        assert p.key is None or p.key in schema["properties"] or any(r.fullmatch(p.key) for r in allowed), p.key
    switched = [p.switch for p in PATCHES if p.switch]  # rows without a switch are kernels a script imports
    assert len({p.module for p in PATCHES}) == len(PATCHES) and len(set(switched)) == len(switched)


def test_every_module_of_the_package_is_a_row_or_a_shared_helper():
    """The helpers: the import hook, the run-time branch the GEMM patches share, and the kernels' in-kernel split-K."""
    rows = {f"{p.module}.py" for p in PATCHES}
    assert {f.name for f in PKG.glob("*.py")} - rows == {"__init__.py", "on_import.py", "decode_gemm.py", "split_k.py"}


def test_the_table_imports_nothing():
    """sitecustomize.py imports it in every Python process."""
    r = subprocess.run([sys.executable, "-S", "-c", "import sys; before = set(sys.modules); import scripts.patches; "
                        "print(sorted(set(sys.modules) - before))"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['scripts', 'scripts.patches']"


def test_docs_config_shows_the_table_as_it_is():
    text = (ROOT / "docs" / "config.md").read_text()
    assert f"<!-- patches:begin -->\n{patches_table()}\n<!-- patches:end -->" in text
    for p in PATCHES:
        assert f"`scripts/patches/{p.module}.py`" in patches_table()


TABLE = '''
PATCHES = (
    Patch("KIT_T_ON", None, "works", "a patch that works", "vLLM 0.26.0", "none", ()),
    Patch("KIT_T_BAD", None, "fails", "a patch that fails", "vLLM 0.26.0", "none", ()),
    Patch("KIT_T_OFF", None, "off", "a patch whose variable is unset", "vLLM 0.26.0", "none", ()),
    Patch(None, None, "kernel", "a kernel, never loaded at start", "vLLM 0.26.0", "none", ()),
)
'''


def run_site(root, env: dict) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("KIT_")}
    full.update(env, PYTHONPATH=str(root))
    return subprocess.run([sys.executable, "-c", "import sys; print('alive', sorted(m for m in sys.modules "
                           "if m.startswith('scripts.patches.')))"], env=full, cwd="/", capture_output=True, text=True)


def test_sitecustomize_loads_the_rows_whose_variable_is_set_and_survives_one_that_fails(tmp_path):
    """A copy of the kit's sitecustomize.py over a stand-in package of four rows: adding a patch is one row
    and one module, and sitecustomize.py needs no edit."""
    shutil.copy(ROOT / "sitecustomize.py", tmp_path)
    pkg = tmp_path / "scripts" / "patches"
    pkg.mkdir(parents=True)
    (tmp_path / "scripts" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text((PKG / "__init__.py").read_text().split("\nPATCHES = (")[0] + TABLE)
    for mod, body in (("works", "print('kit: works installed', file=sys.stderr)"), ("fails", "raise OSError('no GPU')"),
                      ("off", "raise AssertionError('loaded while off')"), ("kernel", "raise AssertionError('loaded')")):
        (pkg / f"{mod}.py").write_text(f"import sys\ndef install():\n    {body}\n")
    r = run_site(tmp_path, {"KIT_T_ON": "1", "KIT_T_BAD": "1"})
    assert r.returncode == 0 and r.stdout.split("[")[0].strip() == "alive", r.stderr
    assert "'scripts.patches.works'" in r.stdout and "off" not in r.stdout and "kernel" not in r.stdout
    assert r.stderr.splitlines() == [
        "kit: works installed",
        "kit: KIT_T_BAD is set but scripts/patches/fails.py is NOT active (OSError: no GPU)"]
    r = run_site(tmp_path, {})
    assert r.returncode == 0 and r.stdout.strip() == "alive []" and r.stderr == ""
    (pkg / "__init__.py").write_text("PATCHES = (")  # a broken table: said once, and the interpreter starts
    r = run_site(tmp_path, {"KIT_T_ON": "1"})
    assert r.returncode == 0 and r.stdout.strip() == "alive []", r.stderr
    assert r.stderr.startswith("kit: no patch active (scripts.patches: SyntaxError")
