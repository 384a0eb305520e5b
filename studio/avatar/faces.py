"""ONNX Runtime runners for the three face models of avatar registration (§3.5, §5.2).

Interfaces of the released files (checked against public users of the same files; the ONNX
graphs themselves are not shipped with this project):

* ``ditto_pytorch/aux_models/det_10g.onnx``: InsightFace buffalo_l SCRFD-10G. One input
  ``input.1`` float32 [1, 3, ?, ?] (dynamic side), nine 2-D outputs in this order: scores at
  strides 8/16/32 (``448``, ``471``, ``494``, [N, 1]), box distances (``451``, ``474``, ``497``,
  [N, 4]) and 5-point distances (``454``, ``477``, ``500``, [N, 10]), N = (side / stride)^2 * 2.
  The file declares N for a 640 px input (12800/3200/800); at 512 px, as used here, ONNX Runtime
  returns 8192/2048/512 rows. ``ditto_onnx/insightface_det.onnx`` (Ditto's re-export) names them
  ``image`` -> ``scores1..3``, ``boxes1..3``, ``kps1..3``.
* ``2d106det.onnx``: InsightFace 106-point model, ``data`` [1, 3, 192, 192] -> ``fc1`` [1, 212]
  (106 (x, y) pairs in [-1, 1] of the crop).
* ``landmark203.onnx``: LivePortrait's ``landmark.onnx``, ``input`` [1, 3, 224, 224] RGB 0..1 ->
  three outputs from three heads on a ConvNeXt trunk: ``output`` [1, 214], ``853`` [1, 262] and
  ``856`` [1, 406] (names and widths as a public onnx-to-pytorch conversion of the file shows
  them: heads ``fc_coeff`` 214, ``fc_lmk`` 262, ``fc_pts`` 406). The points are output
  **index 2** (LivePortrait's landmark runner and Ditto's original-model wrapper read
  ``outputs[2]``), 203 (x, y) pairs as fractions of the 224 px crop; the runner relies only on
  that index and its 406 values, not on the names. Ditto's re-export has one output
  ``landmarks`` [1, 406].

Preprocessing is Ditto's: the detector gets a 512 px letterbox (aspect kept, top-left, zero
pad) as ``(pixel - 127.5) / 128`` and the 106 model raw 0..255 values, both with R and B
swapped. Ditto hands these models an RGB frame with ``swapRB`` on, so they really see **BGR**
(§3.5 / pitfall 2); this port copies that on purpose, for crops that match the reference.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from studio.avatar.crop import (
    CropGeometry,
    crop_geometry,
    crop_image,
    invert_affine,
    resize_bilinear,
    scale_center_matrix,
    transform_points,
    warp_affine,
)
from studio.errors import InputError
from studio.models.checkpoints import S_DET, S_LMK106, S_LMK203
from studio.runtime import onnx_sessions

__all__ = [
    "DET10G_INPUT",
    "DET10G_OUTPUTS",
    "DET_REEXPORT_INPUT",
    "DET_REEXPORT_OUTPUTS",
    "LMK106_INPUT",
    "LMK106_OUTPUT",
    "LMK203_INPUT",
    "LMK203_OUTPUTS",
    "LMK203_REEXPORT_OUTPUT",
    "Detections",
    "FaceDetector",
    "Landmark106",
    "Landmark203",
    "nms",
    "providers_for",
]

# --- the released interfaces ---------------------------------------------------------------------

DET10G_INPUT = "input.1"
DET10G_OUTPUTS = ("448", "471", "494", "451", "474", "497", "454", "477", "500")
DET_REEXPORT_INPUT = "image"
DET_REEXPORT_OUTPUTS = tuple(f"{k}{i}" for k in ("scores", "boxes", "kps") for i in (1, 2, 3))
DET_SIZE = 512
DET_STRIDES = (8, 16, 32)
DET_ANCHORS = 2
DET_WIDTHS = (1, 4, 10)  # scores, box distances, keypoint distances
DET_THRESH = 0.5
NMS_THRESH = 0.4
DET_MEAN = 127.5
DET_STD = 128.0

LMK106_INPUT = "data"
LMK106_OUTPUT = "fc1"
LMK106_SIZE = 192
LMK106_POINTS = 106
LMK106_BOX_SCALE = 1.5  # crop side = 1.5 x the longer box side

LMK203_INPUT = "input"
LMK203_OUTPUTS = ("output", "853", "856")  # [1, 214], [1, 262], [1, 406]
LMK203_PTS_INDEX = 2
LMK203_REEXPORT_OUTPUT = "landmarks"
LMK203_SIZE = 224
LMK203_POINTS = 203
LMK203_SCALE = 1.5
LMK203_VY = -0.1


# --- sessions ------------------------------------------------------------------------------------


_NO_ONNXRUNTIME = (
    "avatar registration needs onnxruntime for the face models; install it with "
    "pip install 'talkinghead-studio[onnx]'"
)


def providers_for(device: Any = "cpu") -> tuple[str, ...]:
    """ONNX Runtime providers for a torch device: CUDA first when asked for and available."""
    return onnx_sessions.providers_for(device, _NO_ONNXRUNTIME)


def _session(path: Path, stage: str, providers: Sequence[str] | None) -> Any:
    p = Path(path).expanduser()
    if not p.is_file():
        raise InputError(f"{p} does not exist (stage: {stage}): check the checkpoint folder")
    chosen = tuple(providers) if providers is not None else providers_for("cpu")
    unreadable = (
        f"{{path}} could not be loaded by ONNX Runtime ({{reason}}) (stage: {stage}): it is "
        "not a readable ONNX file; re-download it"
    )
    return onnx_sessions.open_session(p, chosen, _NO_ONNXRUNTIME, unreadable)


def _dims(arg: Any) -> list[Any]:
    return list(arg.shape) if arg.shape is not None else []


class _Runner:
    """A session plus the file name and stage every error message carries.

    The constructor checks what every face model has, one NCHW float input named one of
    ``input_names`` (``side`` x ``side`` unless None), then hands the outputs to
    :meth:`_check_outputs`; ``expected`` (what a fitting file has) ends every error message.
    """

    what = "model"
    stage = ""
    input_names: tuple[str, ...] = ()
    side: int | None = None
    expected = ""

    def __init__(
        self, path: str | os.PathLike[str], providers: Sequence[str] | None = None
    ) -> None:
        self.path = Path(path).expanduser()
        self.session = _session(self.path, self.stage, providers)
        self.input_name = self._check_input()
        self._check_outputs(self.session.get_outputs())

    def _check_outputs(self, outputs: Sequence[Any]) -> None:
        """Check the session's outputs and keep the names the runner reads."""
        raise NotImplementedError

    def _fail(self, found: str, expected: str | None = None) -> InputError:
        return InputError(
            f"{self.path} does not fit the {self.what} (stage: {self.stage}): {found}; "
            f"expected {expected or self.expected}"
        )

    def _check_input(self) -> str:
        """The single NCHW float input; its name must be one of ``input_names``."""
        inputs = self.session.get_inputs()
        if len(inputs) != 1:
            listed = ", ".join(f"'{i.name}'" for i in inputs) or "none"
            raise self._fail(f"it has inputs {listed}")
        inp = inputs[0]
        dims = _dims(inp)
        if inp.name not in self.input_names:
            raise self._fail(f"its input is named '{inp.name}'")
        if inp.type != "tensor(float)" or len(dims) != 4:
            raise self._fail(f"input '{inp.name}' is {inp.type} shaped {dims}")
        b, c, h, w = dims
        bad = (isinstance(b, int) and b != 1) or (isinstance(c, int) and c != 3)
        if self.side is not None:
            bad |= any(isinstance(d, int) and d != self.side for d in (h, w))
        if bad:
            raise self._fail(f"input '{inp.name}' is shaped {dims}")
        return inp.name

    def _check_points(self, out: Any, points: int, *, exact: bool, what: str = "output") -> str:
        """The name of ``out`` once it is a float output of ``2 * points`` values per image
        (at least that many unless ``exact``); dynamic dimensions pass."""
        dims = _dims(out)
        size = int(np.prod(dims[1:])) if all(isinstance(d, int) for d in dims[1:]) else None
        want = 2 * points
        fits = size is None or (size == want if exact else size >= want)
        if out.type != "tensor(float)" or not fits:
            raise self._fail(f"{what} '{out.name}' is {out.type} shaped {dims}")
        return out.name

    @property
    def providers(self) -> list[str]:
        return list(self.session.get_providers())


# --- detection -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Detections:
    """Faces after NMS, best score first: boxes [N, 4] (x1, y1, x2, y2), scores [N], kps."""

    boxes: np.ndarray
    scores: np.ndarray
    kps: np.ndarray  # [N, 5, 2]

    def __len__(self) -> int:
        return len(self.scores)

    @property
    def areas(self) -> np.ndarray:
        return (self.boxes[:, 2] - self.boxes[:, 0]) * (self.boxes[:, 3] - self.boxes[:, 1])

    def by_area(self) -> np.ndarray:
        """Indices from the largest box to the smallest (Ditto takes the largest)."""
        return np.argsort(-self.areas, kind="stable")


def nms(boxes: np.ndarray, scores: np.ndarray, thresh: float = NMS_THRESH) -> np.ndarray:
    """Greedy NMS as InsightFace does it (areas with +1): indices kept, best score first."""
    x1, y1, x2, y2 = (boxes[:, i].astype(np.float64) for i in range(4))
    areas = (x2 - x1 + 1) * (y2 - y1 + 1)
    order = np.argsort(-scores, kind="stable")
    keep = []
    while order.size:
        i = order[0]
        keep.append(i)
        rest = order[1:]
        w = np.maximum(0.0, np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]) + 1)
        h = np.maximum(0.0, np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]) + 1)
        inter = w * h
        iou = inter / (areas[i] + areas[rest] - inter)
        order = rest[iou <= thresh]
    return np.asarray(keep, dtype=np.int64)


@functools.lru_cache(maxsize=8)
def _anchor_centres(side: int, stride: int) -> np.ndarray:
    """(x, y) of every anchor at ``stride``, cell-major, each cell's centre twice in a row."""
    n = side // stride
    ys, xs = np.mgrid[:n, :n]
    centres = (np.stack([xs, ys], axis=-1).reshape(-1, 2) * stride).astype(np.float32)
    out = np.repeat(centres, DET_ANCHORS, axis=0)
    out.flags.writeable = False
    return out


def letterbox(image: np.ndarray, side: int = DET_SIZE) -> tuple[np.ndarray, float]:
    """``image`` resized to fit ``side`` (aspect kept), top-left on a black square; the scale."""
    h, w = image.shape[:2]
    if h / w > 1.0:
        new_h, new_w = side, int(side / (h / w))
    else:
        new_w, new_h = side, int(side * (h / w))
    new_h, new_w = max(new_h, 1), max(new_w, 1)
    canvas = np.zeros((side, side, 3), dtype=np.uint8)
    canvas[:new_h, :new_w] = resize_bilinear(image, (new_h, new_w))
    return canvas, new_h / h


class FaceDetector(_Runner):
    """SCRFD (``det_10g.onnx`` or ``insightface_det.onnx``) at 512 px, Ditto's post-processing."""

    what = "SCRFD face detector (det_10g.onnx)"
    stage = S_DET
    input_names = (DET10G_INPUT, DET_REEXPORT_INPUT)
    side = DET_SIZE
    expected = (
        f"one input '{DET10G_INPUT}' float32 [1, 3, H, W] and nine 2-D outputs: scores "
        "[N, 1], boxes [N, 4] and keypoints [N, 10] at strides 8, 16 and 32"
    )

    def _check_outputs(self, outputs: Sequence[Any]) -> None:
        names = [o.name for o in outputs]
        if len(outputs) != 9:
            raise self._fail(f"it has {len(outputs)} outputs")
        if set(names) == set(DET10G_OUTPUTS):
            names = list(DET10G_OUTPUTS)
        elif set(names) == set(DET_REEXPORT_OUTPUTS):
            names = list(DET_REEXPORT_OUTPUTS)
        by_name = {o.name: o for o in outputs}
        for k, name in enumerate(names):
            dims = _dims(by_name[name])
            width = DET_WIDTHS[k // 3]
            if len(dims) == 3 and not (isinstance(dims[0], int) and dims[0] != 1):
                dims = dims[1:]
            if len(dims) != 2 or (isinstance(dims[1], int) and dims[1] != width):
                raise self._fail(f"output '{name}' (#{k}) is shaped {_dims(by_name[name])}")
        self.output_names = names

    def raw(self, blob: np.ndarray) -> list[np.ndarray]:
        """The nine outputs for a [1, 3, 512, 512] blob, in (scores, boxes, kps) x stride order."""
        outs = self.session.run(self.output_names, {self.input_name: blob})
        return [np.asarray(o, dtype=np.float32).reshape(-1, o.shape[-1]) for o in outs]

    def __call__(self, image_rgb: np.ndarray, threshold: float = DET_THRESH) -> Detections:
        """Faces in an RGB uint8 image, in its pixel coordinates, after NMS (IoU 0.4)."""
        canvas, det_scale = letterbox(image_rgb)
        bgr = canvas[..., ::-1].astype(np.float32)  # Ditto's swapRB on an RGB frame
        blob = ((bgr - DET_MEAN) / DET_STD).transpose(2, 0, 1)[None]
        outs = self.raw(np.ascontiguousarray(blob))
        scores, boxes, kps = [], [], []
        for i, stride in enumerate(DET_STRIDES):
            centres = _anchor_centres(DET_SIZE, stride)
            s, b, k = outs[i][:, 0], outs[i + 3] * stride, outs[i + 6] * stride
            if not len(s) == len(b) == len(k) == len(centres):
                raise self._fail(
                    f"at stride {stride} it returned {len(s)} scores, {len(b)} boxes and "
                    f"{len(k)} keypoint rows for a {DET_SIZE} px input",
                    f"{len(centres)} of each ({DET_ANCHORS} anchors per cell)",
                )
            pos = s >= threshold
            c = centres[pos]
            d = b[pos]
            boxes.append(np.concatenate([c - d[:, :2], c + d[:, 2:]], axis=1))
            kps.append(k[pos].reshape(-1, 5, 2) + c[:, None, :])
            scores.append(s[pos])
        score = np.concatenate(scores)
        box = np.concatenate(boxes) / det_scale
        kp = np.concatenate(kps) / det_scale
        keep = nms(box, score) if len(score) else np.zeros(0, dtype=np.int64)
        return Detections(
            box[keep].astype(np.float32),
            score[keep].astype(np.float32),
            kp[keep].astype(np.float32),
        )


# --- landmarks -----------------------------------------------------------------------------------


class Landmark106(_Runner):
    """InsightFace ``2d106det.onnx``: 106 points in a 192 px crop around a detection box."""

    what = "106-point landmark model (2d106det.onnx)"
    stage = S_LMK106
    input_names = (LMK106_INPUT,)
    side = LMK106_SIZE
    expected = (
        f"one input '{LMK106_INPUT}' float32 [1, 3, {LMK106_SIZE}, {LMK106_SIZE}] and an "
        f"output '{LMK106_OUTPUT}' [1, {2 * LMK106_POINTS}]"
    )

    def _check_outputs(self, outputs: Sequence[Any]) -> None:
        by_name = {o.name: o for o in outputs}
        out = by_name.get(LMK106_OUTPUT) or next(iter(by_name.values()), None)
        if out is None:
            raise self._fail("it has no outputs")
        self.output_name = self._check_points(out, LMK106_POINTS, exact=False)

    def crop(self, image_rgb: np.ndarray, box: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The 192 px crop the model sees (RGB) and its original -> crop matrix."""
        x1, y1, x2, y2 = (float(v) for v in box[:4])
        scale = LMK106_SIZE / (max(x2 - x1, y2 - y1) * LMK106_BOX_SCALE)
        m = scale_center_matrix(((x1 + x2) / 2, (y1 + y2) / 2), scale, LMK106_SIZE)
        return warp_affine(image_rgb, m, LMK106_SIZE), m

    def __call__(self, image_rgb: np.ndarray, box: np.ndarray) -> np.ndarray:
        """106 points [106, 2] float32 in image pixels for one detection box."""
        crop, m = self.crop(image_rgb, box)
        blob = crop[..., ::-1].astype(np.float32).transpose(2, 0, 1)[None]  # BGR, 0..255
        pred = self.session.run([self.output_name], {self.input_name: np.ascontiguousarray(blob)})
        pts = np.asarray(pred[0], dtype=np.float32).reshape(-1, 2)[-LMK106_POINTS:]
        pts = (pts + 1.0) * (LMK106_SIZE // 2)
        return transform_points(pts, invert_affine(m))


class Landmark203(_Runner):
    """LivePortrait's 203-point model on the rotated 224 px crop (scale 1.5, vy -0.1)."""

    what = "203-point landmark model (landmark203.onnx)"
    stage = S_LMK203
    input_names = (LMK203_INPUT,)
    side = LMK203_SIZE
    expected = (
        f"one input '{LMK203_INPUT}' float32 [1, 3, {LMK203_SIZE}, {LMK203_SIZE}] and "
        f"three outputs {', '.join(LMK203_OUTPUTS)} with the points ([1, "
        f"{2 * LMK203_POINTS}]) third, or one output '{LMK203_REEXPORT_OUTPUT}'"
    )

    def _check_outputs(self, outputs: Sequence[Any]) -> None:
        by_name = {o.name: o for o in outputs}
        if LMK203_REEXPORT_OUTPUT in by_name:
            out = by_name[LMK203_REEXPORT_OUTPUT]
        elif len(outputs) > LMK203_PTS_INDEX:
            out = outputs[LMK203_PTS_INDEX]
        else:
            listed = ", ".join(f"'{n}'" for n in by_name) or "none"
            raise self._fail(f"it has outputs {listed}")
        self.output_name = self._check_points(
            out, LMK203_POINTS, exact=True, what="its points output"
        )

    def geometry(self, coarse: np.ndarray) -> CropGeometry:
        """The 224 px crop around coarse (106 or earlier 203) landmarks."""
        return crop_geometry(coarse, LMK203_SIZE, LMK203_SCALE, LMK203_VY, rotate=True)

    def __call__(self, image_rgb: np.ndarray, coarse: np.ndarray) -> np.ndarray:
        """203 points [203, 2] float32 in image pixels, from coarse landmarks."""
        geo = self.geometry(coarse)
        crop = crop_image(image_rgb, geo)
        inp = (crop.astype(np.float32) / 255.0).transpose(2, 0, 1)[None]
        out = self.session.run([self.output_name], {self.input_name: np.ascontiguousarray(inp)})
        pts = np.asarray(out[0], dtype=np.float32)[0].reshape(-1, 2) * LMK203_SIZE
        return transform_points(pts, geo.m_c2o)
