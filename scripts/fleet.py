"""`make serve-fleet VARIANT=... REPLICAS=N [POLICY=...]`: N replicas of the variant behind vllm-router
until Ctrl-C (scale out on one host; see scripts/kit/fleet.py).

The replicas start together, each on its own port (PORT+1 ... PORT+N) and, on a GPU host, its own
GPU(s); once all answer /health the router starts on PORT and routes to them (cache_aware unless
POLICY says otherwise). A replica that dies is restarted, at most FLEET_MAX_RESTARTS times, each
death and restart a stderr line (Fleet.supervise). Ctrl-C stops the router, then the replicas, each
as a process group.

    python -m scripts.fleet --variant tiny --replicas 2                       # until Ctrl-C
    python -m scripts.fleet --variant tiny --replicas 2 --policy round_robin --dry-run
"""
from __future__ import annotations

import argparse
import shlex
import sys

from scripts.kit import weights
from scripts.kit.errors import KitError, run_main
from scripts.kit.fleet import POLICIES, Fleet
from scripts.kit.procs import stop_on_signals
from scripts.kit.variant import load
from scripts.serve import add_variant_args, command_text, describe


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="make serve-fleet", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_variant_args(p)
    p.add_argument("--replicas", type=int, help="how many servers of the variant (default: its FLEET_REPLICAS)")
    p.add_argument("--policy", choices=POLICIES, help="vllm-router's load-balancing policy (default: the variant's FLEET_POLICY)")
    p.add_argument("--dry-run", action="store_true", help="print every command and its placement; start nothing")
    a = p.parse_args(argv)
    v = load(a.variant, a.set)
    fleet = Fleet(v, a.replicas, a.policy)
    a.replicas, a.policy = fleet.n, fleet.policy
    print(describe(v, fleet.platform), file=sys.stderr)
    if a.dry_run:
        for r in fleet.replicas:
            print(f"# replica {r.index}\n" + command_text(r.argv, r.env))
        print("# router\n" + shlex.join(fleet.router_command()))
        return 0
    weights.require(v)
    # Ctrl-C or a TERM to make: stop the router and every replica, never leave one running.
    stop_on_signals()
    try:
        fleet.start()
        print(f"ready: {fleet.url}/v1 (model name {v.name!r}, {a.replicas} replicas, {a.policy}); "
              "Ctrl-C stops the fleet", file=sys.stderr)
        print(fleet.url, flush=True)
        rc = fleet.watch()
        raise KitError(f"vllm-router exited with code {rc}; its log: {fleet.router_log}")
    except KeyboardInterrupt:
        print("stopping the router, then the replicas", file=sys.stderr)
        return 0
    finally:
        fleet.stop()


if __name__ == "__main__":
    run_main(main)
