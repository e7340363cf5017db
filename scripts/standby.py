"""`make standby VARIANT=...`: how fast a standby server answers (issue 32): start the variant with STANDBY=1,
then CYCLES times put it to sleep and time the wake call and the first token after it, and CYCLES times more
woken by the request itself (through the proxy `make serve STANDBY=1` serves with). Record (`standby`).

Each cycle: POST /sleep?level=1 (weights to host memory, KV cache dropped), the GPU memory the server
holds while asleep (nvidia-smi, where there is one), then POST /wake_up and one short streamed
completion: `first_token_s` counts from the wake call to that completion's first token, what a
client of a scaled-up standby waits beyond a running server. The completion is read to its end: a
cycle whose woken server does not finish it (an error in the stream, no finish_reason) ends the run
with one line naming the server's log, and no record. Before the cycles, the same completion on
the awake server gives the reference. The server is started and stopped here, as a process group.
Its compile cache is weights/cache/<variant>-standby (a cold start unless baked with SET=STANDBY=1),
or the variant's own bake with STANDBY_CACHE=variant (docs/compile-cache.md, "Standby"); the record says
which the start found (`compile_cache`: hit, compiled or none, from vLLM's log lines).

    python -m scripts.standby --variant qwen3.5-4b-bf16-tuned-dvg --set WEIGHTS=dummy --cycles 3
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from scripts.bake import cache_use
from scripts.kit import standby, weights
from scripts.kit.device import gpu_used_mib, host_platform
from scripts.kit.errors import KitError, run_main
from scripts.kit.paths import RESULTS
from scripts.kit.paths import rel as _rel
from scripts.kit.procs import ServerProcess, stop_on_signals
from scripts.kit.record import log_ref, make_record, write_record
from scripts.kit.schema import validate_record
from scripts.kit.variant import load


def measure(url: str, model: str, cycles: int) -> dict:
    t = time.monotonic()
    awake = [round(standby.first_token(url, model) - t, 3)]
    for _ in range(2):
        t = time.monotonic()
        awake.append(round(standby.first_token(url, model) - t, 3))
    mem_awake, rows = gpu_used_mib(), []
    for i in range(cycles):
        slept = standby.sleep(url)
        mem_asleep = gpu_used_mib()
        got = standby.wake_and_first_token(url, model)
        rows.append({"cycle": i + 1, "sleep_s": round(slept, 3), "gpu_used_mib_asleep": mem_asleep, **got})
        print(f"cycle {i + 1}/{cycles}: sleep {slept:.2f} s; wake {got['wake_s']:.2f} s, first token "
              f"{got['first_token_s']:.2f} s after the wake call", file=sys.stderr)
    # The same, woken by the request itself through the proxy `make serve STANDBY=1` puts on PORT.
    from urllib.parse import urlsplit
    from scripts.kit.procs import free_port
    from scripts.kit.wake_proxy import WakeProxy
    host = urlsplit(url).hostname
    proxy = WakeProxy(url, host, free_port(host)).start()
    try:
        req = []
        for i in range(cycles):
            standby.sleep(proxy.url)
            n, t = len(proxy.wakes), time.monotonic()
            first = round(standby.first_token(proxy.url, model) - t, 3)
            wake = proxy.wakes[-1]["wake_s"] if len(proxy.wakes) > n else None
            req.append({"cycle": i + 1, "wake_s": wake, "first_token_s": first})
            print(f"cycle {i + 1}/{cycles}, woken by its request: first token {first:.2f} s after sending it",
                  file=sys.stderr)
    finally:
        proxy.stop()
    return {"level": standby.LEVEL, "awake_first_token_s": awake, "gpu_used_mib_awake": mem_awake, "cycles": rows,
            "wake_first_token_s": spread(rows), "request_cycles": req, "request_wake_first_token_s": spread(req)}


def spread(cycles: list[dict]) -> dict:
    ft = [c["first_token_s"] for c in cycles]
    return {"median": round(statistics.median(ft), 3), "max": max(ft)}


def main(argv=None) -> int:
    from scripts.serve import add_variant_args
    p = argparse.ArgumentParser(prog="make standby", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_variant_args(p)
    p.add_argument("--cycles", type=int, default=3, help="sleep/wake cycles (default: 3)")
    a = p.parse_args(argv)
    if a.cycles < 1:
        raise KitError(f"--cycles {a.cycles}: at least 1")
    v = load(a.variant, [*a.set, "STANDBY=1"])
    platform = host_platform()
    standby.check_host(v, platform)
    weights.require(v)
    argv_, env = v.to_argv(platform), v.to_env(platform)
    started = time.time()
    log = RESULTS / v.name / "logs" / f"standby-{time.strftime('%Y%m%dT%H%M%S')}.log"
    stop_on_signals()
    srv = ServerProcess(argv_, env, v["HOST"], v["PORT"], v["READY_TIMEOUT_S"], log_path=log)
    with srv.shown(f"starting {v.name} as a standby"):
        # Read before the cycles, so the counts are the start's: did the standby start from a bake (STANDBY_CACHE)?
        cache = cache_use(log.read_text(errors="replace"))
        print(f"ready after {srv.ready_s:.1f} s (log: {_rel(log)}); compile cache: {cache['verdict']} "
              f"({cache['aot_loaded']} AOT artifact(s) and {cache['graphs_loaded']} graph(s) loaded, "
              f"{cache['graphs_compiled']} graph(s) compiled)", file=sys.stderr)
        try:
            payload = measure(srv.url, v.name, a.cycles)
        except KitError as e:
            raise KitError(f"{e}; the server is {'up' if srv.alive() else 'gone'}, its log: {_rel(log)}") from None
        if not srv.alive():
            raise KitError(f"the server died during the cycles (log: {_rel(log)})")
    payload.update(ready_s=round(srv.ready_s, 2), compile_cache=cache, argv=argv_, log=log_ref(log))
    rec = make_record("standby", v, payload, started=started, server_argv=argv_, server_env=env)
    validate_record(rec, "new standby record")
    path = write_record(rec, RESULTS)
    from scripts.report import refresh_after_write
    refresh_after_write(path)
    w = payload["wake_first_token_s"]
    rq = payload["request_wake_first_token_s"]
    print(f"wake -> first token: median {w['median']} s, max {w['max']} s over {a.cycles} cycle(s) "
          f"(awake: {payload['awake_first_token_s'][-1]} s); woken by the request: median {rq['median']} s, "
          f"max {rq['max']} s\nrecord: {_rel(path)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_main(main)
