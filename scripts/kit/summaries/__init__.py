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
