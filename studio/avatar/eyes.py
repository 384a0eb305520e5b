"""Eye features of the avatar (ditto-reference.md §5.4): openness [1, 2] and gaze [1, 6].

Ditto measures both on MediaPipe's 478-point face mesh of the 512 px crop (normalised x, y, z):

* openness per side = (sum of three vertical lid distances) / (corner distance + 1e-8), with
  widths (33, 133) and (263, 362) and lid pairs (145, 159), (144, 160), (153, 158) and
  (374, 386), (373, 387), (380, 385); order (left, right), "left" being MediaPipe's 33/133 eye,
  the one on the image's left;
* "ball move" per side = (unit vector eye centre -> iris (468, 473) minus unit vector inner ->
  outer corner) * |iris - eye centre|, stacked per axis as (xL, xR, yL, yR, zL, zR).

Sources, in order:

1. MediaPipe Tasks ``FaceLandmarker`` with ``face_landmarker.task`` (what Ditto's PyTorch release
   runs), when ``import mediapipe`` works. It is optional and not a dependency of the studio.
2. Otherwise a fallback from the 203 landmarks registration already has: LivePortrait's eye-close
   ratio (lid distance 6-18 over corner distance 0-12, and 30-42 over 24-36), mapped to
   MediaPipe's scale by :data:`MP_OPEN_PER_LP_RATIO`, and gaze 0 (centred).

:func:`eye_features` reports which ran; registration shows it to the user.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from studio.layout import EYE_BALL_DIM, EYE_OPEN_DIM

__all__ = [
    "MP_OPEN_PER_LP_RATIO",
    "EyeFeatures",
    "eye_features",
    "eye_open_from_203",
    "features_from_mesh",
    "mediapipe_status",
    "planned_method",
]

METHOD_MEDIAPIPE = "mediapipe"
METHOD_LMK203 = "landmark203"

# MediaPipe 478 indices (Ditto's EyeIdxMP).
MP_LEFT_WIDTH = (33, 133)  # outer, inner
MP_RIGHT_WIDTH = (263, 362)
MP_LEFT_LIDS = ((145, 159), (144, 160), (153, 158))
MP_RIGHT_LIDS = ((374, 386), (373, 387), (380, 385))
MP_LEFT_IRIS = 468
MP_RIGHT_IRIS = 473
MP_POINTS = 478

# LivePortrait's 203-point eye-close ratio: (lid a, lid b, corner a, corner b) per side.
LP_LEFT_EYE = (6, 18, 0, 12)
LP_RIGHT_EYE = (30, 42, 24, 36)

# MediaPipe openness per unit of LivePortrait's ratio. MediaPipe's seven lid points per side
# sit at 1/8 .. 7/8 of the eye width, so its three pairs (3/8, 4/8, 5/8) are the centre
# chord and two chords 1/8 of the width off-centre; for an elliptic eye opening each of those
# is sqrt(1 - 0.25**2) = 0.968 of the centre chord, so the sum of the three is
# (1 + 2 * 0.968) = 2.94 centre chords, while LivePortrait's ratio counts one (same width).
MP_OPEN_PER_LP_RATIO = 1.0 + 2.0 * float(np.sqrt(1.0 - 0.25**2))


@dataclass(frozen=True)
class EyeFeatures:
    """Eye openness [1, 2] and gaze [1, 6] (float32), the method key and a readable label."""

    eye_open: np.ndarray
    eye_ball: np.ndarray
    method: str  # "mediapipe" or "landmark203"
    description: str  # e.g. "landmark203 fallback (mediapipe not installed)"


def _dist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sqrt(((a - b) ** 2).sum(-1))


def _unit(v: np.ndarray) -> np.ndarray:
    return v / (np.sqrt((v**2).sum(-1, keepdims=True)) + 1e-8)


def features_from_mesh(mesh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(eye_open [1, 2], eye_ball [1, 6]) from one 478-point mesh [478, 3] or [1, 478, 3]."""
    p = np.asarray(mesh, dtype=np.float64).reshape(-1, MP_POINTS, 3)[0]
    sides = []
    for width, lids, iris in (
        (MP_LEFT_WIDTH, MP_LEFT_LIDS, MP_LEFT_IRIS),
        (MP_RIGHT_WIDTH, MP_RIGHT_LIDS, MP_RIGHT_IRIS),
    ):
        outer, inner = p[width[0]], p[width[1]]
        w = _dist(outer, inner)
        opening = sum(_dist(p[a], p[b]) for a, b in lids) / (w + 1e-8)
        centre = (outer + inner) / 2
        ball = p[iris]
        move = (_unit(ball - centre) - _unit(outer - inner)) * _dist(ball, centre)
        sides.append((opening, move))
    eye_open = np.array([[sides[0][0], sides[1][0]]], dtype=np.float32)
    eye_ball = np.stack([sides[0][1], sides[1][1]], axis=-1).reshape(1, EYE_BALL_DIM)
    return eye_open, eye_ball.astype(np.float32)


def eye_open_from_203(lmk203: np.ndarray) -> np.ndarray:
    """[1, 2] openness on MediaPipe's scale from 203 landmarks [203, 2] (any frame: a ratio)."""
    p = np.asarray(lmk203, dtype=np.float64).reshape(-1, 2)
    out = []
    for a, b, c, d in (LP_LEFT_EYE, LP_RIGHT_EYE):
        ratio = _dist(p[a], p[b]) / (_dist(p[c], p[d]) + 1e-6)
        out.append(ratio * MP_OPEN_PER_LP_RATIO)
    return np.asarray(out, dtype=np.float32).reshape(1, EYE_OPEN_DIM)


def mediapipe_status() -> str | None:
    """None when ``import mediapipe`` works, else why not (for the fallback label)."""
    try:
        import mediapipe  # noqa: F401
    except ImportError:
        return "mediapipe not installed"
    except Exception as e:  # noqa: BLE001 - a broken install (e.g. a numpy clash) is no install
        return f"mediapipe does not import: {type(e).__name__}"
    return None


def planned_method(task_path: Path | None) -> tuple[str, str]:
    """(method key, label) of the source :func:`eye_features` will try first."""
    why = mediapipe_status()
    if why is None and task_path is None:
        why = "face_landmarker.task missing"
    if why is None:
        return METHOD_MEDIAPIPE, f"mediapipe FaceLandmarker ({Path(task_path).name})"
    return METHOD_LMK203, f"landmark203 fallback ({why})"


@functools.lru_cache(maxsize=2)
def _landmarker(task_path: str):  # pragma: no cover - needs mediapipe and the task file
    from mediapipe.tasks.python import BaseOptions, vision

    options = vision.FaceLandmarkerOptions(
        base_options=BaseOptions(model_asset_path=task_path),
        output_face_blendshapes=True,
        output_facial_transformation_matrixes=True,
        num_faces=1,
    )
    return vision.FaceLandmarker.create_from_options(options)


def _mediapipe_mesh(crop_rgb: np.ndarray, task_path: Path) -> np.ndarray | None:
    """[478, 3] normalised mesh of the crop, or None when MediaPipe finds no face."""
    import mediapipe as mp  # pragma: no cover - optional

    image = mp.Image(image_format=mp.ImageFormat.SRGB, data=np.ascontiguousarray(crop_rgb))
    result = _landmarker(str(task_path)).detect(image)  # pragma: no cover
    if not result.face_landmarks:  # pragma: no cover
        return None
    return np.array([[q.x, q.y, q.z] for q in result.face_landmarks[0]], dtype=np.float32)


def eye_features(
    crop_rgb: np.ndarray, lmk203: np.ndarray, task_path: Path | None = None
) -> EyeFeatures:
    """Eye features of the 512 px crop: MediaPipe when possible, else the 203 fallback."""
    method, label = planned_method(task_path)
    if method == METHOD_MEDIAPIPE:  # pragma: no cover - needs mediapipe
        planned = label
        try:
            mesh = _mediapipe_mesh(crop_rgb, Path(task_path))
        except (OSError, RuntimeError, ValueError) as e:  # a broken or foreign .task file
            mesh = None
            label = f"landmark203 fallback ({Path(task_path).name} did not load: {e})"
        else:
            label = "landmark203 fallback (mediapipe found no face in the crop)"
        if mesh is not None and len(mesh) >= MP_POINTS:
            eye_open, eye_ball = features_from_mesh(mesh[:MP_POINTS])
            return EyeFeatures(eye_open, eye_ball, METHOD_MEDIAPIPE, planned)
    return EyeFeatures(
        eye_open_from_203(lmk203),
        np.zeros((1, EYE_BALL_DIM), dtype=np.float32),
        METHOD_LMK203,
        label,
    )
