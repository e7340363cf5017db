"""`make sweep VARIANT=… OVER=KEY=v1,v2,…`: one lever, several values, the same probe: a curve.

Each value is VARIANT + `--set KEY=value`, served once (`serve --then probe`, so the server is
health-polled, owned and stopped by the kit's serve) and probed with the same workload. Probe
records go to results/sweeps/<variant>/<KEY>/<NN>-<value>/ (apart from the variant's own records:
those values are not the variant). Then one `sweep` record in results/<variant>/ names every point's record and
its numbers, and experiments/<variant>/sweep-<key>.png plots output tok/s and TPOT p50 against the
value, one line per concurrency. A point whose server does not start or whose probe is invalid is
recorded as such, with the reason; the sweep goes on.

`--jobs N` overlaps the slow part, start-up (a Qwen3.5 cold start is minutes), on one GPU: points
run in batches of N, each server on its own port (PORT, PORT+1, ...). A batch's probes wait until
every server of the batch is up or gone (probe --barrier), then take turns under one lock, so no
timed request shares the GPU with another probe's or with a neighbour's compile and graph capture;
each server stays up until the batch's last probe is done, so all are timed beside the same neighbours.
Each server needs a fixed KV budget (SERVE_KV_CACHE_MEMORY_BYTES), else its memory profile would
see the others'.

SPEC_K is special-cased, because K alone is not a valid variant change: K=0 turns speculation off;
K>0 keeps the variant's method (mtp if it has none) and takes the first K of --rates as synthetic
per-position acceptance (dummy weights accept nothing); CUDA-graph sizes the variant lists as
multiples of 1+K are rescaled to the new 1+K. Every point gets its own VLLM_CACHE_ROOT: vLLM's
compile key does not include K (vllm#53366), so a shared cache would load another K's graphs.

`--resume` takes a point from a valid record already in one of its folders (same value, same
config and run conditions, same workload) instead of serving it again: a sweep cut short by a time
limit is finished by running it again, and a sweep whose points were all measured (possibly by
several runs) is assembled into one sweep record on any host, each point naming its own record.

    python -m scripts.sweep --variant qwen3.5-4b-awq-seq8-mtp4 --set WEIGHTS=dummy \\
        --over SPEC_K=0,1,2,3,4,5,6,7 --rates 0.98,0.82,0.70,0.54,0.45,0.38,0.32
    python -m scripts.sweep --variant qwen3-4b-awq --set WEIGHTS=dummy --over QUANT_GROUP_SIZE=32,64,128
Exit 0 when every point was measured, 1 when some failed (the sweep record says which), 2 usage error.
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from scripts.kit.device import host_platform
from scripts.kit.errors import KitError, run_main
from scripts.kit.paths import RESULTS, ROOT, atomic_write
from scripts.kit.procs import run_logged, slots_for_children
from scripts.kit.record import load_record, log_ref, make_record, records, write_record
from scripts.report import refresh_after_write
from scripts.kit.summaries import sweep as S
from scripts.kit.variant import load, v2_runner
from scripts.serve import add_variant_args
from scripts.kit.paths import rel as _rel


def parse_over(text: str) -> tuple[str, list[str]]:
    key, sep, vals = text.partition("=")
    values = [v.strip() for v in vals.split(",")] if sep else []
    if not key or not values or any(v == "" for v in values):
        raise KitError(f"--over {text!r}: expected KEY=v1,v2,... (e.g. SPEC_K=0,1,2,4)")
    return key, values


def point_sets(v, key: str, value: str, rates: list[str]) -> list[str]:
    """The --set overrides of one point (on top of the sweep's own --set)."""
    if key != "SPEC_K":
        return [f"{key}={value}"]
    k = int(value) if value.isdigit() else -1
    if k < 0:
        raise KitError(f"--over SPEC_K: {value!r} is not a whole number")
    if k == 0:
        out = ["SPEC_METHOD=none", "SPEC_K=0", "SPEC_ACCEPTANCE=", "SPEC_SCHEDULE="]
    else:
        out = [f"SPEC_METHOD={v['SPEC_METHOD'] if v['SPEC_METHOD'] != 'none' else 'mtp'}", f"SPEC_K={k}",
               "SPEC_SCHEDULE="]
        if rates:
            if len(rates) < k:
                raise KitError(f"--rates has {len(rates)} rates; SPEC_K={k} needs {k}")
            out.append("SPEC_ACCEPTANCE=" + ",".join(rates[:k]))
    # K=0 too: an early return once skipped this, so the 2026-11-23 K=0 point ran with K=4's sizes 5..40.
    sizes = str(v.config.get("SERVE_CUDAGRAPH_CAPTURE_SIZES") or "").split()
    old = v["SPEC_K"] + 1
    if sizes and all(s.isdigit() and int(s) % old == 0 for s in sizes):
        out.append("SERVE_CUDAGRAPH_CAPTURE_SIZES=" + " ".join(str(int(s) // old * (k + 1)) for s in sizes))
    elif sizes and all(s.isdigit() for s in sizes) and v2_runner(v.config):
        # V2's lists mix the drafter's request counts (kept) with the target's tokens, 1+K a request (rescaled).
        new = {int(s) if int(s) % old else int(s) // old * (k + 1) for s in sizes}
        out.append("SERVE_CUDAGRAPH_CAPTURE_SIZES=" + " ".join(map(str, sorted(new))))
    return out


def check_jobs(jobs: int, v, platform: str) -> None:
    """Servers sharing one GPU need fixed memory: vLLM sizes its KV cache from the free memory it
    profiles at start-up, which another server's start-up changes under it."""
    if jobs < 1:
        raise KitError(f"--jobs {jobs}: need at least 1")
    if jobs > 1 and platform == "gpu" and not v.config.get("SERVE_KV_CACHE_MEMORY_BYTES"):
        raise KitError(f"--jobs {jobs} starts servers side by side on one GPU: add --set "
                       f"SERVE_KV_CACHE_MEMORY_BYTES=<bytes> (and a SERVE_GPU_MEMORY_UTILIZATION that N of them fit)")


def level_numbers(rec: dict) -> dict:
    out = {}
    for lv in rec["payload"]["levels"]:
        out[str(lv["concurrency"])] = {
            "output_tok_per_s": lv["output_tok_per_s"]["median"], "tpot_p50_ms": lv["tpot_ms"]["p50"],
            "ttft_p50_ms": lv["ttft_ms"]["p50"],
            "acceptance_length": (lv.get("spec_decode") or {}).get("acceptance_length")}
    return out


def served_sets(a, v, key: str, value: str, sets: list[str]) -> list[str]:
    """Everything a point's server is given but its port."""
    out = [*a.set, *sets]
    if key == "SPEC_K" or a.cache_per_point:
        out.append(f"VLLM_CACHE_ROOT={v.cache_root / f'sweep-{key.lower()}-{value}'}")
    return out


def workload_sha(probe_args: str, variant: str) -> str:
    """The workload hash the probe will record for these --probe-args."""
    from scripts import probe as P
    from scripts.kit import latency as L
    pa = P.parser().parse_args(["--variant", variant, *shlex.split(probe_args)])
    return L.Workload(**{f.name: getattr(pa, f.name) for f in L.workload_fields()}).sha256


def measured(a, v, key: str, value: str, sets: list[str], into: Path, wsha: str) -> dict | None:
    """--resume: the point from the newest valid record in any of its folders (<NN>-<value>: runs
    with other value lists number them differently) with this point's full config and workload."""
    want = load(v.name, served_sets(a, v, key, value, sets)).config
    same = lambda c: all(str(c.get(k)) == str(val) for k, val in want.items() if k not in ("PORT", "HOST"))
    got = [(p, r) for d in sorted(into.glob(f"[0-9][0-9]-{value}")) for p, r in records(v.name, "latency", d)
           if same(r["config"]) and r["payload"]["workload"]["sha256"] == wsha and r["payload"]["validity"]["valid"]]
    if not got:
        return None
    path, rec = max(got, key=lambda pr: pr[1]["provenance"]["utc"])
    return {"value": value, "sets": sets, "wall_s": 0.0, "log": None, "status": "ok", "record": _rel(path),
            "reason": "", "levels": level_numbers(rec), "reused": True,
            "gpu_processes": rec["payload"]["server"].get("gpu_processes")}


def run_point(a, v, key: str, value: str, sets: list[str], into: Path, log: Path, port: int,
              lock: Path | None = None, barrier: tuple[Path, int] | None = None, env: dict | None = None) -> dict:
    """Serve VARIANT with sets on `port`, probe it into `into` (the point's own folder); the point's
    summary. With --jobs, `lock` keeps the concurrent servers' timed requests apart and `barrier`
    (dir, batch size) holds every probe until the whole batch is up or gone."""
    all_sets = [*served_sets(a, v, key, value, sets), f"PORT={port}"]
    flags = [x for s in all_sets for x in ("--set", s)]
    probe = [sys.executable, "-m", "scripts.probe", "--variant", v.name, *flags, "--url", "{url}",
             "--results-dir", str(into), *(["--lock", str(lock)] if lock else []),
             *(["--barrier", f"{barrier[0]}:{barrier[1]}"] if barrier else []), *shlex.split(a.probe_args)]
    cmd = [sys.executable, "-m", "scripts.serve", "--variant", v.name, *flags, "--then", shlex.join(probe)]
    before = {p for p, _ in records(v.name, "latency", into)}  # an earlier sweep's, on a re-run
    t0 = time.time()
    rc = run_logged(cmd, log, ROOT, env)
    from scripts.probe import leave
    leave(barrier, str(port))
    new = [(p, r) for p, r in records(v.name, "latency", into) if p not in before]
    point = {"value": value, "sets": sets, "wall_s": round(time.time() - t0, 1), "log": log_ref(log)}
    if not new:
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        return {**point, "status": "failed", "reason": f"exit {rc}, no latency record: " + " | ".join(tail)[-400:]}
    path, rec = new[-1]
    val = rec["payload"]["validity"]
    return {**point, "status": "ok" if val["valid"] else "invalid", "record": _rel(path),
            "reason": "; ".join(val["errors"]) if not val["valid"] else "", "levels": level_numbers(rec),
            "gpu_processes": rec["payload"]["server"].get("gpu_processes")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="make sweep", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    add_variant_args(p)
    p.add_argument("--over", required=True, metavar="KEY=v1,v2,...", help="the lever and its values (any variant key)")
    p.add_argument("--rates", default="", metavar="R1,R2,...",
                   help="SPEC_K sweeps: synthetic per-position acceptance, at least max K rates (dummy weights)")
    p.add_argument("--probe-args", default="--concurrency 1,8 --repeats 3 --requests 16",
                   help="probe flags, the same for every point (default: %(default)s)")
    p.add_argument("--cache-per-point", action="store_true",
                   help="a separate compile cache per point for any KEY (always on for SPEC_K)")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="run the points in batches of N servers at once on one GPU, each on its own port; probes "
                        "wait until the batch is up, take turns, and every server stays up until the batch is done. "
                        "Needs a fixed SERVE_KV_CACHE_MEMORY_BYTES so no server's memory profile sees another's "
                        "(default: 1)")
    p.add_argument("--lock", type=Path, metavar="FILE",
                   help="the probes' lock file, to share with other servers on the same GPU (default: one per sweep)")
    p.add_argument("--barrier", metavar="DIR:N",
                   help="join a barrier shared with other servers on the same GPU: probes wait until N servers "
                        "in all have checked in under DIR (every point in one batch: --jobs >= points)")
    p.add_argument("--resume", action="store_true",
                   help="take each point from a valid record of an earlier run (same value, config, conditions and "
                        "workload) instead of serving it; only the others are served")
    p.add_argument("--results-dir", type=Path, default=RESULTS, help="records root (default: results/; tests)")
    p.add_argument("--plot", type=Path, help="PNG (default: experiments/<variant>/sweep-<key>.png)")
    a = p.parse_args(argv)
    key, values = parse_over(a.over)
    started = time.time()
    v = load(a.variant, a.set)
    rates = [r for r in a.rates.split(",") if r]
    plan = [(val, point_sets(v, key, val, rates)) for val in values]
    for val, sets in plan:  # every point is a valid variant before any server starts
        load(v.name, [*a.set, *sets])
    check_jobs(a.jobs, v, host_platform())
    from scripts.probe import parse_barrier
    shared = parse_barrier(a.barrier)
    into = a.results_dir / "sweeps" / v.name / key
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    from tqdm import tqdm
    bar = tqdm(total=len(plan), desc=f"sweep {key}", unit="point")
    logs = into / "logs"

    def one(i: int, val: str, sets: list[str], port: int, barrier, env=None) -> dict:
        # Each point's records in their own folder: concurrent points must not take each other's.
        pt = run_point(a, v, key, val, sets, into / f"{i:02d}-{val}", logs / f"{stamp}-{key}-{val}.log",
                       port, lock=a.lock or (logs / f"{stamp}.lock" if a.jobs > 1 else None), barrier=barrier, env=env)
        bar.update(1)
        tqdm.write(f"{key}={val}: {pt['status']}" + (f" ({pt['reason']})" if pt.get("reason") else ""))
        return pt

    points, todo = {}, list(enumerate(plan))
    if a.resume:
        wsha = workload_sha(a.probe_args, v.name)
        for i, (val, sets) in list(todo):
            pt = measured(a, v, key, val, sets, into, wsha)
            if pt:
                points[i] = pt
                todo.remove((i, (val, sets)))
                bar.update(1)
                tqdm.write(f"{key}={val}: ok, from {pt['record']}")
    if shared and a.jobs < len(todo):
        raise KitError(f"--barrier needs every point in one batch: --jobs {a.jobs} < {len(todo)} points to serve")
    # Batches, not a rolling pool: a point started while another is being timed would compile and
    # capture graphs on the GPU under that probe.
    for b0 in range(0, len(todo), a.jobs):
        batch = todo[b0:b0 + a.jobs]
        barrier = shared or ((logs / f"{stamp}.barrier-{b0 // a.jobs}", len(batch)) if len(batch) > 1 else None)
        # The batch's server slots (KIT_SERVER_SLOTS) at once, held here: its probes wait for each other.
        with slots_for_children(len(batch), f"sweep's batch of {len(batch)}") as env, \
                ThreadPoolExecutor(max_workers=len(batch)) as pool:
            done = list(pool.map(lambda j_ivs: one(j_ivs[1][0], *j_ivs[1][1], v["PORT"] + j_ivs[0], barrier, env),
                                 enumerate(batch)))
        points.update({i: pt for (i, _), pt in zip(batch, done)})
    points = [points[i] for i in range(len(plan))]
    bar.close()
    png = a.plot or S.plot_path(v.name, key)
    payload = {"key": key, "values": values, "sets": a.set, "rates": rates, "probe_args": shlex.split(a.probe_args),
               "jobs": a.jobs, "points": points, "plot": _rel(png)}
    # The record first: a host without matplotlib (the GPU machine's vLLM site) still keeps the sweep.
    # Its facts and, if assembled on another host (--resume), its device are its points' records'.
    sources = [load_record(ROOT / pt["record"]) for pt in points if pt.get("record")]
    path = write_record(make_record("sweep", v, payload, started=started, sources=sources), root=a.results_dir)
    print(f"record: {_rel(path)}", file=sys.stderr)
    try:
        data = S.plot_png(v.name, key, points)
        if data:
            atomic_write(png, data)
    except ModuleNotFoundError as e:
        print(f"plot skipped ({e}); `make report` draws it from the record", file=sys.stderr)
    refresh_after_write(path)
    print(f"{key:>24}  status   " + "  ".join(f"tok/s c={c}  TPOT c={c}" for c in sorted(
        {c for pt in points for c in pt.get("levels", {})}, key=int)), file=sys.stderr)
    for pt in points:
        cells = "  ".join(f"{lv['output_tok_per_s'] or 0:10.1f}  {lv['tpot_p50_ms'] or 0:8.3f}"
                          for _, lv in sorted(pt.get("levels", {}).items(), key=lambda x: int(x[0])))
        print(f"{pt['value']:>24}  {pt['status']:<7}  {cells}", file=sys.stderr)
    return 0 if all(pt["status"] == "ok" for pt in points) else 1


if __name__ == "__main__":
    run_main(main)
