"""Per-kind summaries of records (`make report`): scripts/kit/summaries/<kind>.py."""


def png_bytes(fig) -> bytes:
    """A matplotlib figure as PNG bytes that depend on the numbers only (no Software/creation
    metadata), so a plot redrawn from the same records is byte-identical; closes the figure."""
    import io
    import matplotlib.pyplot as plt
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def save_plot(render, path):
    """Write render()'s PNG bytes to path atomically; None when there is nothing to draw, or no
    matplotlib (the GPU host's vLLM site has none: `make report` redraws it where it is)."""
    import sys
    from scripts.kit.paths import atomic_write
    try:
        data = render()
    except ModuleNotFoundError as e:
        print(f"plot skipped: {e}", file=sys.stderr)
        return None
    if data is None:
        return None
    atomic_write(path, data)
    return path
