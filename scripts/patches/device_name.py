"""Device-name shim behind sitecustomize.py: make torch report the GPU name a compile cache was baked on.

Contract (../shared/notes/vllm-0.26.md §7): torch.cuda.get_device_properties is wrapped so that it
returns a proxy whose `.name` is KIT_DEVICE_NAME and which delegates every other attribute to the
real (read-only) properties object. torch.cuda.get_device_name, Inductor's CacheBase.get_system and
Dynamo's AOT SystemInfo all read the name through it, so the cache keys match the baked ones.

Guard: the name is replaced only when the running GPU has the baked compute capability
(KIT_DEVICE_CC, else the manifest in $VLLM_CACHE_ROOT, else the GPU table in scripts/kit/device.py).
Otherwise one loud stderr line refuses and the real name stays: vLLM then compiles fresh, which is
slow but correct, where a foreign cubin would not be.

Why an import hook rather than `import torch` here: sitecustomize runs in every Python process on
PYTHONPATH (make, pip, the API server, EngineCore, workers). Importing torch costs seconds and
must not happen in processes that never use it, so the patch is applied right after torch's own
import finishes, in whichever process imports it. The capability check itself waits for the first
get_device_properties call: asking CUDA earlier would initialize it in vLLM's API-server process,
which forked workers cannot survive.

    KIT_DEVICE_NAME="NVIDIA H100 PCIe" python -c "import torch; print(torch.cuda.get_device_name())"
"""
from __future__ import annotations

import json
import os
import sys

ENV_NAME, ENV_CC = "KIT_DEVICE_NAME", "KIT_DEVICE_CC"
MANIFEST = "kit-cache-manifest.json"  # same name as scripts.kit.cachekey.MANIFEST_NAME
_MARK = "_kit_device_shim"


class NamedProperties:
    """Real device properties with `.name` replaced; everything else is read from the real object."""
    __slots__ = ("_real", "name")

    def __init__(self, real, name: str):
        object.__setattr__(self, "_real", real)
        object.__setattr__(self, "name", name)

    def __getattr__(self, attr):
        return getattr(object.__getattribute__(self, "_real"), attr)

    def __setattr__(self, attr, value):
        raise AttributeError("device properties are read-only")

    def __repr__(self):
        return repr(self._real).replace(repr(self._real.name)[1:-1], self.name, 1)


def manifest_cc() -> str | None:
    """Compute capability recorded by `make bake` next to this server's cache, if there is one."""
    root = os.environ.get("VLLM_CACHE_ROOT")
    if not root:
        return None
    try:
        with open(os.path.join(root, MANIFEST)) as f:
            return (json.load(f).get("key") or {}).get("gpu", {}).get("compute_capability")
    except (OSError, ValueError, AttributeError):
        return None


def wrap(get_device_properties, baked_name: str, declared_cc: str | None = None):
    """A get_device_properties that presents `baked_name` on GPUs of the baked compute capability."""
    from scripts.kit.device import baked_cc, shim_decision
    decided: dict = {}  # (real name, major, minor) -> act; one stderr line per device kind and process

    def get_device_properties_shimmed(*args, **kwargs):
        props = get_device_properties(*args, **kwargs)
        key = (props.name, props.major, props.minor)
        if key not in decided:
            cc, _source = baked_cc(baked_name, declared_cc, manifest_cc())
            act, line = shim_decision(baked_name, cc, props.name, (props.major, props.minor))
            decided[key] = act
            if act or "REFUSING" in line:
                print(line, file=sys.stderr, flush=True)
        return NamedProperties(props, baked_name) if decided[key] else props

    setattr(get_device_properties_shimmed, _MARK, True)
    get_device_properties_shimmed.__wrapped__ = get_device_properties
    get_device_properties_shimmed.__doc__ = get_device_properties.__doc__
    return get_device_properties_shimmed


def patch_torch(torch_module) -> bool:
    """Wrap torch.cuda.get_device_properties once; clear name-keyed caches computed before. Idempotent."""
    cuda = getattr(torch_module, "cuda", None)
    name = os.environ.get(ENV_NAME)
    if cuda is None or not name or getattr(cuda.get_device_properties, _MARK, False):
        return False
    cuda.get_device_properties = wrap(cuda.get_device_properties, name, os.environ.get(ENV_CC))
    # get_system is functools.cache'd; a value computed before the patch would keep the real name.
    # Only clear it if Inductor is already loaded: importing it just for this costs seconds.
    codecache = sys.modules.get("torch._inductor.codecache")
    if codecache is not None:
        codecache.CacheBase.get_system.cache_clear()
    return True


def install() -> str:
    """Patch now if torch is already imported, else hook its import. Returns what it did (for tests)."""
    if not os.environ.get(ENV_NAME):
        return "off"
    if "torch" in sys.modules:
        return "patched" if patch_torch(sys.modules["torch"]) else "already"
    from scripts.patches.on_import import after_import
    return after_import("torch", patch_torch)
