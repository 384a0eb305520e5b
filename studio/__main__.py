"""The `studio` command (and ``python -m studio``): :func:`studio.cli.main`, with Ctrl-C
during the first moments, while the command line is still being imported and before it
catches signals itself, ending as a later one does: one line, status 130, no traceback."""

import os
import sys


def run() -> int:
    """The process's entry: the command's exit status."""
    try:
        from studio.cli import main

        return main()
    except KeyboardInterrupt:  # before main's own handlers: nothing was started yet
        print("studio: interrupted; nothing was written", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(130)  # an interrupt inside an import can leave CPython to end with -2


if __name__ == "__main__":
    raise SystemExit(run())
