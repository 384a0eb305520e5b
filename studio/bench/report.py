"""Reporting helpers shared by the bench suites: accuracy metrics, Markdown cells, JSON output.

Moved here from :mod:`studio.bench.lmdm` so that every suite formats its tables, compares its
fast paths with its fp32 reference and writes its files the same way. Importing this module
does not import torch.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from studio.errors import OutputError
from studio.files import check_writable_folder, write_atomic

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "compare",
    "fmt",
    "fmt_cos",
    "int_list",
    "is_ok",
    "jsonable",
    "table",
    "worst",
    "check_output_targets",
    "write_outputs",
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


def check_output_targets(argv: Sequence[str]) -> None:
    """OutputError, before a suite runs, for a ``--json``/``--markdown`` target that could
    not be written afterwards: a folder, or under a folder that cannot take files."""
    rest = list(argv)
    for i, arg in enumerate(rest):
        option, _, value = arg.partition("=")
        if option not in ("--json", "--markdown"):
            continue
        if not value and i + 1 < len(rest):
            value = rest[i + 1]
        if not value:
            continue  # argparse reports the missing value
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
    file whole or not at all)."""
    for target, payload in (
        (json_path, lambda: json.dumps(jsonable(result), indent=2, allow_nan=False) + "\n"),
        (markdown_path, lambda: markdown),
    ):
        if target:
            write_atomic(target, payload(), make_parents=True)
