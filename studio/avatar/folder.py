"""A registered avatar's folder, as far as the rest of the studio needs to know it, without
loading anything heavy: its marker file, and how to reopen one from the image it came from."""

from __future__ import annotations

import json
import os
from pathlib import Path

from studio.errors import InputError

AVATAR_META = "meta.json"  # what marks a registered avatar folder


def avatar_source(path: str | os.PathLike[str]) -> tuple[str, str | None]:
    """(image path, cache folder or None) for an avatar image or a registered avatar folder.

    A registered folder (it holds :data:`AVATAR_META`) is reopened from its source image with
    the folder's parent as the cache, so nothing is recomputed.
    """
    p = Path(path)
    if not p.is_dir():
        return str(p), None
    try:
        meta = json.loads((p / AVATAR_META).read_text())
        source = Path(str(meta["source"]))
    except (OSError, ValueError, KeyError, TypeError):
        raise InputError(
            f"{p} is not a registered avatar folder (no readable {AVATAR_META}); "
            "open the face photo or video instead"
        ) from None
    if not source.is_file():
        raise InputError(
            f"the avatar folder {p.name} was registered from {source}, which is gone; "
            "open a face photo or video instead"
        )
    return str(source), str(p.parent)
