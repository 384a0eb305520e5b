"""The demo engine's renderer: a procedural 2.5-D cartoon head drawn from Ditto motion.

The demo engine has no neural renderer, so this module turns the 265-dim motion
vector into a friendly cartoon portrait. It reads the motion the way the real
pipeline does: ``layout.unpack``, then the LivePortrait keypoint transform
``x = scale * (R @ kp + exp) + t`` of the demo rig's canonical keypoints
(``demo_rig``). Each facial feature is drawn at its transformed keypoint, so the
picture shows what the motion says: yaw slides the features across the head,
pitch moves them up and down, roll tilts the face, scale and t move everything,
and the expression offsets open the mouth, close the eyes and raise the brows.

The head is an ellipsoid, ray-cast per pixel for its shading and for the hair
line, which lives on its surface; the features are flat shapes foreshortened by
the head's tangent plane at their keypoint. Every edge is anti-aliased from a
signed distance in pixels, ``clip(0.5 - d, 0, 1)``. Only numpy is used.

Speed (about 12 ms a frame at 512 on two slow cores): the canvas is planar float32
([3, H, W]) and starts each frame as the precomputed background; the shoulders are a
precomputed sprite that only slides. Each other shape is evaluated only inside its
bounding box, on a contiguous working copy of that box (numpy is slow on the short
rows of a view), large boxes in row strips that stay in cache and narrowed to the
shape's extent; only the boxes drawn this frame are converted to uint8 and reset
afterwards. Same motion, same pixels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from studio import layout
from studio.engines.base import Renderer
from studio.engines.demo import rig as rig

MIN_SIZE = 64
MAX_SIZE = 2048

# --- the head (keypoint units, head-local frame around HEAD_CENTER) ----------------
HEAD_RADII = np.array([0.375, 0.44, 0.36])  # the skull ellipsoid
HEAD_TAPER = 0.13  # the face narrows by this fraction towards the chin
JAW_PIVOT = 0.22  # the open jaw stretches the face below this head-local y
EYE_CORNER_U = 1.0  # eye-white radii from the eye's centre
OUTLINE_ANGLES = np.deg2rad([-100.0, -75.0, -50.0, -25.0, 25.0, 50.0, 75.0, 100.0])
_OUTLINE_COS, _OUTLINE_SIN = np.cos(OUTLINE_ANGLES), np.sin(OUTLINE_ANGLES)
HAIR_FRINGE_Y = -0.30  # front hairline (head-local y) at the cusps between locks
HAIR_FRINGE_WAVE = 0.05  # how far the fringe's locks hang below the cusps
HAIR_LOCK_WIDTH = 0.13
HAIR_SWEEP = 0.10  # the fringe slopes down towards the viewer's right
HAIR_SIDE_Y = -0.02  # hairline at the temples
HAIR_SHELL = np.array([0.05, 0.045, 0.07])  # the hair's volume beyond the skull
HAIR_TUFT = 0.018  # curly bumps along the shell's top edge
HAIR_TUFT_WIDTH = 0.11
HAIR_SWEEP_UP = 0.12  # the shell's sides end higher towards the outside
GAZE_GAIN = 1.6  # iris travel per unit of GAZE offset (the rig's range is subtle)

# --- features (keypoint units, in the head's tangent plane at the keypoint) -------
EYE_RADII = (0.063, 0.070)
IRIS_RADII = (0.043, 0.048)
PUPIL_SCALE = 0.52  # pupil radius / iris radius
LID_UPPER_REST = -0.78  # lid edges at rest, in units of the eye's vertical radius
LID_LOWER_REST = 0.93
LID_CLOSED = 0.42  # where the lids meet in a full rig blink
BROW_HALF_LENGTH = 0.072
NOSE_RADII = (0.038, 0.030)
CHEEK_RADII = (0.072, 0.046)
EAR_RADII = (0.058, 0.088)
NECK_RADIUS = 0.125  # frame units (half the image is 1)
NECK_BASE = 1.585  # the collar's centre, frame units from the top
BODY_SHIFT = 0.06  # the shoulders slide at most this fraction of the frame sideways
SMILE = 0.011  # the resting smile: the lip line sags this much at the mouth's centre

# The drawn lids travel so that the rig's blink (upper and lower lid keypoints moving
# in the ratio BLINK_UPPER_LID : BLINK_LOWER_LID) closes them exactly at LID_CLOSED.
_UP_SHARE = rig.BLINK_UPPER_LID / (rig.BLINK_UPPER_LID - rig.BLINK_LOWER_LID)
_LID_TRAVEL_UP = (LID_CLOSED - LID_UPPER_REST) / _UP_SHARE
_LID_TRAVEL_LO = (LID_LOWER_REST - LID_CLOSED) / (1.0 - _UP_SHARE)

# Light (world, towards the light): from the upper left, in front.
_LIGHT = np.array([-0.45, -0.55, 0.70])
_LIGHT /= np.linalg.norm(_LIGHT)

Color = tuple[float, float, float]


def _mul(c: Color, k: float) -> Color:
    return (c[0] * k, c[1] * k, c[2] * k)


def _lerp(c0: Color, c1: Color, t: float) -> Color:
    return tuple(a + (b - a) * t for a, b in zip(c0, c1, strict=True))


# Palette (sRGB 0..255).
SKIN_LIT: Color = (255.0, 224.0, 200.0)
SKIN_SHADE: Color = (222.0, 160.0, 138.0)
SKIN_DEEP: Color = (196.0, 128.0, 112.0)
HAIR_LIT: Color = (136.0, 84.0, 58.0)
HAIR_SHADE: Color = (70.0, 40.0, 32.0)
HAIR_SHINE: Color = (196.0, 138.0, 100.0)
BROW_COL: Color = (86.0, 52.0, 38.0)
EYE_WHITE: Color = (252.0, 250.0, 247.0)
EYE_WHITE_SHADE: Color = (214.0, 206.0, 212.0)
IRIS_OUTER: Color = (52.0, 96.0, 128.0)
IRIS_INNER: Color = (96.0, 164.0, 196.0)
IRIS_RIM: Color = (36.0, 67.0, 90.0)
PUPIL: Color = (24.0, 26.0, 38.0)
LASH: Color = (50.0, 32.0, 30.0)
LIP_UP: Color = (206.0, 108.0, 106.0)
LIP_LO: Color = (226.0, 128.0, 122.0)
LIP_SHINE: Color = (246.0, 170.0, 160.0)
MOUTH_IN: Color = (96.0, 34.0, 42.0)
TEETH: Color = (250.0, 248.0, 240.0)
TONGUE: Color = (222.0, 106.0, 110.0)
BLUSH: Color = (250.0, 138.0, 140.0)
NOSE_HL: Color = (255.0, 246.0, 236.0)
SHIRT_LIT: Color = (84.0, 176.0, 168.0)
SHIRT_SHADE: Color = (36.0, 104.0, 112.0)
COLLAR: Color = (244.0, 236.0, 214.0)
BG_TOP: Color = (176.0, 214.0, 232.0)
BG_BOTTOM: Color = (246.0, 232.0, 214.0)
BG_GLOW: Color = (255.0, 250.0, 240.0)


# --- pixel helpers ------------------------------------------------------------------
_ZEROS = np.zeros(1 << 17, dtype=np.float32)
_ONES = np.ones(1 << 17, dtype=np.float32)


def _clip01(x: np.ndarray) -> np.ndarray:
    """clip(x, 0, 1) as two array-array ufuncs.

    np.clip's Python wrapper costs more than the work on a small box, and
    np.maximum against a scalar takes a slow loop; against an array it is fast.
    """
    n = x.size
    if n > _ZEROS.size:
        return np.clip(x, 0.0, 1.0)
    r = np.maximum(x, _ZEROS[:n].reshape(x.shape))
    return np.minimum(r, _ONES[:n].reshape(x.shape), out=r)


def _pos(x: np.ndarray) -> np.ndarray:
    """max(x, 0)."""
    n = x.size
    if n > _ZEROS.size:
        return np.clip(x, 0.0, None)
    return np.maximum(x, _ZEROS[:n].reshape(x.shape))


def _smooth(x: np.ndarray, e0: float, e1: float) -> np.ndarray:
    t = _clip01((x - e0) * (1.0 / (e1 - e0)))
    return t * t * (3.0 - 2.0 * t)


def _ramp(x: np.ndarray, e0: float, e1: float) -> np.ndarray:
    """A linear 0..1 ramp from e0 to e1 (cheaper than _smooth where that is enough)."""
    return _clip01((x - e0) * (1.0 / (e1 - e0)))


def _cov(d: np.ndarray) -> np.ndarray:
    """Pixel coverage of a signed distance in pixels (negative inside)."""
    return _clip01(0.5 - d)


def _blend(tile: np.ndarray, cov: np.ndarray, col) -> None:
    """Composite `col` over tile [3, h, w] in place, with alpha `cov`.

    `col` is three floats or three per-pixel [h, w] planes.
    """
    for ch in range(3):
        r = tile[ch]
        r += cov * (col[ch] - r)


def _blend_mix(tile: np.ndarray, cov: np.ndarray, c0: Color, c1: Color, t: np.ndarray) -> None:
    """Composite the per-pixel colour c0 + t * (c1 - c0) over `tile`."""
    for ch in range(3):
        r = tile[ch]
        r += cov * ((c0[ch] - r) + t * (c1[ch] - c0[ch]))


def _mix(c0, c1, t: np.ndarray) -> list:
    """Per-pixel colour planes c0 + t * (c1 - c0) (c0, c1: colours or plane lists)."""
    return [c0[ch] + t * (c1[ch] - c0[ch]) for ch in range(3)]


def _affine(dx: np.ndarray, dy: np.ndarray, a: float, b: float, c: float = 0.0) -> np.ndarray:
    """a * dx + b * dy + c on a box grid (dx [1, w], dy [h, 1]) -> [h, w]."""
    return (a * dx + c) + b * dy


def _ellipse(dx: np.ndarray, dy: np.ndarray, ainv: tuple[float, float, float, float]):
    """Signed distance (px) to the ellipse {A @ unit disc}, and the disc coordinates u, v.

    ``ainv`` is A^-1 row-major; dx [1, w] and dy [h, 1] are pixel offsets from the
    centre. The distance is k0 (k0 - 1) / |grad(k0^2) / 2|, exact for circles.
    """
    a, b, c, d = ainv
    u = _affine(dx, dy, a, b)
    v = _affine(dx, dy, c, d)
    k0 = np.sqrt(u * u + v * v)
    gx = a * u + c * v
    gy = b * u + d * v
    k1 = np.sqrt(gx * gx + gy * gy) + 1e-6
    return k0 * (k0 - 1.0) / k1, u, v


def _disc_radius(dx: np.ndarray, dy: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, float]:
    """k0 = |A^-1 d| for the ellipse {A @ unit disc}, and its mean radius in pixels.

    (k0 - 1) * radius is a cheap distance for small, roundish shapes.
    """
    ia, ib, ic, id_ = _inv2(a)
    u = _affine(dx, dy, ia, ib)
    v = _affine(dx, dy, ic, id_)
    return np.sqrt(u * u + v * v), math.sqrt(abs(float(np.linalg.det(a))))


def _axis_ellipse(dx: np.ndarray, dy: np.ndarray, rx: float, ry: float):
    """Distance (px) to an axis-aligned ellipse, and its k0^2: separable, so cheap."""
    u2 = (dx * (1.0 / rx)) ** 2
    v2 = (dy * (1.0 / ry)) ** 2
    k2 = u2 + v2
    k0 = np.sqrt(k2)
    k1 = np.sqrt(u2 * (1.0 / (rx * rx)) + v2 * (1.0 / (ry * ry))) + 1e-6
    return k0 * (k0 - 1.0) / k1, k2


def _norm(v: np.ndarray) -> float:
    """Length of a 2-vector, as a Python float."""
    return math.hypot(float(v[0]), float(v[1]))


def _inv2(m: np.ndarray) -> tuple[float, float, float, float]:
    """Inverse of a 2x2 matrix as four Python floats (row-major)."""
    det = float(m[0, 0] * m[1, 1] - m[0, 1] * m[1, 0])
    if abs(det) < 1e-9:
        det = 1e-9
    return (
        float(m[1, 1]) / det,
        -float(m[0, 1]) / det,
        -float(m[1, 0]) / det,
        float(m[0, 0]) / det,
    )


def _tangent_frame(point: np.ndarray) -> np.ndarray:
    """[3, 2] tangent axes (right, down) of the head ellipsoid at a canonical point."""
    center = rig.CANONICAL_KP[rig.HEAD_CENTER].astype(np.float64)
    n = (point - center) / HEAD_RADII**2
    n /= np.linalg.norm(n)
    t1 = np.cross([0.0, 1.0, 0.0], n)
    t1 /= np.linalg.norm(t1)
    t2 = np.cross(n, t1)
    return np.stack([t1, t2], axis=1)


_FRAMES = {
    k: _tangent_frame(rig.CANONICAL_KP[k].astype(np.float64))
    for k in (
        rig.LID_UPPER_L,
        rig.LID_UPPER_R,
        rig.BROW_L,
        rig.BROW_R,
        rig.NOSE,
        rig.CHEEK_L,
        rig.CHEEK_R,
    )
}


def _ear_frame(side: float) -> tuple[np.ndarray, np.ndarray]:
    """Ear plane axes [3, 2] and the side's outward normal; ears face out and a bit forward."""
    n = np.array([side, 0.0, 0.45])
    n /= np.linalg.norm(n)
    tv = np.array([0.0, 1.0, 0.0])
    th = np.cross(tv, n)
    return np.stack([th, tv], axis=1), np.array([side, 0.0, 0.0])


_EAR_FRAMES = {rig.EAR_L: _ear_frame(-1.0), rig.EAR_R: _ear_frame(1.0)}


def _silhouette(radii: np.ndarray, rot: np.ndarray, su: float) -> tuple[np.ndarray, np.ndarray]:
    """An ellipsoid's world->unit-sphere map B [3, 3] and its projected outline M [2, 2].

    Points x (pixels from the centre) with |B x| <= 1 are inside; the orthographic
    outline is {d : d^T M d <= 1}, M the Schur complement of B^T B on the z axis.
    """
    b3 = (np.diag(1.0 / radii) @ rot.T) / su
    q = b3.T @ b3
    m2 = q[:2, :2] - np.outer(q[:2, 2], q[2, :2]) / q[2, 2]
    return b3, m2


_STRIP_PIXELS = 32768  # row strips of about this many pixels keep temporaries in cache


@dataclass
class _Box:
    """A pixel box being drawn: a contiguous working copy of the canvas under it."""

    tile: np.ndarray  # [3, h, w] float32
    dx: np.ndarray  # [1, w] pixel-centre offsets from the shape's centre
    dy: np.ndarray  # [h, 1]
    y0: int
    x0: int

    def strips(self, spans=None, split: int | None = None):
        """Row strips of about _STRIP_PIXELS pixels: (tile, dx, dy, r0, r1, c0) views.

        numpy temporaries of a whole large box miss the caches (and past the
        allocator's mmap threshold page-fault on every allocation); strips are faster.
        ``spans(y0, y1)`` may narrow each strip (absolute pixel rows y0..y1) to the
        absolute column intervals [(x0, x1), ...] where the shape can be; ``split``
        is a row where a strip must end.
        """
        h, w = self.tile.shape[1:]
        step = max(4, _STRIP_PIXELS // w)
        cuts = [0, h] if split is None or not 0 < split < h else [0, split, h]
        bounds = []
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            bounds += [(r0, min(r0 + step, b)) for r0 in range(a, b, step)]
        for r0, r1 in bounds:
            if spans is None:
                yield self.tile[:, r0:r1], self.dx, self.dy[r0:r1], r0, r1, 0
                continue
            for xa, xb in spans(self.y0 + r0, self.y0 + r1):
                c0 = max(int(np.floor(xa)) - self.x0, 0)
                c1 = min(int(np.ceil(xb)) - self.x0, w)
                if c1 > c0:
                    tile = self.tile[:, r0:r1, c0:c1]
                    yield tile, self.dx[:, c0:c1], self.dy[r0:r1], r0, r1, c0


def _outer_span(m: np.ndarray, cx: float, cy: float, y0: float, y1: float, pad: float = 2.0):
    """The x-interval covering the ellipse {d : d^T m d <= 1} around (cx, cy) on rows y0..y1.

    None if the ellipse misses those rows. Its left edge x(y) is convex and its right
    edge concave, so their extremes over the band are at the band's row nearest the
    ellipse's leftmost (rightmost) point. Plain floats: this runs once per strip.
    """
    m00, m01, m11 = float(m[0, 0]), float(m[0, 1]), float(m[1, 1])
    det = m00 * m11 - m01 * m01
    y_max = math.sqrt(m00 / det)
    lo, hi = max(y0 - pad - cy, -y_max), min(y1 + pad - cy, y_max)
    if lo > hi:
        return None
    y_left = min(max(m01 / math.sqrt(m11 * det), lo), hi)
    y_right = min(max(-m01 / math.sqrt(m11 * det), lo), hi)
    left = (-m01 * y_left - math.sqrt(max(m00 - det * y_left * y_left, 0.0))) / m00
    right = (-m01 * y_right + math.sqrt(max(m00 - det * y_right * y_right, 0.0))) / m00
    return cx + left - pad, cx + right + pad


def _inner_span(m: np.ndarray, cx: float, cy: float, y0: float, y1: float, margin: float):
    """An x-interval fully inside the ellipse on all rows y0..y1 (None if there is none).

    The ellipse is convex, so its chord over a band is narrowest at one of the band's ends.
    """
    m00, m01, m11 = float(m[0, 0]), float(m[0, 1]), float(m[1, 1])
    det = m00 * m11 - m01 * m01
    lo, hi = -math.inf, math.inf
    for y in (y0 - margin - cy, y1 + margin - cy):
        disc = m00 - det * y * y
        if disc <= 0:
            return None
        root = math.sqrt(disc)
        lo = max(lo, (-m01 * y - root) / m00 + cx + margin)
        hi = min(hi, (-m01 * y + root) / m00 + cx - margin)
    return (lo, hi) if hi > lo else None


@dataclass(frozen=True)
class _Mouth:
    """The drawn mouth's frame and contours (pixels), from one frame's keypoints: _draw_mouth
    draws them, keypoints_2d pins points on them. Across the mouth ``un`` runs -1..1 corner
    to corner (0 at the lips' centre); along ``ev`` (down the face) each contour sits at
    ``height * sqrt(1 - un^2) + smile * (1 - un^2)`` (the upper lip's outer edge with the
    cupid's bow too)."""

    mid: np.ndarray  # [2] between the corners
    hw: float  # half the corners' distance
    eu: np.ndarray  # [2] unit vector corner to corner
    ev: np.ndarray  # [2] unit vector down the face
    uc: float  # the lips' centre across the mouth, in half-widths
    top: float  # the outer edges' heights at the centre (negative: above mid)
    bot: float
    it: float  # the inner edges' heights at the centre
    ib: float
    smile: float
    teeth_h: float  # how far the upper teeth show below the upper lip's inner edge

    @property
    def gap(self) -> float:
        return self.ib - self.it

    @property
    def k_left(self) -> float:
        return 1.0 / (1.0 + self.uc)

    @property
    def k_right(self) -> float:
        return 1.0 / (1.0 - self.uc)

    @classmethod
    def of(cls, p: np.ndarray, p0: np.ndarray, su: float, pout: float) -> _Mouth:
        def frame(pts: np.ndarray):
            lc, rc = pts[rig.MOUTH_CORNER_L], pts[rig.MOUTH_CORNER_R]
            mid = (lc + rc) / 2.0
            hw = float(np.linalg.norm(rc - lc)) / 2.0 + 1e-6
            eu = (rc - lc) / (2.0 * hw)
            ev = np.array([-eu[1], eu[0]])
            h_up = -float(np.dot(pts[rig.LIP_UPPER] - mid, ev))
            h_lo = float(np.dot(pts[rig.LIP_LOWER] - mid, ev))
            return mid, hw, eu, ev, h_up, h_lo

        mid, hw, eu, ev, h_up, h_lo = frame(p)
        _, hw0, _, _, h_up0, h_lo0 = frame(p0)
        centre = (p[rig.LIP_UPPER] + p[rig.LIP_LOWER]) / 2.0
        uc = float(np.clip(np.dot(centre - mid, eu) / hw, -0.6, 0.6))  # lips' centre, in 3/4
        # Rounded lips pout: MOUTH_INNER comes forward, the corners come in.
        pucker = float(np.clip(max(pout, (1.0 - hw / hw0) / 0.35), 0.0, 1.0))
        it = -(h_up - h_up0)  # the inner edges at the centre (px, + is down)
        ib = h_lo - h_lo0
        if ib < it:  # pressed together: the lips get thinner
            it = ib = 0.5 * (it + ib)
        top = -h_up - pucker * 0.006 * su
        bot = h_lo + pucker * 0.009 * su
        smile = SMILE * su * (1.0 - 0.8 * pucker)
        gap = ib - it
        teeth_h = min(0.3 * gap, 0.024 * su) if gap > 0.25 else 0.0
        return cls(mid, hw, eu, ev, uc, top, bot, it, ib, smile, teeth_h)

    def points(self, un: np.ndarray) -> np.ndarray:
        """[5 * n, 2] points on the upper lip's outer and inner edges, the upper teeth's edge,
        then the lower lip's inner and outer edges, at ``un`` [n] across the mouth."""
        un = np.asarray(un, dtype=np.float64)
        shape, bend = np.sqrt(np.clip(1.0 - un * un, 0.0, 1.0)), self.smile * (1.0 - un * un)
        bow = 1.0 - 0.28 / (1.0 + un * un * 40.0)
        heights = [
            self.top * shape * bow,
            self.it * shape,
            self.it * shape + self.teeth_h,
            self.ib * shape,
            self.bot * shape,
        ]
        uu = self.uc + un / np.where(un > 0, self.k_right, self.k_left)
        across = self.mid + (uu * self.hw)[:, None] * self.eu
        return np.concatenate([across + (h + bend)[:, None] * self.ev for h in heights])


@dataclass(frozen=True)
class _Lids:
    """One eye's drawn lids: its centre and axes, and where the lid edges cross the eye's
    vertical axis (eye radii; the rig's lid keypoints' travel mapped onto the drawing, so
    that the rig's blink shuts the eye). The drawing (:meth:`DemoAvatar._draw_eye`) and the
    warp's correspondence (:meth:`DemoAvatar.keypoints_2d`) both read the edges from here."""

    a: np.ndarray  # [2, 2] pixel images of the eye's u and v radii
    c: np.ndarray  # [2] the eye's centre
    vu: float  # the upper lid edge at the centre (eye v units, + down)
    vl: float
    openness: float  # 1 at rest, 0 shut
    arch_u: float  # the upper edge's rise towards the corners (a shut lid curves down)
    arch_l: float

    @classmethod
    def of(cls, p: np.ndarray, p0: np.ndarray, jac: np.ndarray, up: int, lo: int) -> _Lids:
        a = jac * np.array(EYE_RADII)
        c = (p0[up] + p0[lo]) / 2.0
        ainv = _inv2(a)

        def v_of(q: np.ndarray) -> float:
            return float(ainv[2] * (q[0] - c[0]) + ainv[3] * (q[1] - c[1]))

        # Lid travel as a fraction of the rest gap, mapped onto the drawn eye.
        gap0 = v_of(p0[lo]) - v_of(p0[up])
        gap0 = gap0 if abs(gap0) > 1e-9 else 1e-9
        vu = LID_UPPER_REST + (v_of(p[up]) - v_of(p0[up])) / gap0 * _LID_TRAVEL_UP
        vl = LID_LOWER_REST + (v_of(p[lo]) - v_of(p0[lo])) / gap0 * _LID_TRAVEL_LO
        vu, vl = max(vu, -1.1), min(vl, 1.1)
        if vu > vl:
            vu = vl = 0.5 * (vu + vl)
        openness = min((vl - vu) / (LID_LOWER_REST - LID_UPPER_REST), 1.0)
        return cls(a, c, vu, vl, openness, -0.16 + 0.44 * openness, 0.20 - 0.02 * openness)

    def points(self, un: np.ndarray) -> np.ndarray:
        """[2 * n, 2] points on the upper, then the lower lid edge at ``un`` [n] across."""
        un = np.asarray(un, dtype=np.float64)
        upper = self.vu + self.arch_u * un * un
        lower = self.vl - self.arch_l * un * un
        return np.concatenate(
            [
                self.c + np.outer(un, self.a[:, 0]) + np.outer(v, self.a[:, 1])
                for v in (upper, lower)
            ]
        )


@dataclass
class _Frame:
    """One frame's pose and keypoints in pixels (p: with the expression, p0: without)."""

    rot: np.ndarray  # [3, 3] float64
    su: float  # pixels per keypoint unit: scale * size / 2
    p: np.ndarray  # [21, 2] float64
    p0: np.ndarray  # [21, 2]
    t: np.ndarray  # [3] keypoint units
    pout: float  # how far MOUTH_INNER is pushed towards the camera, per rig.LIP_ROUND_Z

    def jac(self, axes: np.ndarray) -> np.ndarray:
        """Pixel images [2, k] of head-local vectors [3, k]."""
        return self.su * (self.rot @ axes)[:2]


def _eye_corners(p0: np.ndarray, rot: np.ndarray, su: np.ndarray) -> np.ndarray:
    """[K, 4, 2] the corners of both eyes' whites (they stay with the head: the lids move
    between them), as _draw_eye places them."""
    out = []
    for up, lo in _EYES:
        axis = su[:, None] * (rot @ _FRAMES[up])[:, :2, 0] * EYE_RADII[0]  # the eye's u axis
        c = (p0[:, up] + p0[:, lo]) / 2.0
        out += [c - EYE_CORNER_U * axis, c + EYE_CORNER_U * axis]
    return np.stack(out, axis=1)


def _head_surface(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """[n, 3] head-local points on the skull's front at (x, y) (keypoint units)."""
    rx, ry, rz = HEAD_RADII
    z = rz * np.sqrt(np.clip(1.0 - (x / rx) ** 2 - (y / ry) ** 2, 0.0, None))
    return np.stack([x, y, z], 1)


_FRINGE_X = np.array([-0.16, -0.08, 0.0, 0.08, 0.16])
# across the mouth, where the lips' edges are pinned
_LIP_POINTS_UN = np.array([-0.6, -0.3, 0.0, 0.3, 0.6])
_LID_POINTS_UN = np.array([-0.5, 0.5])  # across an eye (besides its centre), where the lids are
# the eyes' lid keypoints, (upper, lower) left then right, and those indices in drawing order
_EYES = ((rig.LID_UPPER_L, rig.LID_LOWER_L), (rig.LID_UPPER_R, rig.LID_LOWER_R))
_LID_KP = [k for eye in _EYES for k in eye]
# the fringe's edge at its locks' tips
_FRINGE_LOCAL = _head_surface(_FRINGE_X, HAIR_FRINGE_Y + HAIR_SWEEP * _FRINGE_X + HAIR_FRINGE_WAVE)


def _outline_points(c: np.ndarray, rot: np.ndarray, su: np.ndarray, e2: np.ndarray) -> np.ndarray:
    """[K, n, 2] points on the head's outline around its lower half (the jaw line), at
    :data:`OUTLINE_ANGLES` from the head's "down" ``e2`` [K, 2] about its centre ``c``."""
    out = np.empty((c.shape[0], OUTLINE_ANGLES.size, 2))
    for k in range(c.shape[0]):
        m2 = _silhouette(HEAD_RADII, rot[k], float(su[k]))[1]
        e1 = np.array([e2[k, 1], -e2[k, 0]])
        u = _OUTLINE_COS[:, None] * e2[k] + _OUTLINE_SIN[:, None] * e1  # directions around "down"
        r = 1.0 / np.sqrt(np.einsum("nd,de,ne->n", u, m2, u))
        out[k] = c[k] + r[:, None] * u
    return out


def _on_head(c: np.ndarray, rot: np.ndarray, su: np.ndarray, local: np.ndarray) -> np.ndarray:
    """[K, n, 2] pixels of head-local points ``local`` [n, 3] (they move with the head only)."""
    return c[:, None] + su[:, None, None] * np.einsum("kij,nj->kni", rot, local)[..., :2]


class DemoAvatar(Renderer):
    """Renders the demo character from 265-dim Ditto motion vectors.

    ``size`` is the side of the square RGB image (even, 64..2048); every size shows
    the same picture. An instance keeps its canvas between calls, so give each thread
    its own.
    """

    def __init__(self, size: int = 512) -> None:
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
            raise ValueError(f"size must be an int, got {type(size).__name__}")
        size = int(size)
        if not MIN_SIZE <= size <= MAX_SIZE or size % 2:
            raise ValueError(f"size must be even and in [{MIN_SIZE}, {MAX_SIZE}], got {size}")
        super().__init__(size)
        self._pc = np.arange(size, dtype=np.float32) + np.float32(0.5)  # pixel centres
        self._bg = self._own_bg = self._background()
        self._body = self._body_sprite()
        self._bg8 = np.ascontiguousarray((self._bg + 0.5).astype(np.uint8).transpose(1, 2, 0))
        self._canvas = self._bg.copy()
        self._backdrop: tuple[int, int, int] | None = None
        self._scratch = np.empty(0, dtype=np.float32)
        self._dirty: list[list[int] | None] = [None, None]  # [y0, y1, x0, x1] per group

    # --- public -------------------------------------------------------------------
    def render(self, motion: np.ndarray) -> np.ndarray:
        """[265] motion -> [size, size, 3] uint8 RGB."""
        m = np.asarray(motion)
        if m.shape != (layout.MOTION_DIM,):
            raise ValueError(
                f"render() takes one motion frame of shape [{layout.MOTION_DIM}], got "
                f"{list(m.shape)}; use render_batch() for [K, {layout.MOTION_DIM}]"
            )
        return self.render_batch(m[None])[0]

    def render_batch(self, motion: np.ndarray, frames: np.ndarray | None = None) -> np.ndarray:
        """[K, 265] motion -> [K, size, size, 3] uint8 RGB (``frames``: not needed, the
        character is the same in every frame)."""
        m = np.asarray(motion)
        if m.ndim != 2 or m.shape[1] != layout.MOTION_DIM:
            raise ValueError(
                f"render_batch() takes motion of shape [K, {layout.MOTION_DIM}], "
                f"got {list(m.shape)}"
            )
        if not np.issubdtype(m.dtype, np.number) or not np.all(np.isfinite(m)):
            raise ValueError("motion must hold finite numbers (found NaN, inf or non-numbers)")
        out = np.empty((m.shape[0], self.size, self.size, 3), dtype=np.uint8)
        if m.shape[0] == 0:
            return out
        fr = layout.unpack(m.astype(np.float32))
        pose = (fr.pitch, fr.yaw, fr.roll, fr.t, fr.scale)
        kp = layout.transform_keypoints(rig.CANONICAL_KP, *pose, fr.exp)
        kp0 = kp - fr.scale[:, None, None] * fr.exp  # the same pose without the expression
        rot = layout.rotation_matrices(fr.pitch, fr.yaw, fr.roll)
        half = self.size / 2.0
        i_in = rig.MOUTH_INNER
        for k in range(m.shape[0]):
            f = _Frame(
                rot=rot[k],
                su=float(fr.scale[k]) * half,
                p=(kp[k, :, :2].astype(np.float64) + 1.0) * half,
                p0=(kp0[k, :, :2].astype(np.float64) + 1.0) * half,
                t=fr.t[k].astype(np.float64),
                pout=float(kp[k, i_in, 2] - kp0[k, i_in, 2]) / (fr.scale[k] * rig.LIP_ROUND_Z),
            )
            self._draw(f, out[k])
        return out

    def set_backdrop(self, colour: tuple[int, int, int] | None) -> None:
        """The character over a solid ``colour`` instead of its backdrop (None: that again)."""
        if colour is None:
            bg = self._own_bg
        else:
            bg = np.empty_like(self._own_bg)
            bg[:] = np.asarray(colour, np.float32)[:, None, None]
        self._backdrop = None if colour is None else tuple(int(c) for c in colour)
        self._bg = bg
        self._bg8 = np.ascontiguousarray((bg + 0.5).astype(np.uint8).transpose(1, 2, 0))
        self._canvas = bg.copy()

    def keypoints_2d(self, motion: np.ndarray) -> np.ndarray:
        """[K, 265] motion -> [K, 81, 2] pixel positions of the rig's 21 keypoints, where
        :meth:`render_batch` draws them (the chin and the jaw where the open jaw's stretch of
        the lower face puts them: the drawing moves them with JAW's drop; the lid keypoints
        where the drawn lid edges cross the eyes' centres), 8 points on the head's outline
        around the jaw line (stretched alike), the 4 corners of the eyes, 5 on the fringe's
        edge (they move with the head, not with the brows below them), 25 on the lips' outer
        and inner edges and the upper teeth's edge (so the lips and teeth keep their size and
        only the mouth between them opens), 10 points on the torso, and 8 on the lid edges
        (two across each lid, so the lids close as drawn and the eye under them is not
        dragged along): the correspondence an in-between is warped by (the more of the
        drawing's own geometry it pins, the less the warp guesses)."""
        fr = layout.unpack(np.asarray(motion, dtype=np.float32).reshape(-1, layout.MOTION_DIM))
        kp = layout.transform_keypoints(
            rig.CANONICAL_KP, fr.pitch, fr.yaw, fr.roll, fr.t, fr.scale, fr.exp
        ).astype(np.float64)
        kp0 = kp - fr.scale[:, None, None] * fr.exp  # the same pose without the expression
        half = self.size / 2.0
        p, p0 = (kp[:, :, :2] + 1.0) * half, (kp0[:, :, :2] + 1.0) * half
        rot = layout.rotation_matrices(fr.pitch, fr.yaw, fr.roll)
        e2 = rot[:, :2, 1] / (np.linalg.norm(rot[:, :2, 1], axis=1, keepdims=True) + 1e-12)
        su = fr.scale.astype(np.float64) * half
        drop = np.maximum(np.einsum("kd,kd->k", p[:, rig.JAW] - p0[:, rig.JAW], e2), 0.0)
        pivot = JAW_PIVOT * su
        kd = drop / (float(HEAD_RADII[1]) * su - pivot + drop)
        stretch = (kd / (1.0 - kd))[:, None]

        def stretched(q: np.ndarray) -> np.ndarray:  # [K, n, 2] plain-face points, as drawn
            below = np.einsum("knd,kd->kn", q - p[:, None, rig.HEAD_CENTER], e2) - pivot[:, None]
            return q + (np.maximum(below, 0.0) * stretch)[..., None] * e2[:, None]

        p[:, [rig.CHIN, rig.JAW]] = stretched(p0[:, [rig.CHIN, rig.JAW]])
        outline = stretched(_outline_points(p[:, rig.HEAD_CENTER], rot, su, e2))
        corners = _eye_corners(p0, rot, su)
        fringe = _on_head(p[:, rig.HEAD_CENTER], rot, su, _FRINGE_LOCAL)
        pout = (kp[:, rig.MOUTH_INNER, 2] - kp0[:, rig.MOUTH_INNER, 2]) / (
            fr.scale * rig.LIP_ROUND_Z
        )
        lips = np.stack(
            [
                _Mouth.of(p[k], p0[k], float(su[k]), float(pout[k])).points(_LIP_POINTS_UN)
                for k in range(p.shape[0])
            ]
        )
        body = self._body_points(fr.t, rot)
        lids = np.stack([self._lid_points(p[k], p0[k], rot[k], su[k]) for k in range(p.shape[0])])
        p[:, _LID_KP] = lids[:, :4]  # the rig's lid keypoints where the lid edges are drawn
        return np.concatenate([p, outline, corners, fringe, lips, body, lids[:, 4:]], axis=1)

    @staticmethod
    def _lid_points(p: np.ndarray, p0: np.ndarray, rot: np.ndarray, su: float) -> np.ndarray:
        """[4 + 4 * n, 2] one frame's drawn lid edges: at the eyes' centres (the left eye's
        upper and lower, then the right's, in :data:`_LID_KP`'s order), then at
        :data:`_LID_POINTS_UN` across each eye (upper, lower; left, right)."""
        centres, across = [], []
        for up, lo in _EYES:
            lids = _Lids.of(p, p0, su * (rot @ _FRAMES[up])[:2], up, lo)
            centres.append(lids.points(np.zeros(1)))
            across.append(lids.points(_LID_POINTS_UN))
        return np.concatenate(centres + across)

    def _body_points(self, t: np.ndarray, rot: np.ndarray) -> np.ndarray:
        """[K, 10, 2] points on the collar and shoulders, which slide as _draw_body slides
        them (they pin the torso for a warp: it does not follow the head)."""
        half = self.size / 2.0
        limit = self._body[1]
        shift = np.clip(half * (0.4 * t[:, 0] + 0.06 * rot[:, 0, 2]), -limit, limit - 1e-3)
        xs = half + half * np.array([-0.6, -0.3, 0.0, 0.3, 0.6])
        ys = half * np.array([1.62, 1.9])
        grid = np.stack(np.meshgrid(xs, ys), -1).reshape(-1, 2)
        return grid[None] + np.stack([shift, np.zeros_like(shift)], -1)[:, None]

    # --- canvas -------------------------------------------------------------------
    def _box(self, cx: float, cy: float, hx: float, hy: float, pad: float = 2.0) -> _Box | None:
        """A working copy of the canvas box around (cx, cy) +- (hx, hy), or None if off-frame."""
        cx, cy, hx, hy = float(cx), float(cy), float(hx), float(hy)
        x0 = max(math.floor(cx - hx - pad), 0)
        x1 = min(math.ceil(cx + hx + pad), self.size)
        y0 = max(math.floor(cy - hy - pad), 0)
        y1 = min(math.ceil(cy + hy + pad), self.size)
        if x1 <= x0 or y1 <= y0:
            return None
        dx = (self._pc[x0:x1] - np.float32(cx))[None, :]
        dy = (self._pc[y0:y1] - np.float32(cy))[:, None]
        # The working copy lives in a reused buffer: a fresh large array would page-fault.
        # So one box at a time: each is _put() before the next _box().
        need = 3 * (y1 - y0) * (x1 - x0)
        if self._scratch.size < need:
            self._scratch = np.empty(need, dtype=np.float32)
        tile = self._scratch[:need].reshape(3, y1 - y0, x1 - x0)
        np.copyto(tile, self._canvas[:, y0:y1, x0:x1])
        return _Box(tile, dx, dy, y0, x0)

    def _put(self, box: _Box, group: int = 0) -> None:
        """Write a box back to the canvas and mark it for this frame's output."""
        h, w = box.tile.shape[1:]
        y1, x1 = box.y0 + h, box.x0 + w
        self._canvas[:, box.y0 : y1, box.x0 : x1] = box.tile
        d = self._dirty[group]
        if d is None:
            self._dirty[group] = [box.y0, y1, box.x0, x1]
        else:
            d[:] = [min(d[0], box.y0), max(d[1], y1), min(d[2], box.x0), max(d[3], x1)]

    def _background(self) -> np.ndarray:
        """The static backdrop [3, H, W]: a soft gradient, a glow behind the head, bokeh."""
        n = self.size
        y = ((np.arange(n, dtype=np.float32) + 0.5) / n)[:, None]
        x = ((np.arange(n, dtype=np.float32) + 0.5) / n)[None, :]
        t = np.broadcast_to(_smooth(y, 0.0, 1.0), (n, n))
        img = np.stack(_mix(BG_TOP, BG_BOTTOM, t)).astype(np.float32)
        r2 = ((x - 0.5) / 0.42) ** 2 + ((y - 0.44) / 0.46) ** 2
        _blend(img, 0.55 * np.exp(-1.6 * r2), BG_GLOW)
        for bx, by, br, alpha in (
            (0.12, 0.18, 0.075, 0.22),
            (0.86, 0.13, 0.05, 0.20),
            (0.90, 0.52, 0.09, 0.14),
            (0.08, 0.62, 0.055, 0.16),
            (0.22, 0.40, 0.03, 0.18),
            (0.78, 0.34, 0.028, 0.20),
        ):
            d = (np.sqrt((x - bx) ** 2 + (y - by) ** 2) - br) * n
            _blend(img, alpha * np.clip(0.5 - d / 3.0, 0.0, 1.0), BG_GLOW)
        vignette = ((x - 0.5) ** 2 + (y - 0.5) ** 2) * 2.0
        img *= 1.0 - 0.16 * vignette**1.5
        return np.ascontiguousarray(img, dtype=np.float32)

    # --- the frame ----------------------------------------------------------------
    def _draw(self, f: _Frame, out: np.ndarray) -> None:
        head = self._head_geometry(f)
        self._draw_body(f, head)
        self._draw_hair_back(f, head)
        head_box, head_cov = self._draw_head(f, head)
        self._draw_ears(f, head_box, head_cov)
        self._draw_cheeks(f)
        self._draw_nose(f)
        for (up, lo), side in zip(_EYES, (-1.0, 1.0), strict=True):
            self._draw_eye(f, up, lo, side)
        self._draw_brow(f, rig.BROW_L, -1.0)
        self._draw_brow(f, rig.BROW_R, 1.0)
        self._draw_mouth(f)
        # Output: the background, then the boxes drawn this frame; then reset those.
        np.copyto(out, self._bg8)
        rects = [d for d in self._dirty if d is not None]
        for y0, y1, x0, x1 in rects:
            src = self._canvas[:, y0:y1, x0:x1]
            for ch in range(3):  # +0.5 rounds; every colour is a convex mix in [0, 255]
                np.add(src[ch], 0.5, out=out[y0:y1, x0:x1, ch], casting="unsafe")
        for y0, y1, x0, x1 in rects:
            self._canvas[:, y0:y1, x0:x1] = self._bg[:, y0:y1, x0:x1]
        self._dirty = [None, None]

    def _head_geometry(self, f: _Frame) -> dict:
        """The head ellipsoid in pixels: its projection, its 2-D axes and the jaw drop."""
        b3, m2 = _silhouette(HEAD_RADII, f.rot, f.su)
        e2 = f.rot[:2, 1] / (np.linalg.norm(f.rot[:2, 1]) + 1e-12)  # the head's "down"
        e1 = np.array([e2[1], -e2[0]])
        drop = max(float(np.dot(f.p[rig.JAW] - f.p0[rig.JAW], e2)), 0.0)
        return {
            "c": f.p[rig.HEAD_CENTER],
            "b3": b3,
            "m2": m2,
            "m2inv": np.linalg.inv(m2),
            "e1": e1,
            "e2": e2,
            "drop": drop,
        }

    def _body_sprite(self) -> tuple[int, int, np.ndarray, np.ndarray]:
        """The torso in its T-shirt and crew collar, drawn once, premultiplied.

        Returns (top row, largest shift, planes [4, pad + h * size + pad] of premultiplied
        RGB and alpha, flattened row after row, and their differences P[k - 1] - P[k]).
        Frames slide it sideways by a fraction of a pixel too (linear interpolation). A
        sideways shift of whole rows is a shift of the flat array: contiguous, so fast;
        the pixels that wrap from one row's end to the next row's start are transparent.
        """
        n = self.size
        half = n / 2.0
        rx, ry, cy = 0.86 * half, 0.44 * half, 2.0 * half
        top = max(int(np.floor(cy - ry - 2.0)), 0)
        dx = (np.arange(n, dtype=np.float32) + 0.5 - half)[None, :]
        dy = (np.arange(top, n, dtype=np.float32) + 0.5 - cy)[:, None]
        planes = np.zeros((4, n - top, n), dtype=np.float32)

        def layer(cov: np.ndarray, col) -> None:
            for ch in range(3):
                planes[ch] = planes[ch] * (1.0 - cov) + col[ch] * cov
            planes[3] = planes[3] * (1.0 - cov) + cov

        d, k2 = _axis_ellipse(dx, dy, rx, ry)
        ndl = (dx * (-0.45 / rx) + dy * (-0.55 / ry)) + 0.7 * np.sqrt(np.clip(1.0 - k2, 0, 1))
        layer(_cov(d), _mix(SHIRT_SHADE, SHIRT_LIT, _ramp(ndl, -0.1, 0.75)))
        # The neckline inside a collar band.
        nr = NECK_RADIUS * half
        ndy = dy - np.float32(NECK_BASE * half - cy)
        d_out, _ = _axis_ellipse(dx, ndy, 1.5 * nr, 0.85 * nr)
        d_in, _ = _axis_ellipse(dx, ndy, 1.2 * nr, 0.6 * nr)
        layer(_cov(d_out), COLLAR)
        tone = np.broadcast_to(np.clip(ndy * (0.5 / (0.6 * nr)) + 0.5, 0, 1), d_in.shape)
        layer(_cov(d_in), _mix(SKIN_DEEP, SKIN_SHADE, tone))
        clear = int(np.argmax(planes[3].max(axis=0) > 0.0))  # transparent columns each side
        limit = max(min(int(BODY_SHIFT * n), clear - 2), 0)
        pad = limit + 2
        flat = np.zeros((4, (n - top) * n + 2 * pad), dtype=np.float32)
        flat[:, pad:-pad] = planes.reshape(4, -1)
        diff = np.zeros_like(flat)
        diff[:, 1:] = flat[:, :-1] - flat[:, 1:]
        return top, limit, flat, diff

    def _draw_body(self, f: _Frame, head: dict) -> None:
        """The shoulders (sliding a little with t and yaw) and the neck up to the head."""
        n = self.size
        half = n / 2.0
        top, limit, flat, diff = self._body
        pad = limit + 2
        shift = half * (0.4 * f.t[0] + 0.06 * float(f.rot[0, 2]))  # rot[0, 2] ~ sin(yaw)
        shift = float(np.clip(shift, -limit, limit - 1e-3))
        i = int(np.floor(shift))
        frac = np.float32(shift - i)
        step = max(1, 32768 // n)
        for r0 in range(0, n - top, step):
            r1 = min(n - top, r0 + step)
            src = slice(pad + r0 * n - i, pad + r1 * n - i)  # canvas pixel k <- sprite k - i
            alpha = flat[3, src] + frac * diff[3, src]
            keep = 1.0 - alpha
            for ch in range(3):  # the canvas here is still the background
                dst = self._canvas[ch, top + r0 : top + r1].reshape(-1)
                np.multiply(self._bg[ch, top + r0 : top + r1].reshape(-1), keep, out=dst)
                dst += flat[ch, src]
                dst += frac * diff[ch, src]
        self._dirty[1] = [top, n, 0, n]
        bottom = np.array([half + shift, NECK_BASE * half])
        top_pt = head["c"] + f.jac(np.array([0.0, 0.22, -0.06]))
        self._draw_neck(top_pt, bottom, NECK_RADIUS * half, head)

    def _draw_neck(self, top: np.ndarray, bottom: np.ndarray, r: float, head: dict) -> None:
        """A shaded column from under the jaw into the collar, with the jaw's shadow."""
        axis = bottom - top
        length = float(np.linalg.norm(axis)) + 1e-6
        ax, ay = float(axis[0]) / length, float(axis[1]) / length
        cx, cy = (top + bottom) / 2.0
        # The box starts at the top point: the cap above it is always behind the head.
        y0, y1 = min(top[1], bottom[1] + r), max(top[1], bottom[1] + r)
        box = self._box(cx, (y0 + y1) / 2.0, abs(axis[0]) / 2 + r, (y1 - y0) / 2.0)
        if box is None:
            return
        dx, dy = box.dx, box.dy + np.float32((y0 + y1) / 2.0 - cy)  # offsets from (cx, cy)
        ox, oy = float(cx - top[0]), float(cy - top[1])  # box grid -> offsets from `top`
        along = _clip01(_affine(dx, dy, ax / length, ay / length, (ox * ax + oy * ay) / length))
        across = _affine(dx, dy, -ay / r, ax / r, (-ox * ay + oy * ax) / r)
        ex = _affine(dx, dy, 1.0, 0.0, ox) - along * (ax * length)
        ey = _affine(dx, dy, 0.0, 1.0, oy) - along * (ay * length)
        d = np.sqrt(ex * ex + ey * ey) - r
        tone = _smooth(across, 0.9, -0.8)
        # The jaw's shadow: the head outline pushed down a little, softened.
        m = head["m2"].tolist()
        hx = dx + np.float32(cx - head["c"][0])
        hy = dy + np.float32(cy - head["c"][1] - 0.16 * r)
        qq = (m[0][0] * hx * hx + m[1][1] * hy * hy) + (2.0 * m[0][1]) * hx * hy
        shadow = _clip01((1.25 - qq) * 1.6)
        col = _mix(_mix(SKIN_DEEP, SKIN_SHADE, tone), _mul(SKIN_DEEP, 0.86), shadow)
        _blend(box.tile, _cov(d), col)
        self._put(box)

    def _draw_hair_back(self, f: _Frame, head: dict) -> None:
        """The hair's volume behind the skull: a larger ellipsoid, cut off at ear level."""
        center = head["c"] + f.jac(np.array([0.0, -0.045, -0.05]))
        _, m2 = _silhouette(HEAD_RADII + HAIR_SHELL, f.rot, f.su)
        mi = np.linalg.inv(m2)
        hx, hy = float(np.sqrt(mi[0, 0])), float(np.sqrt(mi[1, 1]))
        e2x, e2y = head["e2"].tolist()
        cut = float((center - head["c"]) @ head["e2"]) - 0.02 * f.su
        # Nothing below the cut line: stop the box at its lowest point.
        y_low = (abs(e2x) * hx - cut) / max(e2y, 1e-3) + 1.0
        cy = center[1] + 0.5 * (min(hy, y_low) - hy)
        box = self._box(center[0], cy, hx, 0.5 * (min(hy, y_low) + hy))
        if box is None:
            return
        oy = float(cy - center[1])
        ainv = tuple(np.linalg.cholesky(m2).T.reshape(-1).tolist())  # m2 = L^T L
        dark = _mul(HAIR_SHADE, 0.8)
        hc, m_in = head["c"], head["m2"]

        def spans(y0: float, y1: float) -> list:
            # The shell shows only around the head: skip the head's fully covered middle.
            outer = _outer_span(m2, center[0], center[1], y0, y1)
            if outer is None:
                return []
            inner = _inner_span(m_in, hc[0], hc[1], y0, y1, margin=2.0)
            if inner is None or inner[0] >= outer[1] or inner[1] <= outer[0]:
                return [outer]
            return [(outer[0], inner[0]), (inner[1], outer[1])]

        e1x, e1y = head["e1"].tolist()
        su = f.su
        inv_w = 1.0 / (HAIR_TUFT_WIDTH * su)
        for tile, dx, dy, _, _, _ in box.strips(spans):
            dyc = dy + oy
            dist, eu, ev = _ellipse(dx, dyc, ainv)
            # Head-aligned coordinates: curly bumps along the top, sides that sweep in.
            xh = _affine(dx, dyc, e1x, e1y)
            yh = _affine(dx, dyc, e2x, e2y)
            ph = xh * inv_w
            ph -= np.floor(ph)
            bump = np.sqrt(ph * (1.0 - ph)) * _clip01(yh * (-2.0 / (hy + 1e-6)) - 0.2)
            dist -= bump * (2.0 * HAIR_TUFT * su)
            below = (yh + cut) + (HAIR_SWEEP_UP * su) * (xh * xh) * (1.0 / (hx * hx))
            tone = _ramp(-0.45 * eu - 0.55 * ev, -0.9, 0.9)  # lit from the upper left
            _blend_mix(tile, _cov(dist) * _cov(below), dark, HAIR_LIT, tone)
        self._put(box)

    def _draw_head(self, f: _Frame, head: dict):
        """Ray-cast the tapered skull: softly lit skin, the hair cap, the fringe's shadow.

        Returns the head's box and its coverage there (the ears are hidden by it).
        """
        su, rot = f.su, f.rot
        c = head["c"]
        mi = head["m2inv"]
        hx, hy = np.sqrt(mi[0, 0]), np.sqrt(mi[1, 1])
        drop = head["drop"]
        x0, x1 = c[0] - hx, c[0] + hx
        y0, y1 = c[1] - hy, c[1] + hy + drop
        for e in (rig.EAR_L, rig.EAR_R):  # the box includes the ears
            r = 0.1 * su
            x0, x1 = min(x0, f.p[e, 0] - r), max(x1, f.p[e, 0] + r)
            y0, y1 = min(y0, f.p[e, 1] - r), max(y1, f.p[e, 1] + r)
        bcx, bcy = (x0 + x1) / 2, (y0 + y1) / 2
        box = self._box(bcx, bcy, (x1 - x0) / 2, (y1 - y0) / 2)
        if box is None:
            return None, None
        ox, oy = float(bcx - c[0]), float(bcy - c[1])
        e = np.stack([head["e1"], head["e2"]], axis=1)  # the head's 2-D axes (columns)
        (e1x, e1y), (e2x, e2y) = head["e1"].tolist(), head["e2"].tolist()
        # Everything below is linear in the warped head-2-D coordinates (xw, yw).
        mh = (e.T @ head["m2"] @ e).tolist()
        rad = float(np.sqrt(np.sqrt(1.0 / np.linalg.det(head["m2"]))))  # mean outline radius
        b3 = head["b3"]
        q = b3.T @ b3
        inv_qzz = 1.0 / float(q[2, 2])
        l1, l2 = (q[2, :2] @ e * inv_qzz).tolist()  # z = sqrt((1 - k0^2) / qzz) - l . w
        bs = (b3[:, :2] @ e).tolist()  # the unit-sphere point s = bs @ (xw, yw) + bz z
        bz = b3[:, 2].tolist()
        pivot = JAW_PIVOT * su  # the jaw stretches the face below this (head-2-D y, px)
        kd = drop / (float(HEAD_RADII[1]) * su - pivot + drop)
        rx, ry = float(HEAD_RADII[0]), float(HEAD_RADII[1])
        t0, t1 = 0.08 * su, 0.46 * su
        hair_max_sy = (HAIR_SIDE_Y + 0.02) / ry  # no hair below this on the unit sphere
        dskin = [SKIN_LIT[i] - SKIN_SHADE[i] for i in range(3)]
        dhair = [HAIR_LIT[i] - HAIR_SHADE[i] for i in range(3)]
        cov_all = np.zeros(box.tile.shape[1:], dtype=np.float32)
        m2 = head["m2"]
        dropped = c + drop * head["e2"]
        lb0, lb1 = (np.array(bs).T @ (rot.T @ _LIGHT)).tolist()  # ndl = lb . (xw, yw) + lbz z
        lbz = float(np.array(bz) @ (rot.T @ _LIGHT))
        sq_qzz = math.sqrt(inv_qzz)
        # The lowest screen row with hair: the top of the unit sphere (s_y <= h) seen
        # through the pixel map y = row . s.
        row = (su * (rot @ np.diag(HEAD_RADII)))[1]
        h = hair_max_sy
        rxz = math.hypot(row[0], row[2])
        norm = math.hypot(rxz, row[1])
        lowest = norm if row[1] / norm <= h else row[1] * h + math.sqrt(1 - h * h) * rxz
        hair_rows = int(math.ceil(c[1] + lowest + 2.0)) - box.y0

        def spans(y0: float, y1: float) -> list:
            # The outline, and the same shifted by the jaw's drop (the warp only adds that).
            a = _outer_span(m2, c[0], c[1], y0, y1)
            b = _outer_span(m2, dropped[0], dropped[1], y0, y1) if drop > 0.5 else None
            if a is None or b is None:
                return [s for s in (a, b) if s is not None]
            return [(min(a[0], b[0]), max(a[1], b[1]))]

        for tile, dx, dy, r0, r1, c0 in box.strips(spans, split=hair_rows):
            xa = (dx * e1x + (ox * e1x + oy * e1y)) + dy * e1y
            ya = (dx * e2x + (ox * e2x + oy * e2y)) + dy * e2y
            # Warp into the plain ellipsoid: a narrower chin, and a jaw that drops.
            ends_x = (float(dx[0, 0]) + ox, float(dx[0, -1]) + ox)
            ends_y = (float(dy[0, 0]) + oy, float(dy[-1, 0]) + oy)
            ya_max = max(e2x * x for x in ends_x) + max(e2y * y for y in ends_y)
            if ya_max > t0:
                taper = 1.0 - HEAD_TAPER * _smooth(ya, t0, t1)
                xw = xa / taper
            else:
                taper, xw = 1.0, xa
            yw = ya - _pos(ya - pivot) * kd if kd > 1e-4 else ya
            # Outline: k0 = 1 on the projected ellipse.
            k2 = xw * (mh[0][0] * xw + (2.0 * mh[0][1]) * yw) + yw * (mh[1][1] * yw)
            cov = _cov((np.sqrt(k2) - 1.0) * (rad * taper))
            cov_all[r0:r1, c0 : c0 + cov.shape[1]] = cov
            # Front surface: its depth z, and its facing ratio for a little occlusion.
            facing = np.sqrt(_clip01(1.0 - k2))
            z = facing * sq_qzz - (l1 * xw + l2 * yw)
            ndl = (lb0 * xw + lb1 * yw) + lbz * z
            tone = _smooth(ndl, -0.25, 0.7)
            shade = 0.86 + 0.14 * facing
            if r0 >= hair_rows:  # below the hairline: skin only
                for ch in range(3):
                    col = (SKIN_SHADE[ch] + tone * dskin[ch]) * shade
                    rc = tile[ch]
                    rc += cov * (col - rc)
                continue
            # The point on the unit sphere, for the hair cap: above a fringe of rounded
            # locks at the front, down to the temples.
            sx = (bs[0][0] * xw + bs[0][1] * yw) + bz[0] * z
            sy = (bs[1][0] * xw + bs[1][1] * yw) + bz[1] * z
            sz = (bs[2][0] * xw + bs[2][1] * yw) + bz[2] * z
            qx = rx * sx
            side = _ramp(np.abs(sx) / np.sqrt(sx * sx + sz * sz + 1e-6), 0.5, 0.9)
            side = np.maximum(side, _clip01(0.5 - sz * 10.0))
            ph = (qx + 0.02) * (1.0 / HAIR_LOCK_WIDTH)
            ph -= np.floor(ph)
            locks = np.sqrt(ph * (1.0 - ph))
            edge = (HAIR_FRINGE_Y + HAIR_SWEEP * qx) + (2.0 * HAIR_FRINGE_WAVE) * locks
            edge += side * (HAIR_SIDE_Y - edge)
            below = ry * sy - edge
            hair = _cov(below * su)
            shade *= 1.0 - (0.22 - 0.22 * side) * _clip01(1.0 - below * 20.0)  # fringe shadow
            shine = _clip01(1.0 - np.abs(ry * sy + 0.33) * (1.0 / 0.035))
            shine *= tone * (1.0 - side) * 0.8
            for ch in range(3):
                skin = (SKIN_SHADE[ch] + tone * dskin[ch]) * shade
                hcol = HAIR_SHADE[ch] + tone * dhair[ch]
                hcol += shine * (HAIR_SHINE[ch] - hcol)
                col = skin + hair * (hcol - skin)
                rc = tile[ch]
                rc += cov * (col - rc)
        self._put(box)
        return box, cov_all

    def _draw_ears(self, f: _Frame, head_box: _Box | None, head_cov: np.ndarray | None) -> None:
        """Ears: behind the head in a front view, in front of it once they turn to us."""
        if head_box is None:
            return
        for e in (rig.EAR_L, rig.EAR_R):
            axes, normal = _EAR_FRAMES[e]
            a = f.jac(axes * np.array(EAR_RADII))
            c = f.p[e]
            box = self._box(c[0], c[1], _norm(a[0]), _norm(a[1]))
            if box is None:
                continue
            row, col = box.y0 - head_box.y0, box.x0 - head_box.x0
            h, w = box.tile.shape[1:]
            hc = head_cov[row : row + h, col : col + w]
            if row < 0 or col < 0 or hc.shape != (h, w):
                continue
            k0, r = _disc_radius(box.dx, box.dy, a)
            nw = f.rot @ normal
            front = float(np.clip((nw[2] - 0.02) / 0.3, 0.0, 1.0))
            vis = _cov((k0 - 1.0) * r) * (1.0 - hc * (1.0 - front))
            lit = float(np.clip(nw @ _LIGHT, -1.0, 1.0))
            base = _lerp(SKIN_LIT, SKIN_SHADE, 0.55 - 0.35 * lit)
            inner = _cov((k0 - 0.58) * (0.29 * r)) * 0.75  # the ear's hollow, soft-edged
            _blend_mix(box.tile, vis, base, SKIN_DEEP, inner)
            self._put(box)

    def _draw_cheeks(self, f: _Frame) -> None:
        """Soft blush on the cheeks, foreshortened with the head."""
        for k in (rig.CHEEK_L, rig.CHEEK_R):
            a = f.jac(_FRAMES[k] * np.array(CHEEK_RADII))
            c = f.p[k] + f.jac(_FRAMES[k] @ np.array([0.0, 0.012]))
            box = self._box(c[0], c[1], _norm(a[0]), _norm(a[1]))
            if box is None:
                continue
            ia, ib, ic, id_ = _inv2(a)
            u = _affine(box.dx, box.dy, ia, ib)
            v = _affine(box.dx, box.dy, ic, id_)
            t = _clip01(1.0 - (u * u + v * v))
            _blend(box.tile, 0.42 * t * t, BLUSH)
            self._put(box)

    def _draw_nose(self, f: _Frame) -> None:
        """A button nose: a soft shadow below and right, a rounded tip, a highlight."""
        a = f.jac(_FRAMES[rig.NOSE] * np.array(NOSE_RADII))
        c = f.p[rig.NOSE]
        hx, hy = _norm(a[0]) * 1.4, _norm(a[1]) * 1.6
        box = self._box(c[0], c[1] + hy * 0.2, hx, hy)
        if box is None:
            return
        dx, dy = box.dx, box.dy + np.float32(hy * 0.2)
        ia, ib, ic, id_ = _inv2(a)
        r = math.sqrt(abs(float(np.linalg.det(a))))
        eu = _affine(dx, dy, ia, ib)
        ev = _affine(dx, dy, ic, id_)
        # The shadow: the tip's disc moved down and right (in screen pixels).
        off = f.su * 0.012
        su_, sv_ = ia * off * 0.5 + ib * off, ic * off * 0.5 + id_ * off
        ds = np.sqrt((eu - su_) ** 2 + (ev - sv_) ** 2)
        _blend(box.tile, _cov((ds - 1.0) * (0.4 * r)) * 0.55, SKIN_DEEP)
        d = (np.sqrt(eu * eu + ev * ev) - 1.0) * r
        tone = _smooth(eu * 0.6 + ev * 0.8, 0.9, -0.7)
        _blend_mix(box.tile, _cov(d), SKIN_SHADE, SKIN_LIT, tone)
        hl = _clip01(1.0 - ((eu + 0.35) ** 2 + (ev + 0.4) ** 2) * (1.0 / 0.09))
        _blend(box.tile, hl * 0.7, NOSE_HL)
        self._put(box)

    def _draw_eye(self, f: _Frame, up: int, lo: int, side: float) -> None:
        """White, iris, pupil and highlights, cut by the lids; lashes on the upper lid."""
        jac = f.jac(_FRAMES[up])
        lids = _Lids.of(f.p, f.p0, jac, up, lo)
        a, c, vu, vl, openness = lids.a, lids.c, lids.vu, lids.vl, lids.openness
        arch_u, arch_l = lids.arch_u, lids.arch_l
        ainv = _inv2(a)
        box = self._box(c[0], c[1], _norm(a[0]) * 1.3, _norm(a[1]) * 1.25)
        if box is None:
            return
        tile, dx, dy = box.tile, box.dx, box.dy
        d_eye, eu, ev = _ellipse(dx, dy, ainv)
        px_v = 1.0 / math.hypot(ainv[2], ainv[3])  # pixels per unit of eye v
        eu2 = eu * eu
        f_up = (vu - ev + arch_u * eu2) * px_v  # px above the upper lid edge
        lw = max(0.65, 0.0085 * f.su) * (1.3 - 0.3 * openness)
        if openness > 0.0:
            f_lo = (ev - vl + arch_l * eu2) * px_v  # px below the lower lid edge
            vis = _cov(d_eye) * _cov(f_up) * _cov(f_lo)
            _blend_mix(tile, vis, EYE_WHITE, EYE_WHITE_SHADE, _clip01(1.0 + f_up * 0.18))
            # Iris and pupil, moved by the gaze keypoint.
            g = (f.p[rig.GAZE] - f.p0[rig.GAZE]) * GAZE_GAIN
            ix = dx - np.float32(g[0])
            iy = dy - np.float32(g[1] + 0.05 * _norm(a[1]))
            ia = jac * np.array(IRIS_RADII)
            ja, jb, jc, jd = _inv2(ia)
            iu = _affine(ix, iy, ja, jb)
            iv = _affine(ix, iy, jc, jd)
            k0 = np.sqrt(iu * iu + iv * iv)
            ir = float(np.sqrt(abs(np.linalg.det(ia))))  # mean iris radius, px
            icol = _mix(IRIS_OUTER, IRIS_INNER, _ramp(iv, -0.7, 0.9))
            icol = _mix(icol, IRIS_RIM, _ramp(k0, 0.75, 1.0))
            icol = _mix(icol, PUPIL, _cov((k0 - PUPIL_SCALE) * ir))
            # Highlights sit towards the light, so they stay put as the eye turns.
            shine = None
            for hxo, hyo, hr, alpha in ((-0.38, -0.42, 0.30, 1.0), (0.40, 0.38, 0.14, 0.85)):
                hx2 = (ix - np.float32(hxo * ir)) ** 2
                hy2 = (iy - np.float32(hyo * ir)) ** 2
                dh = _cov(np.sqrt(hx2 + hy2) - np.float32(hr * ir))
                shine = dh if shine is None else np.maximum(shine, dh * alpha)
            icol = _mix(icol, EYE_WHITE, shine)
            _blend(tile, _cov((k0 - 1.0) * ir) * vis, icol)
            # A faint lower lid line.
            lower = _cov(np.abs(f_lo + 0.4) - 0.45 * lw) * _cov(d_eye - 0.3 * lw)
            _blend(tile, lower * (0.35 * openness), SKIN_DEEP)
        # The lash line along the upper lid edge (the whole shut lid in a blink).
        lash = _cov(np.abs(f_up + lw * 0.35) - lw) * _cov(d_eye - lw * 0.6)
        # A flick at the outer corner: a tapered stroke from the lid's end.
        ucorner = 0.93
        vcorner = vu + arch_u * ucorner * ucorner
        cx, cy = (a[:, 0] * (side * ucorner) + a[:, 1] * vcorner).tolist()
        tip = a[:, 0] * (side * 0.24) - a[:, 1] * 0.16
        tl = _norm(tip) + 1e-6
        tx, ty = float(tip[0]) / tl, float(tip[1]) / tl
        px = dx - np.float32(cx)
        py = dy - np.float32(cy)
        along = _clip01(_affine(px, py, tx / tl, ty / tl))
        ex = px - along * (tx * tl)
        ey = py - along * (ty * tl)
        flick = _cov(np.sqrt(ex * ex + ey * ey) - lw * (1.0 - 0.7 * along))
        _blend(tile, np.maximum(lash, flick), LASH)
        self._put(box)

    def _draw_brow(self, f: _Frame, b: int, side: float) -> None:
        """A soft arched brow, thicker at its inner end."""
        a = f.jac(_FRAMES[b]) * BROW_HALF_LENGTH
        c = f.p[b]
        box = self._box(c[0], c[1], _norm(a[0]) * 1.3, _norm(a[1]) * 1.3)
        if box is None:
            return
        ainv = _inv2(a)
        uo = _affine(box.dx, box.dy, ainv[0] * side, ainv[1] * side)  # +1 at the outer end
        v = _affine(box.dx, box.dy, ainv[2], ainv[3])
        pu = 1.0 / math.hypot(ainv[0], ainv[1])  # pixels per unit
        pv = 1.0 / math.hypot(ainv[2], ainv[3])
        curve = (0.30 * uo * uo - 0.30) + 0.10 * uo
        wid = (f.su * 0.016) * (0.7 + 0.9 * _clip01(0.5 - 0.5 * uo))
        du = _pos(np.abs(uo) - 1.0) * pu
        dv = (v - curve) * pv
        _blend(box.tile, _cov(np.sqrt(du * du + dv * dv) - wid), BROW_COL)
        self._put(box)

    def _draw_mouth(self, f: _Frame) -> None:
        """Lips between the corner and lip keypoints, a dark mouth with teeth when open."""
        su = f.su
        m = _Mouth.of(f.p, f.p0, su, f.pout)
        mid, hw, eu, ev, uc = m.mid, m.hw, m.eu, m.ev, m.uc
        it, ib, top, bot, gap, smile = m.it, m.ib, m.top, m.bot, m.gap, m.smile
        box = self._box(mid[0], mid[1], hw + 4.0, max(bot + smile, -top) + 3.0)
        if box is None:
            return
        tile = box.tile
        (eux, euy), (evx, evy) = eu.tolist(), ev.tolist()
        uu = _affine(box.dx, box.dy, eux / hw, euy / hw)
        vv = _affine(box.dx, box.dy, evx, evy)
        # un: across the mouth, -1..1 corner to corner, 0 at the lips' centre.
        k_left, k_right = m.k_left, m.k_right
        rel = uu - uc
        un = rel * ((rel > 0) * np.float32(k_right - k_left) + np.float32(k_left))
        un2 = un * un
        shape = np.sqrt(_clip01(1.0 - un2))
        bend = smile * (1.0 - un2)
        in_u = _cov((np.abs(uu) - 1.0) * hw)
        bow = 1.0 - 0.28 / (1.0 + un2 * 40.0)  # the cupid's bow dip of the upper lip
        c_top = (top * shape) * bow + bend
        c_bot = bot * shape + bend
        c_mid = (0.5 * (it + ib)) * shape + bend
        lips = _cov(c_top - vv) * _cov(vv - c_bot) * in_u
        lower = _clip01(0.5 + (vv - c_mid))
        sy = (vv - 0.5 * (c_mid + c_bot)) * (1.0 / (0.3 * bot + 1.0))
        shine = _clip01(1.0 - (un2 * 2.6 + sy * sy)) * lower
        _blend(tile, lips, _mix(_mix(LIP_UP, LIP_LO, lower), LIP_SHINE, shine * 0.6))
        if gap > 0.25:
            c_it = it * shape + bend
            c_ib = ib * shape + bend
            inner = _cov(c_it - vv) * _cov(vv - c_ib) * (in_u * min(1.0, gap))
            teeth_h = m.teeth_h
            teeth = _cov(vv - (c_it + teeth_h)) * _cov((np.abs(un) - 0.72) * hw)
            tongue = _cov((c_ib - 0.45 * gap * shape) - vv) * _cov((np.abs(un) - 0.8) * hw)
            _blend(tile, inner, _mix(_mix(MOUTH_IN, TONGUE, tongue * 0.9), TEETH, teeth))
        # The line where the lips meet; it fades out as the mouth opens.
        lw = max(0.6, 0.0055 * su)
        line = _cov(np.abs(vv - c_mid) - lw) * _cov((np.abs(uu) - 1.02) * hw)
        _blend(tile, line * float(np.clip(1.0 - gap / 3.0, 0.0, 1.0)), MOUTH_IN)
        self._put(box)
