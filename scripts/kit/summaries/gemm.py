"""Summary of `gemm` records (make gemm): each kernel's decode-step GEMMs against their byte floor, and docs/gemm.png.

A record times the kernels it was asked for, so a variant's newest figure for a kernel may come from an older
record than another kernel's. `kernels` keeps, per kernel, the newest record that timed it without error: the step's
GEMM time and share of its floor at each M, the class vLLM (or the kit) ran it with, and the GPU. The plot draws
those, one panel an architecture, each line labelled with its record's date and GPU: lines from different
sessions sit side by side there, as the docs say, and no ratio is taken between them.
"""
from __future__ import annotations

from scripts.kit.paths import ROOT

PLOT = ROOT / "docs" / "gemm.png"


def summarize(variant, records) -> dict:
    newest: dict = {}
    for rel, rec in records:  # oldest first: a later record's kernel replaces an earlier one's
        p = rec["payload"]
        steps = {}
        for s in p["step"]:
            steps.setdefault(s["kernel"], []).append({"m": s["m"], "ms": s["ms"], "floor_ms": s["floor_ms"],
                                                      "pct_of_floor": s["pct_of_floor"]})
        for kernel, rows in steps.items():
            if kernel in p["errors"]:
                continue
            newest[kernel] = {"record": rel, "utc": rec["provenance"]["utc"], "backend": p["backends"].get(kernel, ""),
                              "gpu": p["device_name"], "step": sorted(rows, key=lambda r: r["m"])}
    return {"kernels": dict(sorted(newest.items()))}


def plot_png(docs: dict) -> bytes | None:
    panels = [(name, doc["results"]["gemm"]["kernels"]) for name, doc in docs.items()
              if doc["results"].get("gemm", {}).get("kernels")]
    if not panels:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from scripts.kit.summaries import png_bytes
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 5.4), dpi=100, squeeze=False)
    for ax, (name, kernels) in zip(axes[0], panels):
        for i, (kernel, k) in enumerate(kernels.items()):
            ms = [s["m"] for s in k["step"]]
            ax.plot(ms, [s["pct_of_floor"] for s in k["step"]], marker="os^vD<>p*h"[i % 10], ms=4, lw=1.2,
                    ls="-" if kernel.startswith(("bf16", "fp8")) else "--",
                    label=f"{kernel}: {k['step'][0]['ms']:.2f} ms at M={ms[0]} ({k['gpu'].replace('NVIDIA ', '')}, "
                          f"{k['utc'][:10]})")
        ax.set_xlabel("tokens a step (M): 1 one sequence, 5 an MTP K=4 verify")
        ax.set_ylabel("% of the byte floor (the step's GEMMs, lm_head apart)", fontsize=8)
        # fp8_mm_l2 reads its weights from L2, so it can pass the DRAM floor: the axis grows to show it
        ax.set_ylim(0, max([100] + [s["pct_of_floor"] + 5 for k in kernels.values() for s in k["step"]]))
        ax.set_title(f"{name}: decode-step GEMMs per kernel", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=1)
    fig.suptitle("make gemm: each kernel's newest record (lines of different dates or GPUs are not a ratio)",
                 fontsize=9)
    return png_bytes(fig)


def artifacts(docs: dict) -> dict:
    png = plot_png(docs)
    return {PLOT: png} if png is not None else {}
