"""Repository paths. Absolute, because vLLM's compile-cache key contains the model path string:
bake and serve must see the same one (the Dockerfile fixes the root at /opt/kit)."""
import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "experiments"
SCHEMAS = ROOT / "schemas"
WEIGHTS = ROOT / "weights"
RESULTS = ROOT / "results"
EVAL = ROOT / "eval"
GOLDEN = ROOT / "tests" / "golden"


def rel(p) -> str:
    """How records and messages name a file: relative to the repo root when inside it, else as given."""
    try:
        return str(Path(p).resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def atomic_write(path: Path, data: bytes | str) -> None:
    """Replace a derived file (summary, README, plot) so a reader never sees half of it. Records are
    never replaced: they go through record.write_record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    os.replace(tmp, path)


def sha256_file(path) -> str:
    """sha256 of a file's bytes, read in blocks (checkpoints and wheels run to GBs)."""
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()
