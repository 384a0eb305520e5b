"""Small ONNX stand-ins for the three registration face models, and test faces to run them on.

Nobody here can download InsightFace's or LivePortrait's weights, so tests run registration on
graphs with the released interfaces (names, shapes, layouts, colour order, value ranges; see
:mod:`studio.avatar.faces`) that find a *drawn* face instead of a real one:

* :func:`face_image` / :func:`draw_face` paint faces into an image: a skin-coloured ellipse
  filling the face box, two dark eye ellipses and a dark mouth at fixed fractions of the box
  (:data:`EYE_CENTRES`, :data:`MOUTH_CENTRE`, ...), on a background of another colour.
* Each stand-in thresholds its input against the skin colour, in its own input space (BGR
  ``(x - 127.5) / 128`` for the detector, BGR 0..255 for the 106 model, RGB 0..1 for the 203
  model), so feeding RGB where BGR is expected finds nothing. Holes (eyes, mouth) are closed
  where skin lies within a few pixels on both sides, horizontally or vertically
  (:data:`DET_FILL_PX`: faces in one image need gaps wider than twice that at the detector's
  512 px scale). From every pixel the graph measures how far the filled mask runs left, right,
  up and down (cumulative maxima by dilated max-pooling, all in ONNX operators).
* ``det_10g.onnx``: at every anchor (strides 8/16/32, two anchors per cell) the runs give the
  box in SCRFD's distance encoding (``(l, t, r, b) / stride``); the score is the anchor's
  centredness in that box (FCOS style, 1 at the centre), zero off the mask. Five keypoints
  follow the face layout. NMS then keeps one box per face.
* ``2d106det.onnx`` and ``landmark203.onnx``: the face is the blob under the crop centre; its
  box is the vertical run through the centre and the widest horizontal run along it. The output
  is a canonical template (:func:`template_106`, :func:`template_203`) fitted to that box, so
  the eye and mouth landmarks land on the drawn eyes and mouth, in the released encodings
  (``fc1`` in [-1, 1] of the 192 crop; output 2 as fractions of the 224 crop).

The templates keep the indices registration reads (eye and mouth anchors of §5.3, LivePortrait's
eye and lip ratio points 0/6/12/18, 24/30/36/42, 48/66, 90/102); the remaining points (contour,
brows, nose) are plausible placements, not the real models' exact semantics. Faces are found
upright only: a stand-in cannot see roll, so rotation is tested on the crop geometry alone.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from studio.avatar.faces import (
    DET10G_INPUT,
    DET10G_OUTPUTS,
    DET_ANCHORS,
    DET_MEAN,
    DET_STD,
    DET_STRIDES,
    LMK106_INPUT,
    LMK106_OUTPUT,
    LMK106_POINTS,
    LMK106_SIZE,
    LMK203_INPUT,
    LMK203_OUTPUTS,
    LMK203_POINTS,
    LMK203_SIZE,
)

__all__ = [
    "AUX_FILES",
    "BACKGROUND_RGB",
    "EYE_CENTRES",
    "EYE_SIZE",
    "FEATURE_RGB",
    "MOUTH_CENTRE",
    "MOUTH_SIZE",
    "SKIN_RGB",
    "build_det_standin",
    "build_landmark106_standin",
    "build_landmark203_standin",
    "draw_face",
    "face_image",
    "face_layout",
    "template_106",
    "template_203",
    "write_aux_standins",
]

STANDIN_OPSET = 17
STANDIN_IR_VERSION = 8

# --- the drawn face ------------------------------------------------------------------------------

SKIN_RGB = (224, 172, 138)
FEATURE_RGB = (40, 24, 28)  # eyes and mouth
BACKGROUND_RGB = (60, 110, 150)
# Fractions of the face box (x, y); sizes are full width and height.
EYE_CENTRES = ((0.32, 0.42), (0.68, 0.42))  # image-left eye first
EYE_SIZE = (0.16, 0.07)
MOUTH_CENTRE = (0.5, 0.74)
MOUTH_SIZE = (0.34, 0.07)
SKIN_TOLERANCE = 24  # per channel, in 0..255 units
DET_FILL_PX = 40  # hole closing reach at the detector's 512 px scale
LMK_FILL_PX = 16  # ... and in the 192/224 px landmark crops
_BIG = 1.0e6

# Released file names under ditto_pytorch/aux_models/.
AUX_FILES = {
    "insightface_det": "det_10g.onnx",
    "landmark106": "2d106det.onnx",
    "landmark203": "landmark203.onnx",
}


def _ellipse_mask(h: int, w: int, cx: float, cy: float, rx: float, ry: float) -> np.ndarray:
    """Pixels whose centre (their integer coordinate, as in OpenCV) is inside the ellipse."""
    ys, xs = np.ogrid[:h, :w]
    return ((xs - cx) / max(rx, 1e-6)) ** 2 + ((ys - cy) / max(ry, 1e-6)) ** 2 <= 1.0


def face_layout(box: Sequence[float]) -> dict[str, np.ndarray]:
    """Where :func:`draw_face` puts things for ``box`` (x1, y1, x2, y2): image pixels."""
    x1, y1, x2, y2 = (float(v) for v in box)
    w, h = x2 - x1, y2 - y1

    def at(fx: float, fy: float) -> np.ndarray:
        return np.array([x1 + fx * w, y1 + fy * h])

    return {
        "center": at(0.5, 0.5),
        "eyes": np.stack([at(*c) for c in EYE_CENTRES]),
        "eye_radii": np.array([EYE_SIZE[0] * w / 2, EYE_SIZE[1] * h / 2]),
        "mouth": at(*MOUTH_CENTRE),
        "mouth_radii": np.array([MOUTH_SIZE[0] * w / 2, MOUTH_SIZE[1] * h / 2]),
    }


def draw_face(
    image: np.ndarray,
    box: Sequence[float],
    skin: Sequence[int] = SKIN_RGB,
    feature: Sequence[int] = FEATURE_RGB,
) -> np.ndarray:
    """Paint one face filling ``box`` (x1, y1, x2, y2, pixels) into RGB ``image``, in place."""
    h, w = image.shape[:2]
    x1, y1, x2, y2 = (float(v) for v in box)
    lay = face_layout(box)
    image[_ellipse_mask(h, w, (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2, (y2 - y1) / 2)] = skin
    for c in lay["eyes"]:
        image[_ellipse_mask(h, w, *c, *lay["eye_radii"])] = feature
    image[_ellipse_mask(h, w, *lay["mouth"], *lay["mouth_radii"])] = feature
    return image


def face_image(
    size_hw: tuple[int, int],
    boxes: Iterable[Sequence[float]],
    background: Sequence[int] = BACKGROUND_RGB,
    noise: float = 0.0,
    seed: int = 0,
) -> np.ndarray:
    """An RGB uint8 image of ``size_hw`` with a face drawn in each box (several allowed).

    ``noise`` adds Gaussian noise of that standard deviation (0..255 units) everywhere.
    """
    h, w = size_hw
    img = np.empty((h, w, 3), dtype=np.uint8)
    img[:] = np.asarray(background, dtype=np.uint8)
    for box in boxes:
        draw_face(img, box)
    if noise > 0:
        rng = np.random.default_rng(seed)
        img = np.clip(img + rng.normal(0.0, noise, img.shape), 0, 255).astype(np.uint8)
    return img


# --- landmark templates (fractions of the face box) ----------------------------------------------


def _ring(cx: float, cy: float, rx: float, ry: float, n: int, start: float = math.pi) -> np.ndarray:
    """``n`` points on an ellipse, the first at angle ``start`` (pi = leftmost), then clockwise
    on screen (top next: image y points down)."""
    a = start + 2 * math.pi * np.arange(n) / n
    return np.stack([cx + rx * np.cos(a), cy + ry * np.sin(a)], axis=1)


def _arc(cx: float, cy: float, rx: float, ry: float, a0: float, a1: float, n: int) -> np.ndarray:
    a = np.linspace(a0, a1, n)
    return np.stack([cx + rx * np.cos(a), cy + ry * np.sin(a)], axis=1)


def _line(p0: Sequence[float], p1: Sequence[float], n: int) -> np.ndarray:
    t = np.linspace(0.0, 1.0, n)[:, None]
    return np.asarray(p0) * (1 - t) + np.asarray(p1) * t


def _brow(cx: float, n: int) -> np.ndarray:
    return _arc(cx, 0.34, 0.11, 0.05, math.pi * 1.1, math.pi * 1.9, n)


def _contour(n: int) -> np.ndarray:
    """Jaw line: from the right cheek slightly above the middle, round the chin, to the left."""
    return _arc(0.5, 0.5, 0.5, 0.5, -0.17, math.pi + 0.17, n)


def _nose(n: int) -> np.ndarray:
    bridge = _line((0.5, 0.45), (0.5, 0.6), n - n // 2)
    base = _line((0.43, 0.62), (0.57, 0.62), n // 2)
    return np.concatenate([bridge, base])


def template_203() -> np.ndarray:
    """[203, 2] canonical 203-point layout in the unit face box (see the module docstring).

    0-23 / 24-47: eye rings from the outer-left corner (0, 12 corners; 6 top; 18 bottom);
    48-83 outer lip ring (48, 66 corners); 84-107 inner lip ring (90 top, 102 bottom);
    108-127 brows; 128-145 nose; 146-202 jaw contour.
    """
    (ex0, ey0), (ex1, ey1) = EYE_CENTRES
    erx, ery = EYE_SIZE[0] / 2, EYE_SIZE[1] / 2
    mx, my = MOUTH_CENTRE
    mrx, mry = MOUTH_SIZE[0] / 2, MOUTH_SIZE[1] / 2
    parts = [
        _ring(ex0, ey0, erx, ery, 24),
        _ring(ex1, ey1, erx, ery, 24),
        _ring(mx, my, mrx, mry, 36),
        _ring(mx, my, 0.8 * mrx, 0.45 * mry, 24),
        _brow(ex0, 10),
        _brow(ex1, 10),
        _nose(18),
        _contour(57),
    ]
    out = np.concatenate(parts).astype(np.float64)
    assert out.shape == (LMK203_POINTS, 2)
    return out


def _eye10(
    cx: float, cy: float, rx: float, ry: float, corner_l: int, top: int, corner_r: int, bottom: int
) -> tuple[dict[int, np.ndarray], list[np.ndarray]]:
    """Ten points of one eye for the 106 layout, with the four anchor indices placed exactly."""
    ring = _ring(cx, cy, rx, ry, 8)  # 0 left, 2 top, 4 right, 6 bottom
    fixed = {corner_l: ring[0], top: ring[2], corner_r: ring[4], bottom: ring[6]}
    rest = [
        ring[1],
        ring[3],
        ring[5],
        ring[7],
        np.array([cx, cy - 0.6 * ry]),
        np.array([cx, cy + 0.6 * ry]),
    ]
    return fixed, rest


def template_106() -> np.ndarray:
    """[106, 2] canonical 106-point layout in the unit face box.

    0-32 jaw contour; 33-42 left eye (33/39 corners, 35 top, 40 bottom); 43-51 left brow;
    52-71 mouth (52, 61 corners); 72-86 nose; 87-96 right eye (87/93 corners, 89 top, 94
    bottom); 97-105 right brow.
    """
    pts = np.zeros((LMK106_POINTS, 2))
    pts[0:33] = _contour(33)
    erx, ery = EYE_SIZE[0] / 2, EYE_SIZE[1] / 2
    for (cx, cy), (lo, hi), anchors in zip(
        EYE_CENTRES, ((33, 43), (87, 97)), ((33, 35, 39, 40), (87, 89, 93, 94)), strict=True
    ):
        fixed, rest = _eye10(cx, cy, erx, ery, *anchors)
        for i, p in fixed.items():
            pts[i] = p
        free = [i for i in range(lo, hi) if i not in fixed]
        pts[free] = np.stack(rest)
    pts[43:52] = _brow(EYE_CENTRES[0][0], 9)
    pts[97:106] = _brow(EYE_CENTRES[1][0], 9)
    mx, my = MOUTH_CENTRE
    mrx, mry = MOUTH_SIZE[0] / 2, MOUTH_SIZE[1] / 2
    outer = _ring(mx, my, mrx, mry, 18)  # 0 left corner, 9 right corner
    pts[52:61] = outer[0:9]
    pts[61:70] = outer[9:18]
    pts[70:72] = [(mx, my - 0.4 * mry), (mx, my + 0.4 * mry)]
    pts[72:87] = _nose(15)
    return pts


# --- ONNX building -------------------------------------------------------------------------------


class _Graph:
    """Minimal node/initializer bookkeeping for building the stand-in graphs."""

    def __init__(self) -> None:
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.nodes: list = []
        self.inits: list = []
        self.count = 0

    def _name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"

    def const(self, value: object, dtype: type = np.float32) -> str:
        name = self._name("c")
        self.inits.append(self.numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs: object) -> str:
        name = out or self._name(op_type.lower())
        self.nodes.append(self.helper.make_node(op_type, list(inputs), [name], **attrs))
        return name

    def model(self, name: str, inputs: list, outputs: list) -> object:
        import onnx

        graph = self.helper.make_graph(self.nodes, name, inputs, outputs, initializer=self.inits)
        model = self.helper.make_model(
            graph,
            opset_imports=[self.helper.make_opsetid("", STANDIN_OPSET)],
            producer_name="talkinghead-studio",
        )
        model.ir_version = STANDIN_IR_VERSION
        onnx.checker.check_model(model)
        return model


def _skin_mask(g: _Graph, x: str, colour: Sequence[float], tol: float) -> str:
    """[1, 1, H, W] float: 1 where every channel is within ``tol`` of ``colour``."""
    diff = g.op("Abs", g.op("Sub", x, g.const(np.reshape(colour, (1, 3, 1, 1)))))
    worst = g.op("ReduceMax", diff, axes=[1], keepdims=1)
    return g.op("Cast", g.op("LessOrEqual", worst, g.const(tol)), to=1)


def _shift(g: _Graph, t: str, axis: int, d: int, forward: bool, floor: float) -> str:
    """``t`` moved by ``d`` along ``axis`` (towards higher indices when ``forward``), the
    vacated cells set to ``floor``."""
    pads = [0] * 8  # begin N, C, H, W, end N, C, H, W
    pads[axis + (0 if forward else 4)] = d
    padded = g.op("Pad", t, g.const(pads, np.int64), g.const(floor))
    starts, ends = ([0], [-d]) if forward else ([d], [2**62])
    return g.op(
        "Slice",
        padded,
        g.const(starts, np.int64),
        g.const(ends, np.int64),
        g.const([axis], np.int64),
    )


def _window_max(g: _Graph, t: str, axis: int, forward: bool, k: int, floor: float) -> str:
    """Max over the ``k`` cells ending at each cell (``forward``: cells x-k+1..x, else
    x..x+k-1) along ``axis`` (2 = H, 3 = W), by doubling: log2(k) shifts and maxima.

    (Pooling would do the same, but ONNX Runtime's dilated or wide max-pool is ~20x slower.)
    """
    n = 1
    while 2 * n <= k:
        t = g.op("Max", t, _shift(g, t, axis, n, forward, floor))
        n *= 2
    if n < k:
        t = g.op("Max", t, _shift(g, t, axis, k - n, forward, floor))
    return t


def _fill(g: _Graph, m: str, reach: int) -> str:
    """Close holes: a pixel is face when skin lies within ``reach`` px on both sides of it,
    horizontally or vertically (convex outlines do not grow)."""
    left, right, up, down = (
        _window_max(g, m, axis, forward, int(reach), 0.0)
        for axis, forward in ((3, True), (3, False), (2, True), (2, False))
    )
    return g.op("Max", g.op("Min", left, right), g.op("Min", up, down))


def _runs(g: _Graph, f: str, side: int) -> dict[str, str]:
    """Where the mask run through each pixel ends, in OpenCV pixel coordinates.

    Returns maps on the 1-px zero-padded grid [1, 1, H+2, W+2]: ``x1``/``x2`` (left/right edge
    of the horizontal run, half a pixel outside the first/last mask pixel), ``y1``/``y2``, the
    padded mask ``fp`` and index grids ``cx`` [1, 1, 1, W+2] and ``cy`` [1, 1, H+2, 1].
    """
    span = side + 2  # a running maximum over the whole padded side
    fp = g.op("Pad", f, g.const([0, 0, 1, 1, 0, 0, 1, 1], np.int64))
    shape = g.op("Shape", fp)
    zero, one = g.const(0, np.int64), g.const(1, np.int64)
    idx = {}
    for axis, view in ((3, [1, 1, 1, -1]), (2, [1, 1, -1, 1])):
        n = g.op("Gather", shape, g.const(axis, np.int64), axis=0)
        r = g.op("Cast", g.op("Range", zero, n, one), to=1)
        idx[axis] = g.op("Reshape", r, g.const(view, np.int64))
    empty = g.op("Sub", g.const(1.0), fp)  # 1 off the mask
    big = g.op("Mul", fp, g.const(_BIG))
    out = {"fp": fp}
    for axis, lo, hi in ((3, "x1", "x2"), (2, "y1", "y2")):
        # Last zero at or before the pixel (padded index) = first mask pixel's original index.
        last = _window_max(g, g.op("Mul", empty, idx[axis]), axis, True, span, 0.0)
        out[lo] = g.op("Sub", last, g.const(0.5))
        # First zero at or after it: a running minimum, as minus the maximum of the negation.
        firsts = g.op("Neg", g.op("Add", g.op("Mul", empty, idx[axis]), big))
        first = g.op("Neg", _window_max(g, firsts, axis, False, span, -2 * _BIG))
        out[hi] = g.op("Sub", first, g.const(1.5))
    out["cx"] = g.op("Sub", idx[3], g.const(1.0))
    out["cy"] = g.op("Sub", idx[2], g.const(1.0))
    return out


def _save(model: object, path: str | os.PathLike[str]) -> Path:
    import onnx

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.partial")
    try:
        onnx.save(model, str(tmp))
        tmp.replace(p)
    finally:
        tmp.unlink(missing_ok=True)
    return p


# Five SCRFD keypoints (left eye, right eye, nose, mouth corners) as fractions of the box.
_KPS5 = (
    EYE_CENTRES[0],
    EYE_CENTRES[1],
    (0.5, 0.58),
    (MOUTH_CENTRE[0] - MOUTH_SIZE[0] / 2, MOUTH_CENTRE[1]),
    (MOUTH_CENTRE[0] + MOUTH_SIZE[0] / 2, MOUTH_CENTRE[1]),
)


def _per_anchor(g: _Graph, t: str, width: int, scale: Sequence[float]) -> str:
    """[1, C, h, w] per cell -> [h * w * anchors, C], each cell's row once per anchor."""
    perm = g.op("Transpose", t, perm=[0, 2, 3, 1])
    cells = g.op("Unsqueeze", perm, g.const([3], np.int64))
    copies = [g.op("Mul", cells, g.const(f)) for f in scale]
    both = g.op("Concat", *copies, axis=3)  # [1, h, w, anchors, C]
    return g.op("Reshape", both, g.const([-1, width], np.int64))


def build_det_standin(
    path: str | os.PathLike[str],
    *,
    input_name: str = DET10G_INPUT,
    output_names: Sequence[str] = DET10G_OUTPUTS,
    side: int = 1024,
) -> Path:
    """Write the SCRFD stand-in (``det_10g.onnx`` interface); ``side`` bounds the input side.

    Input ``input.1`` [1, 3, ?, ?] (BGR, (x - 127.5) / 128); outputs scores [N, 1], boxes
    [N, 4] and keypoints [N, 10] for strides 8, 16, 32, in ``output_names`` order.
    """
    from onnx import TensorProto, helper

    g = _Graph()
    colour = [(c - DET_MEAN) / DET_STD for c in SKIN_RGB[::-1]]  # BGR, normalised
    mask = _skin_mask(g, input_name, colour, SKIN_TOLERANCE / DET_STD)
    runs = _runs(g, _fill(g, mask, DET_FILL_PX), side)
    kmat = np.zeros((4, 10), dtype=np.float32)  # (l, t, r, b) -> keypoint distances
    for k, (fx, fy) in enumerate(_KPS5):
        kmat[:, 2 * k] = (fx - 1.0, 0.0, fx, 0.0)
        kmat[:, 2 * k + 1] = (0.0, fy - 1.0, 0.0, fy)
    scores, boxes, kps = [], [], []
    eps = g.const(1e-6)
    for stride in DET_STRIDES:

        def sample(t: str, axes: list[int], stride: int = stride) -> str:
            n = len(axes)
            return g.op(
                "Slice",
                t,
                g.const([1] * n, np.int64),
                g.const([-1] * n, np.int64),
                g.const(axes, np.int64),
                g.const([stride] * n, np.int64),
            )

        x1, x2, y1, y2, inside = (sample(runs[k], [2, 3]) for k in ("x1", "x2", "y1", "y2", "fp"))
        cx, cy = sample(runs["cx"], [3]), sample(runs["cy"], [2])
        s = g.const(float(stride))
        dist = [
            g.op("Div", g.op("Sub", cx, x1), s),
            g.op("Div", g.op("Sub", cy, y1), s),
            g.op("Div", g.op("Sub", x2, cx), s),
            g.op("Div", g.op("Sub", y2, cy), s),
        ]
        ratios = [
            g.op("Div", g.op("Min", a, b), g.op("Max", g.op("Max", a, b), eps))
            for a, b in ((dist[0], dist[2]), (dist[1], dist[3]))
        ]
        centred = g.op("Max", g.op("Mul", *ratios), g.const(0.0))
        score = g.op("Mul", centred, inside)  # [1, 1, h, w]
        ltrb = g.op("Concat", *dist, axis=1)  # [1, 4, h, w]

        # The second anchor of a cell scores a little lower, so the order is strict.
        scores.append(_per_anchor(g, score, 1, (1.0, 0.98)[:DET_ANCHORS]))
        box = _per_anchor(g, ltrb, 4, (1.0,) * DET_ANCHORS)
        boxes.append(box)
        kps.append(g.op("MatMul", box, g.const(kmat)))
    names = list(output_names)
    for i, t in enumerate(scores + boxes + kps):
        g.op("Identity", t, out=names[i])
    f32 = TensorProto.FLOAT
    model = g.model(
        "det_10g_standin",
        [helper.make_tensor_value_info(input_name, f32, [1, 3, None, None])],
        [
            helper.make_tensor_value_info(n, f32, [None, w])
            for n, w in zip(names, [1] * 3 + [4] * 3 + [10] * 3, strict=True)
        ],
    )
    return _save(model, path)


def _template_head(
    g: _Graph, runs: dict[str, str], side: int, tmpl: np.ndarray, scale: tuple[float, float]
) -> str:
    """[1, 2N]: ``tmpl`` (unit face box) fitted to the blob under the crop centre, each
    coordinate as ``x * scale[0] + scale[1]``."""
    c = side // 2 + 1  # the centre pixel on the padded grid

    def at(t: str, rows: tuple[int, int], cols: tuple[int, int]) -> str:
        return g.op(
            "Slice",
            t,
            g.const([rows[0], cols[0]], np.int64),
            g.const([rows[1], cols[1]], np.int64),
            g.const([2, 3], np.int64),
        )

    full = (0, side + 2)
    centre = (c, c + 1)
    y1, y2 = at(runs["y1"], centre, centre), at(runs["y2"], centre, centre)
    rows = runs["cy"]  # [1, 1, H + 2, 1], original row index
    valid = g.op("And", g.op("GreaterOrEqual", rows, y1), g.op("LessOrEqual", rows, y2))
    x1 = g.op(
        "ReduceMin", g.op("Where", valid, at(runs["x1"], full, centre), g.const(_BIG)), keepdims=1
    )
    x2 = g.op(
        "ReduceMax", g.op("Where", valid, at(runs["x2"], full, centre), g.const(-_BIG)), keepdims=1
    )
    face = g.op("Reshape", g.op("Concat", x1, y1, x2, y2, axis=3), g.const([1, 4], np.int64))
    inside = g.op(
        "Cast", g.op("Reshape", at(runs["fp"], centre, centre), g.const([1, 1], np.int64)), to=9
    )
    box = g.op("Where", inside, face, g.const([[-0.5, -0.5, side - 0.5, side - 0.5]]))
    q = g.op("Concat", box, g.const([[1.0]]), axis=1)  # [1, 5]: x1, y1, x2, y2, 1
    n = len(tmpl)
    a = np.zeros((5, 2 * n), dtype=np.float64)
    k, b = scale
    a[0, 0::2] = (1 - tmpl[:, 0]) * k
    a[2, 0::2] = tmpl[:, 0] * k
    a[1, 1::2] = (1 - tmpl[:, 1]) * k
    a[3, 1::2] = tmpl[:, 1] * k
    a[4, :] = b
    return g.op("MatMul", q, g.const(a.astype(np.float32)))


def build_landmark106_standin(
    path: str | os.PathLike[str],
    *,
    input_name: str = LMK106_INPUT,
    output_name: str = LMK106_OUTPUT,
) -> Path:
    """Write the ``2d106det.onnx`` stand-in: ``data`` [1, 3, 192, 192] BGR 0..255 -> ``fc1``
    [1, 212], the 106 template in [-1, 1] of the crop."""
    from onnx import TensorProto, helper

    g = _Graph()
    mask = _skin_mask(g, input_name, SKIN_RGB[::-1], SKIN_TOLERANCE)
    runs = _runs(g, _fill(g, mask, LMK_FILL_PX), LMK106_SIZE)
    half = LMK106_SIZE // 2
    head = _template_head(g, runs, LMK106_SIZE, template_106(), (1.0 / half, -1.0))
    g.op("Identity", head, out=output_name)
    f32 = TensorProto.FLOAT
    model = g.model(
        "landmark106_standin",
        [helper.make_tensor_value_info(input_name, f32, [1, 3, LMK106_SIZE, LMK106_SIZE])],
        [helper.make_tensor_value_info(output_name, f32, [1, 2 * LMK106_POINTS])],
    )
    return _save(model, path)


def build_landmark203_standin(
    path: str | os.PathLike[str],
    *,
    input_name: str = LMK203_INPUT,
    output_names: Sequence[str] = LMK203_OUTPUTS,
) -> Path:
    """Write the LivePortrait ``landmark.onnx`` stand-in: ``input`` [1, 3, 224, 224] RGB 0..1
    -> ``output`` [1, 214] and ``853`` [1, 262] (zeros) and ``856`` [1, 406], the 203 template
    as fractions of the crop (output index 2, as the runners read it)."""
    from onnx import TensorProto, helper

    g = _Graph()
    mask = _skin_mask(g, input_name, [c / 255.0 for c in SKIN_RGB], SKIN_TOLERANCE / 255.0)
    runs = _runs(g, _fill(g, mask, LMK_FILL_PX), LMK203_SIZE)
    pts = _template_head(g, runs, LMK203_SIZE, template_203(), (1.0 / LMK203_SIZE, 0.0))
    widths = [214, 262, 2 * LMK203_POINTS]
    names = list(output_names)
    for name, width in zip(names[:-1], widths[:-1], strict=False):
        g.op(
            "MatMul",
            g.op(
                "Slice", pts, g.const([0], np.int64), g.const([1], np.int64), g.const([1], np.int64)
            ),
            g.const(np.zeros((1, width), np.float32)),
            out=name,
        )
    g.op("Identity", pts, out=names[-1])
    f32 = TensorProto.FLOAT
    model = g.model(
        "landmark203_standin",
        [helper.make_tensor_value_info(input_name, f32, [1, 3, LMK203_SIZE, LMK203_SIZE])],
        [
            helper.make_tensor_value_info(n, f32, [1, w])
            for n, w in zip(names, widths[-len(names) :], strict=True)
        ],
    )
    return _save(model, path)


def write_aux_standins(root: str | os.PathLike[str]) -> dict[str, Path]:
    """Write the three stand-ins into ``<root>/ditto_pytorch/aux_models/`` under the released
    names (det_10g.onnx, 2d106det.onnx, landmark203.onnx); returns role -> path.

    With ``write_checkpoint_tree(root, reduced=True)`` this makes a complete PyTorch layout for
    registration, apart from ``face_landmarker.task`` (eye features then use their fallback).
    """
    aux = Path(root).expanduser() / "ditto_pytorch" / "aux_models"
    return {
        "insightface_det": build_det_standin(aux / AUX_FILES["insightface_det"]),
        "landmark106": build_landmark106_standin(aux / AUX_FILES["landmark106"]),
        "landmark203": build_landmark203_standin(aux / AUX_FILES["landmark203"]),
    }
