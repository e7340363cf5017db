"""One error type for everything a user can get wrong, and the one place it becomes an exit code.

Entry points wrap their main in `run_main`; a KitError prints `error: <message>` (no traceback)
and exits 2, anything else is a bug and keeps its traceback.
"""
import sys


class KitError(Exception):
    """A user-facing failure: bad input, missing weights, busy port, dead server."""


def run_main(main, argv=None):
    try:
        rc = main(argv)
    except KitError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(rc or 0)
