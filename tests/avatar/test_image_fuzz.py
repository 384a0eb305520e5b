"""Seeded fuzz of avatar image reading: truncated and bit-flipped PNG/JPEG/WebP/BMP/TIFF files are
read as HxWx3 uint8 or refused with a one-line InputError naming the file, never anything else;
a few of the refusals go through `studio render` (exit 2, one line, no output file)."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from studio.avatar.image import load_image
from studio.errors import InputError

SEED = 17
FORMATS = {  # suffix -> Pillow save arguments
    "png": {"format": "PNG"},
    "jpg": {"format": "JPEG", "quality": 90, "exif": b""},  # exif filled in by _encoded
    "webp": {"format": "WEBP", "quality": 80},
    "bmp": {"format": "BMP"},
    "tif": {"format": "TIFF", "compression": "tiff_lzw"},
}
TRUNCATED, FLIPPED, BOTH = 20, 30, 10  # cases per format and mutation: 300 in all


def drawn_image(h: int = 96, w: int = 128) -> np.ndarray:
    """A colour gradient with a disc: every channel varies, edges and flat areas."""
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([x * 255 // w, y * 255 // h, (x + y) * 255 // (w + h)], axis=2)
    rgb[(y - h / 2) ** 2 + (x - w / 2) ** 2 < (h / 4) ** 2] = (230, 180, 150)
    return rgb.astype(np.uint8)


def _encoded(suffix: str) -> bytes:
    args = dict(FORMATS[suffix])
    if "exif" in args:  # a JPEG with an EXIF orientation, so damaged EXIF is fuzzed too
        exif = Image.Exif()
        exif[0x0112] = 6
        args["exif"] = exif.tobytes()
    buf = io.BytesIO()
    Image.fromarray(drawn_image()).save(buf, **args)
    return buf.getvalue()


def _flip(data: bytes, rng: np.random.Generator) -> bytes:
    """1 to 8 bits flipped, half of them in the first 128 bytes (the headers)."""
    out = bytearray(data)
    for _ in range(int(rng.integers(1, 9))):
        end = min(len(out), 128) if rng.random() < 0.5 else len(out)
        out[int(rng.integers(0, end))] ^= 1 << int(rng.integers(0, 8))
    return bytes(out)


def _cut(data: bytes, rng: np.random.Generator) -> bytes:
    """The file cut short: in its headers or anywhere."""
    end = min(len(data), 96) if rng.random() < 0.3 else len(data)
    return data[: int(rng.integers(1, end))]


def fuzz_cases(seed: int = SEED) -> Iterator[tuple[str, bytes]]:
    """(file name, bytes) of every damaged file, the same for a seed."""
    rng = np.random.default_rng(seed)
    for suffix in FORMATS:
        data = _encoded(suffix)
        mutations = [("cut", _cut)] * TRUNCATED + [("flip", _flip)] * FLIPPED
        mutations += [("both", lambda d, r: _cut(_flip(d, r), r))] * BOTH
        for i, (kind, mutate) in enumerate(mutations):
            yield f"{kind}{i:02d}.{suffix}", mutate(data, rng)


def outcome(path: Path) -> str:
    """ "read", "refused", or what went wrong (a crash, a bad array, a bad message)."""
    try:
        rgb = load_image(path)
    except InputError as e:
        msg = str(e)
        if "\n" in msg or str(path) not in msg:
            return f"bad message: {msg!r}"
        return "refused"
    except Exception as e:  # noqa: BLE001 - what the fuzz looks for
        return f"crash: {type(e).__name__}: {e}"
    if not (
        isinstance(rgb, np.ndarray)
        and rgb.dtype == np.uint8
        and rgb.ndim == 3
        and rgb.shape[2] == 3
        and min(rgb.shape[:2]) > 0
    ):
        return f"bad array: {getattr(rgb, 'shape', rgb)}"
    return "read"


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, str]:
    d = tmp_path_factory.mktemp("fuzz")
    results = {}
    for name, data in fuzz_cases():
        path = d / name
        path.write_bytes(data)
        results[path] = outcome(path)
    return results


def test_damaged_images_are_read_or_refused_in_one_line(fuzzed: dict[Path, str]) -> None:
    assert len(fuzzed) == len(FORMATS) * (TRUNCATED + FLIPPED + BOTH)
    bad = {p.name: r for p, r in fuzzed.items() if r not in ("read", "refused")}
    assert bad == {}
    kinds = {(p.suffix, r) for p, r in fuzzed.items()}
    for suffix in FORMATS:  # every format sees both outcomes: the fuzz reaches the decoders
        assert {(f".{suffix}", "read"), (f".{suffix}", "refused")} <= kinds


def test_the_intact_files_are_read() -> None:
    for suffix in FORMATS:
        rgb = load_image(Path(f"x.{suffix}"), _encoded(suffix))
        assert rgb.shape == ((128, 96, 3) if suffix == "jpg" else (96, 128, 3))  # EXIF turned


def _message(path: Path) -> str:
    with pytest.raises(InputError) as e:
        load_image(path)
    return str(e.value)


def _pytorch_tree(root: Path) -> Path:
    """A checkpoint folder whose files are all there (empty): the CLI gets to the avatar."""
    from studio.models.checkpoints import LAYOUT_DIRS, REQUIREMENTS

    for req in REQUIREMENTS:
        for name in req.files.get("pytorch", ())[:1]:
            path = root / LAYOUT_DIRS["pytorch"] / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"")
    return root


def test_refused_images_stop_studio_render_with_one_line(
    fuzzed: dict[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from studio.cli import main

    tree = _pytorch_tree(tmp_path / "ckpt")
    out = tmp_path / "out.mp4"
    refused = {p.suffix: p for p, r in fuzzed.items() if r == "refused"}  # one per format
    for path in refused.values():
        argv = ["render", "--checkpoints", str(tree), "--avatar", str(path), "--out", str(out)]
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
        err = capsys.readouterr().err
        assert code == 2, err
        assert len(err.strip().splitlines()) == 1 and str(path) in err, err
        assert not out.exists()
    # and once as a user runs it, in a process of its own: nothing but the line on stderr, even
    # for a TIFF that libtiff (which prints on stderr unless told not to) fails to decode
    tiffs = [p for p, r in fuzzed.items() if r == "refused" and p.suffix == ".tif"]
    path = next((p for p in tiffs if "decoder error" in _message(p)), tiffs[0])
    argv = ["render", "--checkpoints", str(tree), "--avatar", str(path), "--out", str(out)]
    run = subprocess.run(
        [sys.executable, "-m", "studio", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and str(path) in run.stderr, run.stderr
    assert not out.exists()
