"""``studio bench``: measured suites with the published reference figures beside ours.

Suites live in their own modules (:mod:`studio.bench.lmdm`, :mod:`studio.bench.render`,
:mod:`studio.bench.pipeline`: the clip end to end, :mod:`studio.bench.kinematics`,
:mod:`studio.bench.streaming`: the live engine, :mod:`studio.bench.warmstart`: new
processes against the caches on disk, and a batch), each with
``main(argv) -> int`` that parses its own options (``--device --json --markdown --plots
--repeats --warmup`` in common) and writes its JSON and Markdown. They share the timing
helpers of :mod:`studio.bench.timing` (warm-up, CUDA events on a GPU, ``perf_counter`` on the
CPU, the median of repeats, rotating input sets) and the report helpers of
:mod:`studio.bench.report`, with the one writer of the suites' tails (common options,
settings, plots, notes, the end of ``main``). The render suite times the renderer's own
engines; CUDA graphs are the runtime's.

:data:`SUITES` is the dispatch table (name -> module); ``--suite all`` runs every suite in
turn and writes one JSON holding each suite's result and one Markdown concatenating them
(and, beside that JSON, each suite's own ``bench_NAME.json`` / ``bench_NAME.md`` as it ends).
This package imports no torch: a suite's module is imported only when it runs.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import shlex
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from studio.bench.report import check_output_targets, suite_parser, write_outputs
from studio.files import is_stdout

__all__ = ["ALL", "SUITES", "build_all_parser", "main", "run_all", "suite_main"]

SUITES: dict[str, str] = {
    "lmdm": "studio.bench.lmdm",
    "render": "studio.bench.render",
    "pipeline": "studio.bench.pipeline",
    "kinematics": "studio.bench.kinematics",
    "streaming": "studio.bench.streaming",
    "warmstart": "studio.bench.warmstart",
}
ALL = "all"
ALL_HELP = {  # the common options, as --suite all reads them
    "json": "write all results as one JSON",
    "markdown": "write all tables as one Markdown file",
    "plots": "every suite's PNG plots (needs matplotlib)",
    "repeats": "passed to every suite",
    "warmup": "passed to every suite",
}
DEFAULT_SUITE = "lmdm"
USAGE = (
    f"usage: studio bench --suite {{{','.join((*SUITES, ALL))}}} [suite options]; "
    "`studio bench --suite NAME --help` lists a suite's options"
)


def suite_main(name: str) -> Callable[[list[str]], int]:
    """The ``main(argv)`` of suite ``name`` (its module is imported here)."""
    return importlib.import_module(SUITES[name]).main


def _accepts(name: str, option: str) -> bool:
    """Whether suite ``name``'s parser (``build_parser()``, when it has one) knows ``option``."""
    build = getattr(importlib.import_module(SUITES[name]), "build_parser", None)
    if build is None:
        return False
    return option in build()._option_string_actions


def main(argv: Sequence[str]) -> int:
    """``studio bench --suite NAME [options]``: NAME's ``main`` parses the rest (2: bad usage)."""
    rest = list(argv)
    suite = DEFAULT_SUITE
    given = False
    for i, arg in enumerate(rest):
        if arg == "--suite" or arg.startswith("--suite="):
            if arg == "--suite":
                if i + 1 >= len(rest):
                    print(f"studio bench: error: --suite needs a value\n{USAGE}", file=sys.stderr)
                    return 2
                suite = rest[i + 1]
                del rest[i : i + 2]
            else:
                suite = arg.split("=", 1)[1]
                del rest[i]
            given = True
            break
    if not given and rest[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    check_output_targets(rest)
    if suite == ALL:
        return run_all(rest)
    if suite not in SUITES:
        print(
            f"studio bench: error: --suite {suite}: expected one of {', '.join((*SUITES, ALL))}",
            file=sys.stderr,
        )
        return 2
    return suite_main(suite)(rest)


def build_all_parser() -> argparse.ArgumentParser:
    """Options of ``--suite all``: common ones (passed to every suite) and per-suite extras."""
    desc = "Every suite in turn; one JSON with each suite's result, one Markdown."
    p = suite_parser(ALL, desc, ALL_HELP)
    p.add_argument("--reduced", action="store_true", help="passed to the suites that have it")
    p.add_argument(
        "--suites",
        default=",".join(SUITES),
        metavar="A,B",
        help=f"which suites, in order (default {','.join(SUITES)})",
    )
    for name in SUITES:
        p.add_argument(
            f"--{name}-args",
            default="",
            metavar="'ARGS'",
            help=f"more options for the {name} suite, one string: --{name}-args='--a 1 --b'",
        )
    return p


def _log_traceback(name: str, e: BaseException) -> str:
    """The traceback of suite ``name``'s failure in a log file (never on stderr): where."""
    from studio.paths import write_log

    text = f"studio bench --suite {name} failed\n" + "".join(traceback.format_exception(e))
    try:
        return f"details in {write_log('studio-bench', text)}"
    except OSError as err:
        return f"no log file could be written ({err.strerror or err})"


def _release_device_memory() -> None:
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_all(argv: Sequence[str]) -> int:
    """Run the chosen suites one after the other; 0 when all succeeded, else the first failure's
    status (the others still run and are written)."""
    args = build_all_parser().parse_args(list(argv))
    names = [s.strip() for s in args.suites.split(",") if s.strip()]
    unknown = [n for n in names if n not in SUITES]
    if not names or unknown:
        print(
            f"studio bench --suite all: error: --suites: unknown {unknown}; "
            f"known: {', '.join(SUITES)}",
            file=sys.stderr,
        )
        return 2
    common: list[str] = []
    if args.device:
        common += ["--device", args.device]
    if args.repeats is not None:
        common += ["--repeats", str(args.repeats)]
    if args.warmup is not None:
        common += ["--warmup", str(args.warmup)]
    if args.plots:
        common += ["--plots", args.plots]
    from studio.bench.timing import git_commit, utc_now  # torch: the suites need it anyway

    started = utc_now()
    combined: dict[str, Any] = {
        "suite": ALL,
        "facts": {
            "date": started,
            "commit": git_commit(),
            "command": " ".join(["studio bench --suite all", *argv]),
            "argv": list(argv),
        },
        "runs": {},
        "suites": {},
    }
    texts: list[str] = []
    status = 0
    with tempfile.TemporaryDirectory(prefix="studio-bench-all-") as tmp:
        # Each suite's own files go beside the combined JSON (bench_NAME.json/.md), so that a
        # run cut short still leaves the suites it finished; without --json, a temporary folder.
        folder = Path(args.json).parent if args.json and not is_stdout(args.json) else Path(tmp)
        for name in names:
            js, md = folder / f"bench_{name}.json", folder / f"bench_{name}.md"
            for stale in (js, md):
                stale.unlink(missing_ok=True)
            sub = list(common)
            t0 = time.perf_counter()
            reason = None
            try:  # importing a suite can fail too (a package missing on this machine)
                if args.reduced and _accepts(name, "--reduced"):
                    sub.append("--reduced")
                sub += shlex.split(getattr(args, f"{name}_args"))
                rc = int(suite_main(name)([*sub, "--json", str(js), "--markdown", str(md)]) or 0)
            except SystemExit as e:  # argparse rejected an option of the suite
                rc = e.code if isinstance(e.code, int) else 2
                reason = f"exited with status {rc} (bad options?)"
            except Exception as e:  # one failing suite does not stop the others
                rc, reason = 1, f"{type(e).__name__}: {e}"
                print(f"[all] {name}: {reason} — {_log_traceback(name, e)}", file=sys.stderr)
            wall = time.perf_counter() - t0
            _release_device_memory()
            combined["runs"][name] = {"rc": rc, "wall_s": round(wall, 1), "argv": sub}
            if rc == 0 and js.is_file():
                combined["suites"][name] = json.loads(js.read_text())
                texts.append(md.read_text() if md.is_file() else "")
            else:
                why = reason or f"exited with status {rc}"
                combined["suites"][name] = {"suite": name, "status": "error", "reason": why}
                texts.append(f"## {name}\n\nNot measured: {why}.\n")
                status = status or rc or 1
            print(f"[all] {name}: {'ok' if rc == 0 else 'failed'} in {wall:.1f} s", file=sys.stderr)
    head = [
        "# studio bench --suite all",
        "",
        f"{started}; command `{combined['facts']['command']}`; suites "
        + ", ".join(f"{n} ({combined['runs'][n]['wall_s']} s)" for n in names)
        + ".",
        "",
    ]
    text = "\n".join(head) + "\n" + "\n".join(texts)
    write_outputs(combined, text, args.json, args.markdown)
    return status
