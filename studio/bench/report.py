"""Reporting helpers shared by the bench suites: accuracy metrics, Markdown cells, JSON output,
and the one writer of every suite's tail.

Every suite formats its tables, compares its fast paths with its fp32 reference and writes its
files the same way: :func:`suite_parser` (the options every suite takes),
:func:`measured_on` (the line that says where and when), :func:`settings_markdown` and
:func:`markdown_tail` (settings per path, plots, notes), :func:`write_plots` with
:class:`Plots` (matplotlib's Agg canvas, or a note when it is not installed), and
:func:`run_main` / :func:`finish_main` (every ``main`` once its options are parsed: counts
checked, errors reported, then command, plots, JSON, Markdown). Importing
this module does not import torch (nor matplotlib).
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from studio.errors import OutputError
from studio.files import check_writable_folder, is_stdout, write_atomic

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "Plots",
    "COMMON_HELP",
    "check_output_targets",
    "compare",
    "count_error",
    "finish_main",
    "fmt",
    "fmt_cos",
    "int_list",
    "is_ok",
    "jsonable",
    "markdown_tail",
    "measured_on",
    "name_list",
    "progress_line",
    "run_main",
    "settings_markdown",
    "suite_parser",
    "table",
    "worst",
    "write_outputs",
    "write_plots",
]


def compare(got: Tensor, ref: Tensor) -> tuple[float | None, float | None]:
    """(cosine, relative L2) of flattened tensors in float64; None where not finite."""
    import torch  # here, so that the package imports without torch

    a = got.detach().double().flatten().cpu()
    b = ref.detach().double().flatten().cpu()
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return None, None
    na, nb = a.norm().item(), b.norm().item()
    cos = float(a @ b / (na * nb)) if na > 0 and nb > 0 else float(na == nb)
    rel = float((a - b).norm().item() / nb) if nb > 0 else float((a - b).norm().item())
    return cos, rel


def worst(pairs: list[tuple[float | None, float | None]]) -> dict[str, Any]:
    """The worst (lowest cosine, highest relative L2) of several :func:`compare` results."""
    coss = [c for c, _ in pairs]
    rels = [r for _, r in pairs]
    if any(c is None for c in coss) or any(r is None for r in rels):
        return {"cosine": None, "rel_l2": None, "finite": False}
    return {"cosine": min(coss), "rel_l2": max(rels), "finite": True}


def is_ok(rec: dict[str, Any]) -> bool:
    """True for a path record that was measured (``status`` "ok")."""
    return rec.get("status") == "ok"


def fmt(value: Any, digits: int = 2) -> str:
    """A Markdown cell: "–" for None, yes/**no** for booleans, thousands separators for floats."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf"
        return f"{value:,.{digits}f}"
    return str(value)


def fmt_cos(value: float | None) -> str:
    """A cosine similarity with six decimals ("–" for None)."""
    return "–" if value is None else f"{value:.6f}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Lines of a Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def jsonable(value: Any) -> Any:
    """Replace non-finite floats by None (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def int_list(text: str, lo: int, hi: int, what: str = "values") -> tuple[int, ...]:
    """Parse "1,4,8" into a tuple of integers in lo..hi (an argparse type)."""
    try:
        values = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text}"
        ) from None
    if not values or any(v < lo or v > hi for v in values):
        raise argparse.ArgumentTypeError(f"{what} must be in {lo}..{hi}: {text}")
    return values


def float_list(text: str, option: str, example: str = "10,60") -> tuple[float, ...]:
    """Parse "10,60" into a tuple of floats; ValueError naming ``option`` otherwise."""
    try:
        return tuple(float(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise ValueError(f"{option}: {text!r} is not a list of numbers, e.g. {example}") from None


def check_output_targets(argv: Sequence[str]) -> None:
    """OutputError, before a suite runs, for a ``--json``/``--markdown`` target that could
    not be written afterwards: a folder, or under a folder that cannot take files (``-``,
    stdout, is always fine)."""
    rest = list(argv)
    for i, arg in enumerate(rest):
        option, _, value = arg.partition("=")
        if option not in ("--json", "--markdown"):
            continue
        if not value and i + 1 < len(rest):
            value = rest[i + 1]
        if not value or is_stdout(value):
            continue  # argparse reports a missing value; - is stdout
        path = Path(value)
        if path.is_dir():
            raise OutputError(f"{option} {path}: is a directory; give a file name")
        folder = path.parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent  # the folders in between are made when writing
        if not folder.is_dir():
            raise OutputError(f"{option} {path}: {folder} is a file, not a folder")
        check_writable_folder(folder, option)


def write_outputs(
    result: dict[str, Any], markdown: str, json_path: str | None, markdown_path: str | None
) -> None:
    """Write the result as strict JSON and the Markdown text where asked (folders made; each
    file whole or not at all; ``-`` writes to stdout)."""
    for target, payload in (
        (json_path, lambda: json.dumps(jsonable(result), indent=2, allow_nan=False) + "\n"),
        (markdown_path, lambda: markdown),
    ):
        if is_stdout(target):
            text = payload()
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
            sys.stdout.flush()
        elif target:
            write_atomic(target, payload(), make_parents=True)


# --- the suites' shared tail: options, header line, settings, plots, notes, main's end -----------


COMMON_HELP: dict[str, str] = {
    "device": "default: cuda if seen",
    "json": "write the full result as JSON (- for stdout)",
    "markdown": "write the tables as Markdown (- for stdout)",
    "plots": "write PNG plots (needs matplotlib)",
    "repeats": "timed runs per point (default: auto)",
    "warmup": "untimed runs per point",
}


def suite_parser(
    suite: str,
    description: str,
    helps: Mapping[str, str] | None = None,
    warmup_default: int | None = None,
    allow_abbrev: bool = True,
) -> argparse.ArgumentParser:
    """The parser of ``studio bench --suite SUITE`` with the options every suite takes:
    ``--device --json --markdown --plots --repeats --warmup`` (``helps`` words them for the
    suite, by option name, over :data:`COMMON_HELP`); the suite adds its own."""
    p = argparse.ArgumentParser(
        prog=f"studio bench --suite {suite}", description=description, allow_abbrev=allow_abbrev
    )
    words = {**COMMON_HELP, **(helps or {})}
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help=words["device"])
    p.add_argument("--json", metavar="OUT", help=words["json"])
    p.add_argument("--markdown", metavar="OUT", help=words["markdown"])
    p.add_argument("--plots", metavar="DIR", help=words["plots"])
    p.add_argument("--repeats", type=int, default=None, help=words["repeats"])
    p.add_argument("--warmup", type=int, default=warmup_default, help=words["warmup"])
    return p


def count_error(args: argparse.Namespace) -> str | None:
    """What is wrong with ``--repeats`` (>= 1) or ``--warmup`` (>= 0) when given, else None."""
    for name, least in (("repeats", 1), ("warmup", 0)):
        value = getattr(args, name, None)
        if value is not None and value < least:
            return f"--{name} must be >= {least}"
    return None


def measured_on(facts: Mapping[str, Any]) -> str:
    """The line that says where and when, from a suite's facts
    (:func:`studio.bench.timing.device_facts` and the run's date, commit and command):
    ``Measured on **GPU** (capability 9.0), torch …, CUDA …, date, commit `…`, command `…`.``,
    capability and CUDA only where there are some."""
    where = f"Measured on **{facts.get('name')}**"
    if facts.get("capability"):
        where += f" (capability {facts['capability']})"
    parts = [where, f"torch {facts.get('torch')}"]
    if facts.get("cuda_runtime"):
        parts.append(f"CUDA {facts['cuda_runtime']}")
    parts += [str(facts.get("date")), f"commit `{facts.get('commit')}`"]
    if facts.get("command"):
        parts.append(f"command `{facts['command']}`")
    return ", ".join(parts) + "."


def settings_markdown(
    paths: Mapping[str, Mapping[str, Any]], skip: Sequence[str] = ("name",)
) -> list[str]:
    """Lines of the "Settings per path" section: each path's ``settings`` as ``key=value``
    (leaving out ``skip``)."""
    rows = []
    for name, rec in paths.items():
        s = rec.get("settings", {})
        text = ", ".join(f"{k}={v}" for k, v in s.items() if k not in skip)
        rows.append([name, text.replace("|", "/")])
    return ["", "### Settings per path", "", *table(["path", "settings"], rows)]


def markdown_tail(result: Mapping[str, Any], notes: Sequence[str] | None = None) -> list[str]:
    """The last lines of a suite's Markdown: its plots (images, or why none were drawn), then
    ``notes`` (default ``result["notes"]``) as a list."""
    out: list[str] = []
    plots = result.get("plots")
    if plots:
        out.append("")
        if plots.get("files"):
            out += [f"![{Path(p).stem}]({Path(p).name})" for p in plots["files"]]
        else:
            out.append(f"Plots: {plots.get('skipped')}")
    notes = list(result.get("notes") or []) if notes is None else list(notes)
    if notes:
        out += ["", *(f"- {n}" for n in notes)]
    return out


class Plots:
    """The figures of one suite's plots: :meth:`figure` makes one on matplotlib's Agg canvas
    (the object-oriented API: no display, no pyplot state), :meth:`save` writes it as a PNG
    in the folder and lists the file. Made by :func:`write_plots`."""

    def __init__(self, folder: Path, figure: Callable[..., Any], canvas: Callable[..., Any]):
        self.folder = folder
        self.files: list[str] = []
        self._figure, self._canvas = figure, canvas

    def figure(self, figsize: tuple[float, float] = (8, 5)) -> Any:
        """A new matplotlib Figure of ``figsize`` inches."""
        fig = self._figure(figsize=figsize)
        self._canvas(fig)
        return fig

    def save(self, fig: Any, name: str) -> None:
        """Lay ``fig`` out and write it as ``folder/name`` (120 dpi)."""
        fig.tight_layout()
        path = self.folder / name
        fig.savefig(path, dpi=120)
        self.files.append(str(path))


def write_plots(
    result: dict[str, Any], folder: str | Path, draw: Callable[[Plots], None]
) -> dict[str, Any]:
    """Run ``draw(plots)`` with a :class:`Plots` writing into ``folder`` (made if need be).

    Returns ``{"files": [...]}`` or, without matplotlib (not a dependency), ``{"files": [],
    "skipped": reason}`` with nothing drawn; also stored in ``result["plots"]``."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        info: dict[str, Any] = {"files": [], "skipped": f"matplotlib is not installed ({e})"}
    else:
        out_dir = Path(folder)
        out_dir.mkdir(parents=True, exist_ok=True)
        plots = Plots(out_dir, Figure, FigureCanvasAgg)
        draw(plots)
        info = {"files": plots.files}
    result["plots"] = info
    return info


def run_main(
    suite: str,
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    run: Callable[[argparse.Namespace, Callable[[str], None]], dict[str, Any]],
    to_markdown: Callable[[dict[str, Any]], str],
    save_plots: Callable[[dict[str, Any], str], dict[str, Any]] | None = None,
    errors: tuple[type[BaseException], ...] = (ValueError,),
) -> int:
    """A suite's whole ``main(argv)``: ``argv`` parsed (``sys.argv`` when None; argparse exits
    2 on a bad option), ``--repeats``/``--warmup`` checked (:func:`count_error`), the result
    from ``run(args, progress)`` (``progress`` prints a line on stderr, above the suite's
    :class:`~studio.progress.StageProgress` stage, which counts those lines), then
    :func:`finish_main`. Returns 0, or 2 with a line on stderr for a bad count or one of
    ``errors`` raised by ``run``."""
    args = parser.parse_args(argv)
    problem = count_error(args)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    from studio.progress import StageProgress

    stage = f"measuring: {suite}"
    try:
        with StageProgress(sys.stderr) as progress:
            said = [0]

            def say(line: str) -> None:
                progress.note(line)
                said[0] += 1
                progress(stage, said[0], 0)

            progress(stage, 0, 0)
            result = run(args, say)
    except errors as e:
        print(f"studio bench {suite}: {e}", file=sys.stderr)
        return 2
    return finish_main(suite, result, args, argv, to_markdown, save_plots)


def args_for(fn: Callable[..., Any], args: argparse.Namespace, **given: Any) -> dict[str, Any]:
    """The keyword arguments of ``fn`` that the command line holds under the same names, plus
    ``given`` (what the suite derives itself): a suite's options forwarded without restating
    each one."""
    params = inspect.signature(fn).parameters
    taken = {name: getattr(args, name) for name in params if hasattr(args, name)}
    return {**taken, **given}


def name_list(text: str | None) -> list[str] | None:
    """``"a, b"`` -> ``["a", "b"]`` (an option such as ``--paths A,B``); None when not given."""
    return [s.strip() for s in text.split(",") if s.strip()] if text else None


def progress_line(line: str) -> None:
    """A suite's progress: one line on stderr, flushed (stdout carries the Markdown)."""
    print(line, file=sys.stderr, flush=True)


def finish_main(
    suite: str,
    result: dict[str, Any],
    args: argparse.Namespace,
    argv: Sequence[str] | None,
    to_markdown: Callable[[dict[str, Any]], str],
    save_plots: Callable[[dict[str, Any], str], dict[str, Any]] | None = None,
) -> int:
    """The end of a suite's ``main(argv)`` once its result is in: the command line into
    ``result["facts"]`` (``command``, ``argv``; ``sys.argv`` when ``argv`` is None), the plots
    where ``args.plots`` asks (a line on stderr when skipped), private keys (a leading ``_``:
    series kept for the plots) dropped, then the Markdown written with the JSON where
    ``args.json`` / ``args.markdown`` ask, and printed; returns 0."""
    given = list(sys.argv[1:] if argv is None else argv)
    result["facts"]["command"] = " ".join([f"studio bench --suite {suite}", *given])
    result["facts"]["argv"] = given
    if save_plots is not None and getattr(args, "plots", None):
        info = save_plots(result, args.plots)
        if info.get("skipped"):
            print(f"plots skipped: {info['skipped']}", file=sys.stderr)
    for key in [k for k in result if k.startswith("_")]:
        del result[key]
    text = to_markdown(result)
    write_outputs(result, text, args.json, args.markdown)
    if not is_stdout(args.markdown):  # printed already; beside JSON on stdout, on stderr
        print(text, file=sys.stderr if is_stdout(args.json) else sys.stdout)
    return 0
