"""Avatar registration: a face photo (or video) -> everything Ditto needs, cached on disk.

Ditto's ``Source2Info`` for an image source (ditto-reference.md §5):

1. load the image as RGB (:mod:`studio.avatar.image`: alpha dropped, EXIF orientation applied
   as OpenCV's ``imread`` does; an animation gives its first frame, noted),
   shrink it so its longer side is at most ``max_size`` (1920) and floor both sides to even;
2. SCRFD face detection (the largest face), 106 landmarks, 203 landmarks on the rotated 224 px
   crop (:mod:`studio.avatar.faces`);
3. the 512 px crop from the 203 points (scale 2.3, vy -0.125, with rotation) and ``M_c2o``
   (:mod:`studio.avatar.crop`);
4. eye features on the crop (:mod:`studio.avatar.eyes`);
5. the crop area-resized to 256 px, /255 -> motion extractor (``x_s_info``) and appearance
   extractor (``f_s``).

The result is an :class:`Avatar`; ``Avatar.source_info()`` is Ditto's ``source_info`` dict.

Cache: one folder per image (named from its SHA-256) under ``cache_dir`` (default
``$STUDIO_AVATAR_CACHE`` or ``avatars/`` under the cache root, :mod:`studio.paths`) with
``arrays.npz``, ``image.npy`` (the resized frame), ``crop.png`` and ``meta.json`` (format
version, image hash, registration settings, and a fingerprint of every model file used).
Reopening an image whose folder matches runs no model at all; a different image, other
settings or a changed model file rebuild it. A model file that is *missing* now does not
invalidate the cache (it is only needed to rebuild). Folders are written under a temporary name
and renamed into place, so a crash never leaves a half-written cache; a file lock per image
makes a second process that registers the same image at the same time wait for the first and
reopen its folder.

A video (:mod:`studio.avatar.video`: sampled at 25 fps, at most 10 s) registers every frame:
the face is detected in frame 0 and tracked (each frame's 203 landmarks from the crop around
the previous frame's), each frame gets its crop, ``M_c2o``, eye features, ``x_s_info`` and
``f_s``; ``x_s_info`` is box-smoothed over 13 frames and ``sc`` is frame 0's keypoints before
smoothing (§5.5). The frames are cached as ``frames.npy`` (memory-mapped when reopened).

Differences from Ditto on purpose: clear errors instead of crashes (no face, §9 pitfall 16; tiny
faces; a video with a cut or a face lost while tracking), a video sampled at 25 fps by its
timestamps (Ditto takes one source frame per output frame whatever the video's rate), and the
extractors run in float32 (Ditto's PyTorch path uses fp16 autocast on CUDA, its TensorRT motion
extractor fp32).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from studio.avatar.crop import (
    CropGeometry,
    area_downsample,
    crop_geometry,
    crop_image,
    resize_bilinear,
)
from studio.avatar.eyes import eye_features, planned_method
from studio.avatar.faces import FaceDetector, Landmark106, Landmark203, providers_for
from studio.avatar.folder import AVATAR_META
from studio.avatar.image import MIN_FACE_PX, fit_size, read_image, read_image_bytes
from studio.avatar.video import (
    MAX_VIDEO_FRAMES,
    VIDEO_FPS,
    find_cut,
    is_video,
    read_video,
    video_sha256,
)
from studio.errors import InputError, OutputError
from studio.files import check_writable_folder
from studio.layout import CROP_SCALE, CROP_VX, CROP_VY
from studio.models.checkpoints import CheckpointSet
from studio.paths import AVATAR_ENV, avatar_cache_dir, build_lock

__all__ = [
    "CACHE_ENV",
    "FORMAT_VERSION",
    "MIN_FACE_PX",
    "Avatar",
    "RegistrationSettings",
    "default_cache_dir",
    "file_fingerprint",
    "register_avatar",
]

FORMAT_VERSION = 1
VIDEO_FRAMES_FILE = "frames.npy"  # a video avatar's frames, beside image.npy (its frame 0)
CACHE_ENV = AVATAR_ENV  # this folder itself; $STUDIO_CACHE_DIR moves the whole cache root
CROP_SIZE = 512
NET_SIZE = 256
SOURCE_SMOOTH_FRAMES = 13  # Ditto's smo_k_s: a video's x_s_info box-filtered over frames
MAX_TRACK_JUMP = 0.5  # a tracked crop moving more than this part of its side in one frame
MAX_TRACK_SCALE = 1.5  # or changing its size by more than this factor: the face is lost
DETECT_EVERY = 5  # frames between the detector's checks that the tracked face is a face
PROGRESS_EVERY = 10  # frames between progress reports of a video's tracking
EXTRACT_BATCH = 8  # crops through the extractors at a time (bounds a video's activations)

Progress = Callable[[str, int, int], None]

# Files registration reads, in stage order: role -> layouts tried, first found wins.
_AUX_ROLES = ("insightface_det", "landmark106", "landmark203")
_NET_ROLES = ("motion_extractor", "appearance_extractor")
REGISTRATION_ROLES = (*_AUX_ROLES, *_NET_ROLES)  # the checkpoint files registration reads
_STEPS = (
    "load image",
    "face detection",
    "landmarks",
    "crop",
    "eye features",
    "motion and appearance",
    "cache",
)

_X_S_KEYS = ("pitch", "yaw", "roll", "t", "exp", "scale", "kp")
STAGE = "registering avatar"  # the progress stage; steps follow it as "registering avatar: <step>"


@dataclass(frozen=True)
class RegistrationSettings:
    """Ditto's crop settings (``crop_scale``, ``crop_vy_ratio``, ``crop_flag_do_rot``) and the
    image size limit (``max_size``); ``crop_vx_ratio`` shifts the crop sideways (Ditto takes it
    but ignores it, §9.1: at 0 the crop is Ditto's, and the cache key is as before)."""

    crop_scale: float = CROP_SCALE
    crop_vy_ratio: float = CROP_VY
    crop_rotate: bool = True
    max_size: int = 1920
    crop_vx_ratio: float = CROP_VX

    def __post_init__(self) -> None:
        if not self.crop_scale > 0:
            raise ValueError(f"crop_scale must be > 0, got {self.crop_scale}")
        if int(self.max_size) < 2:
            raise ValueError(f"max_size must be >= 2, got {self.max_size}")

    def to_dict(self) -> dict[str, Any]:
        out = {k: (float(v) if isinstance(v, float) else v) for k, v in asdict(self).items()}
        if not self.crop_vx_ratio:  # avatars registered before it existed stay valid
            del out["crop_vx_ratio"]
        return out


@dataclass(eq=False)
class Avatar:
    """A registered avatar (one source image).

    ``image``: the full-resolution RGB uint8 frame after the §5.1 resize (even sides);
    ``crop``: the 512 px RGB crop; ``m_c2o``: crop -> image [3, 3] f32; ``x_s_info``: the motion
    extractor's dict (pitch/yaw/roll [1, 66], t [1, 3], exp [1, 63], scale [1, 1], kp [1, 63]);
    ``f_s``: the appearance feature volume ([1, 32, 16, 64, 64] for the released network);
    ``eye_open`` [1, 2], ``eye_ball`` [1, 6]; ``sc`` [1, 63] (= kp); ``eye_method``: how the eye
    features were made; ``notes``: things the user should know; ``folder``: the cache folder.
    """

    image: np.ndarray
    crop: np.ndarray
    m_c2o: np.ndarray
    x_s_info: dict[str, np.ndarray]
    f_s: np.ndarray
    eye_open: np.ndarray
    eye_ball: np.ndarray
    sc: np.ndarray
    eye_method: str
    notes: list[str] = field(default_factory=list)
    folder: Path | None = None
    face_box: np.ndarray | None = None  # [4] x1, y1, x2, y2 in ``image`` pixels
    lmk203: np.ndarray | None = None  # [203, 2] in ``image`` pixels
    cached: bool = False  # True when loaded from the cache without running a model
    frames: np.ndarray | None = None  # a video avatar's frames [n, H, W, 3] (None: an image)

    @property
    def is_video(self) -> bool:
        return self.frames is not None

    @property
    def num_frames(self) -> int:
        """Source frames: 1 for an image; a video's per-frame arrays (``x_s_info``, ``f_s``,
        ``eye_open``, ``eye_ball``, ``m_c2o`` [n, 3, 3]) have this many rows."""
        return 1 if self.frames is None else len(self.frames)

    def source_info(self) -> dict[str, Any]:
        """Ditto's ``source_info`` (§5.5): one entry per source frame in every list."""
        n = self.num_frames
        m_c2o = [self.m_c2o] if self.frames is None else list(self.m_c2o)
        images = [self.image] if self.frames is None else list(self.frames)
        return {
            "x_s_info_lst": [{k: v[i : i + 1] for k, v in self.x_s_info.items()} for i in range(n)],
            "f_s_lst": [self.f_s[i : i + 1] for i in range(n)],
            "M_c2o_lst": m_c2o,
            "eye_open_lst": [self.eye_open[i : i + 1] for i in range(n)],
            "eye_ball_lst": [self.eye_ball[i : i + 1] for i in range(n)],
            "sc": self.sc.reshape(-1),
            "is_image_flag": self.frames is None,
            "img_rgb_lst": images,
        }


def default_cache_dir() -> Path:
    """``$STUDIO_AVATAR_CACHE``, else ``avatars/`` under the studio's cache root
    (:func:`studio.paths.avatar_cache_dir`: ``$STUDIO_CACHE_DIR`` or the user cache folder)."""
    return avatar_cache_dir()


# --- fingerprints ---------------------------------------------------------------------------------

_SHA_MEMO: dict[tuple[str, int, int], str] = {}


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_fingerprint(path: str | os.PathLike[str], known: dict | None = None) -> dict[str, Any]:
    """{path, size, mtime_ns, sha256} of a file; the hash is memoised by (path, size, mtime).

    ``known`` (a fingerprint stored earlier, e.g. in meta.json) is trusted when its path,
    size and mtime equal the file's now, so a cached avatar opens without hashing models.
    """
    p = Path(path).expanduser().resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    sha = _SHA_MEMO.get(key)
    if (
        sha is None
        and known
        and (known.get("path"), known.get("size"), known.get("mtime_ns")) == key
    ):
        sha = known.get("sha256")
    if sha is None:
        sha = _sha256_file(p)
    _SHA_MEMO[key] = sha
    return {"path": key[0], "size": key[1], "mtime_ns": key[2], "sha256": sha}


# --- model files ----------------------------------------------------------------------------------


def _resolve_files(ckpt: CheckpointSet) -> tuple[dict[str, Path], dict[str, InputError]]:
    """role -> path of every file registration uses (found), and role -> error (missing)."""
    found: dict[str, Path] = {}
    missing: dict[str, InputError] = {}
    for role in (*_AUX_ROLES, *_NET_ROLES):
        layouts = ("pytorch", "onnx") if role in _AUX_ROLES else ("pytorch",)
        first: InputError | None = None
        for layout in layouts:
            try:
                found[role] = ckpt.path(role, layout)
                break
            except InputError as e:
                first = first or e
        else:
            missing[role] = first  # type: ignore[assignment]
    try:
        found["face_landmarker"] = ckpt.path("face_landmarker", "pytorch")
    except InputError:
        pass  # optional: the eye features fall back to the 203 landmarks
    return found, missing


_NETWORKS: dict[tuple[str, int, int, str], Any] = {}


def _network(name: str, path: Path, device: Any) -> Any:
    from studio.models import load_network

    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, str(device))
    if key not in _NETWORKS:
        if len(_NETWORKS) >= 4:
            _NETWORKS.pop(next(iter(_NETWORKS)))
        _NETWORKS[key] = load_network(name, path, device)
    return _NETWORKS[key]


# --- the pipeline ---------------------------------------------------------------------------------


class _Steps:
    def __init__(self, progress: Progress | None) -> None:
        self.progress = progress
        self.done = 0
        self.t = time.perf_counter()
        self.ms: dict[str, float] = {}

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.ms[name] = round((now - self.t) * 1000.0, 2)
        self.t = now
        self.done += 1
        if self.progress is not None:
            self.progress(f"{STAGE}: {name}", self.done, len(_STEPS))


def _find_face(
    image: np.ndarray, where: str, detector: FaceDetector, notes: list[str]
) -> tuple[np.ndarray, int]:
    """(box of the largest face, faces found) in ``image``; InputError for none or a tiny one
    (``where``: "path" or "the first frame of path")."""
    dets = detector(image)
    if len(dets) == 0:
        raise InputError(
            f"no face found in {where}: use a photo with one clearly visible, roughly frontal, "
            "well-lit face (not too close to the edge)"
        )
    box = dets.boxes[int(dets.by_area()[0])]
    bw, bh = float(box[2] - box[0]), float(box[3] - box[1])
    if max(bw, bh) < MIN_FACE_PX:
        raise InputError(
            f"the face in {where} is too small: {bw:.0f}x{bh:.0f} px, registration needs at "
            f"least {MIN_FACE_PX} px on its longer side; use a larger photo or one taken closer"
        )
    if len(dets) > 1:
        notes.append(f"{len(dets)} faces found; used the largest ({bw:.0f}x{bh:.0f} px)")
    return box, len(dets)


def _geometry(lmk203: np.ndarray, settings: RegistrationSettings) -> CropGeometry:
    return crop_geometry(
        lmk203,
        CROP_SIZE,
        settings.crop_scale,
        settings.crop_vy_ratio,
        settings.crop_rotate,
        settings.crop_vx_ratio,
    )


def _extract(
    crops: np.ndarray, files: dict[str, Path], dev: Any
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(x_s_info, f_s) of 512 px crops [n, 512, 512, 3]: area-resized to 256 px, /255, through
    the motion and appearance extractors, :data:`EXTRACT_BATCH` crops at a time."""
    import torch

    motion = _network("motion_extractor", files["motion_extractor"], dev)
    appearance = _network("appearance_extractor", files["appearance_extractor"], dev)
    heads: list[list[np.ndarray]] = []
    feats: np.ndarray | None = None  # filled batch by batch: a video's 8 MiB a frame, once
    for s in range(0, len(crops), EXTRACT_BATCH):
        small = area_downsample(crops[s : s + EXTRACT_BATCH], CROP_SIZE // NET_SIZE, dev)
        x = torch.from_numpy(small.astype(np.float32) / 255.0).permute(0, 3, 1, 2).contiguous()
        x = x.to(dev)
        with torch.inference_mode():
            out = motion(x)
            f_s = appearance(x).detach().float().cpu().numpy()
        heads.append([np.asarray(v.detach().float().cpu().numpy(), np.float32) for v in out])
        if feats is None:
            feats = np.empty((len(crops), *f_s.shape[1:]), np.float32)
        feats[s : s + len(f_s)] = f_s
    x_s_info = {
        k: np.ascontiguousarray(np.concatenate([h[i] for h in heads]), dtype=np.float32)
        for i, k in enumerate(_X_S_KEYS)
    }
    for k in ("exp", "kp"):
        x_s_info[k] = x_s_info[k].reshape(len(crops), -1)
    assert feats is not None
    return x_s_info, feats


def _build(
    path: Path,
    data: bytes,
    files: dict[str, Path],
    settings: RegistrationSettings,
    device: Any,
    steps: _Steps,
) -> tuple[Avatar, dict[str, Any]]:
    import torch

    providers = providers_for(device)
    picture = read_image(path, data)
    raw, notes = picture.rgb, list(picture.notes)
    h0, w0 = raw.shape[:2]
    h, w = fit_size(h0, w0, int(settings.max_size))
    image = raw if (h, w) == (h0, w0) else resize_bilinear(raw, (h, w))
    if (h, w) != (h0, w0) and max(h0, w0) > settings.max_size:
        notes.append(f"image resized from {w0}x{h0} to {w}x{h} px (max side {settings.max_size})")
    steps("load image")

    detector = FaceDetector(files["insightface_det"], providers)
    box, faces = _find_face(image, str(path), detector, notes)
    steps("face detection")

    lmk106 = Landmark106(files["landmark106"], providers)(image, box)
    lmk203 = Landmark203(files["landmark203"], providers)(image, lmk106)
    steps("landmarks")

    geo = _geometry(lmk203, settings)
    dev = torch.device(device) if not isinstance(device, torch.device) else device
    crop = crop_image(image, geo, dev)
    steps("crop")

    eyes = eye_features(crop, lmk203, files.get("face_landmarker"))
    steps("eye features")

    x_s_info, f_s = _extract(crop[None], files, dev)
    steps("motion and appearance")

    avatar = Avatar(
        image=np.ascontiguousarray(image),
        crop=crop,
        m_c2o=geo.m_c2o.astype(np.float32),
        x_s_info=x_s_info,
        f_s=f_s,
        eye_open=eyes.eye_open,
        eye_ball=eyes.eye_ball,
        sc=x_s_info["kp"].reshape(1, -1).copy(),
        eye_method=eyes.description,
        notes=notes,
        face_box=box.astype(np.float32),
        lmk203=lmk203.astype(np.float32),
    )
    extra = {
        "source": str(path),
        "original_size_wh": [w0, h0],
        "size_wh": [w, h],
        "faces_found": faces,
        "face_box": [float(v) for v in box],
        "crop": {"center": [float(v) for v in geo.center], "size": geo.size, "angle": geo.angle},
        "eye_method_key": eyes.method,
    }
    return avatar, extra


def smooth_source(info: dict[str, np.ndarray], window: int) -> dict[str, np.ndarray]:
    """Ditto's video source smoothing: every key's rows averaged over a centred box of
    ``window`` frames, the box cut at the clip's ends (a 1-frame source is unchanged)."""
    out = {}
    for k, v in info.items():
        n = len(v)
        if n < 2 or window <= 1:
            out[k] = v
            continue
        flat = v.reshape(n, -1).astype(np.float64)
        csum = np.concatenate([np.zeros((1, flat.shape[1])), np.cumsum(flat, axis=0)])
        i = np.arange(n)
        lo, hi = np.maximum(i - window // 2, 0), np.minimum(i + window // 2 + 1, n)
        mean = (csum[hi] - csum[lo]) / (hi - lo)[:, None]
        out[k] = mean.astype(np.float32).reshape(v.shape)
    return out


def _lost(path: Path, i: int, why: str) -> InputError:
    return InputError(
        f"the face in {path} is lost at {i / VIDEO_FPS:.2f} s (frame {i}: {why}): a video "
        "avatar needs one face in view all the time; trim the video before that point"
    )


def _track(
    frames: np.ndarray,
    first: np.ndarray,
    models: tuple[FaceDetector, Landmark203],
    settings: RegistrationSettings,
    path: Path,
    progress: Progress | None,
) -> tuple[np.ndarray, list[CropGeometry]]:
    """Ditto's tracking: frame i's 203 landmarks from the crop around frame i-1's. The face
    counts as lost where the crop jumps or changes size too much between frames, or where
    the detector, run every :data:`DETECT_EVERY` frames (a landmark model gives points even
    for a crop with no face), finds no face around the tracked landmarks."""
    detector, landmarks = models
    points, geos = [first], [_geometry(first, settings)]
    last = len(frames) - 1
    for i in range(1, len(frames)):
        try:
            pts = landmarks(frames[i], points[-1])
            geo = _geometry(pts, settings)
        except ValueError:
            raise _lost(path, i, "no landmarks") from None
        prev = geos[-1]
        jump = float(np.hypot(*(geo.center - prev.center))) / prev.size
        ratio = geo.size / prev.size
        if not np.isfinite(pts).all():
            raise _lost(path, i, "no landmarks")
        if jump > MAX_TRACK_JUMP:
            raise _lost(path, i, f"it moved {jump:.0%} of its size in one frame")
        if not 1 / MAX_TRACK_SCALE < ratio < MAX_TRACK_SCALE:
            raise _lost(path, i, f"its size changed {ratio:.2f}x in one frame")
        if i % DETECT_EVERY == 0 or i == last:
            boxes = detector(frames[i]).boxes
            x, y = pts.mean(axis=0)
            inside = (
                (boxes[:, 0] <= x) & (x <= boxes[:, 2]) & (boxes[:, 1] <= y) & (y <= boxes[:, 3])
            )
            if not inside.any():
                raise _lost(path, i, "no face where it was tracked")
        points.append(pts)
        geos.append(geo)
        if progress is not None and i % PROGRESS_EVERY == 0:
            progress(f"{STAGE}: tracking the face", i, len(frames))
    return np.stack(points), geos


def _build_video(
    path: Path,
    files: dict[str, Path],
    settings: RegistrationSettings,
    device: Any,
    steps: _Steps,
) -> tuple[Avatar, dict[str, Any]]:
    """A video avatar (§5.2, §5.5): the face found in frame 0 and tracked through the rest,
    a crop, eye features and both extractors per frame; ``x_s_info`` box-smoothed over
    :data:`SOURCE_SMOOTH_FRAMES` frames, ``sc`` frame 0's keypoints before smoothing."""
    import torch

    providers = providers_for(device)
    clip = read_video(path, max_size=int(settings.max_size))
    frames, notes = clip.frames, list(clip.notes)
    cut = find_cut(frames)
    if cut is not None:
        raise InputError(
            f"{path} has a cut at {cut / VIDEO_FPS:.2f} s (frame {cut}): a video avatar must "
            "be one continuous shot; trim it to a single shot"
        )
    steps("load video")

    detector = FaceDetector(files["insightface_det"], providers)
    box, faces = _find_face(frames[0], f"the first frame of {path}", detector, notes)
    steps("face detection")

    lmk106 = Landmark106(files["landmark106"], providers)(frames[0], box)
    landmarks = Landmark203(files["landmark203"], providers)
    first = landmarks(frames[0], lmk106)
    models = (detector, landmarks)
    lmks, geos = _track(frames, first, models, settings, path, steps.progress)
    steps("landmarks")

    dev = torch.device(device) if not isinstance(device, torch.device) else device
    crops = np.empty((len(frames), CROP_SIZE, CROP_SIZE, 3), np.uint8)
    for i, (frame, geo) in enumerate(zip(frames, geos, strict=True)):
        crops[i] = crop_image(frame, geo, dev)
    steps("crop")

    task = files.get("face_landmarker")
    eyes = [eye_features(c, p, task) for c, p in zip(crops, lmks, strict=True)]
    if len({e.method for e in eyes}) > 1:  # one method for every frame: no jumps in LMDM's eyes
        eyes = [eye_features(c, p, None) for c, p in zip(crops, lmks, strict=True)]
        notes.append("MediaPipe missed the face in some frames: eye features from landmarks")
    steps("eye features")

    raw, f_s = _extract(crops, files, dev)
    steps("motion and appearance")

    avatar = Avatar(
        image=np.ascontiguousarray(frames[0]),
        crop=crops[0],
        m_c2o=np.stack([g.m_c2o for g in geos]).astype(np.float32),
        x_s_info=smooth_source(raw, SOURCE_SMOOTH_FRAMES),
        f_s=f_s,
        eye_open=np.concatenate([e.eye_open for e in eyes]),
        eye_ball=np.concatenate([e.eye_ball for e in eyes]),
        sc=raw["kp"][:1].copy(),
        eye_method=eyes[0].description,
        notes=notes,
        face_box=box.astype(np.float32),
        lmk203=first.astype(np.float32),
        frames=frames,
    )
    h, w = frames.shape[1:3]
    geo = geos[0]
    extra = {
        "source": str(path),
        "video": {
            "frames": len(frames),
            "fps": VIDEO_FPS,
            "source_fps": clip.source_fps,
            "duration_s": clip.duration_s,
        },
        "size_wh": [int(w), int(h)],
        "faces_found": faces,
        "face_box": [float(v) for v in box],
        "crop": {"center": [float(v) for v in geo.center], "size": geo.size, "angle": geo.angle},
        "eye_method_key": eyes[0].method,
    }
    return avatar, extra


# --- cache ----------------------------------------------------------------------------------------


def _png_bytes(rgb: np.ndarray) -> bytes:
    import av

    codec = av.CodecContext.create("png", "w")
    codec.width, codec.height, codec.pix_fmt = rgb.shape[1], rgb.shape[0], "rgb24"
    frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
    return b"".join(bytes(p) for p in [*codec.encode(frame), *codec.encode(None)])


def _check_cache_root(root: Path) -> None:
    """OutputError before any work when the avatar cache folder cannot be made or written."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(
            f"avatar cache {root}: cannot create it ({e.strerror or e}); "
            "give --avatar-cache a writable folder"
        ) from None
    check_writable_folder(root, f"avatar cache {root}")


def _write_cache(folder: Path, avatar: Avatar, meta: dict[str, Any]) -> None:
    """Write the avatar folder under a temporary name, then rename it into place."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".{folder.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial"
    tmp.mkdir()
    try:
        arrays = {
            "crop": avatar.crop,
            "m_c2o": avatar.m_c2o,
            "f_s": avatar.f_s,
            "eye_open": avatar.eye_open,
            "eye_ball": avatar.eye_ball,
            "sc": avatar.sc,
            "face_box": avatar.face_box,
            "lmk203": avatar.lmk203,
            **{f"x_s_info.{k}": v for k, v in avatar.x_s_info.items()},
        }
        np.savez(tmp / "arrays.npz", **arrays)
        np.save(tmp / "image.npy", avatar.image)
        if avatar.frames is not None:
            np.save(tmp / VIDEO_FRAMES_FILE, avatar.frames)
        (tmp / "crop.png").write_bytes(_png_bytes(avatar.crop))
        (tmp / AVATAR_META).write_text(json.dumps(meta, indent=2, sort_keys=True))
        old = None
        if folder.exists():
            old = folder.parent / f".{folder.name}.{uuid.uuid4().hex[:8]}.old"
            folder.rename(old)
        try:
            tmp.rename(folder)
        except OSError:
            if not folder.exists():
                raise
            # Another process put its folder in place first: keep theirs.
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _load_cache(folder: Path, meta: dict[str, Any]) -> Avatar:
    with np.load(folder / "arrays.npz") as z:
        arrays = {k: z[k] for k in z.files}
    image = np.load(folder / "image.npy")
    x_s_info = {k: arrays[f"x_s_info.{k}"] for k in _X_S_KEYS}
    frames = None
    if meta.get("video"):  # mapped, read as frames are pasted onto (copy-on-write: writable)
        frames = np.load(folder / VIDEO_FRAMES_FILE, mmap_mode="c")
        if len(frames) != len(arrays["f_s"]):
            raise ValueError("frames and features disagree")
    return Avatar(
        image=image,
        crop=arrays["crop"],
        m_c2o=arrays["m_c2o"],
        x_s_info=x_s_info,
        f_s=arrays["f_s"],
        eye_open=arrays["eye_open"],
        eye_ball=arrays["eye_ball"],
        sc=arrays["sc"],
        eye_method=str(meta["eye_method"]),
        notes=list(meta.get("notes", [])),
        folder=folder,
        face_box=arrays["face_box"],
        lmk203=arrays["lmk203"],
        cached=True,
        frames=frames,
    )


def _cache_state(
    folder: Path, image_sha: str, settings: dict[str, Any], files: dict[str, Path]
) -> tuple[dict[str, Any] | None, str]:
    """(meta, "") when the folder is a valid cache for these inputs, else (None, why not)."""
    try:
        meta = json.loads((folder / AVATAR_META).read_text())
    except FileNotFoundError:
        return None, "not registered yet"
    except (OSError, ValueError):
        return None, "meta.json unreadable"
    if meta.get("format_version") != FORMAT_VERSION:
        return None, "cache format changed"
    if meta.get("image_sha256") != image_sha:
        return None, "image changed"
    if meta.get("settings") != settings:
        return None, "registration settings changed"
    for role, known in (meta.get("models") or {}).items():
        path = files.get(role)
        if path is None:
            continue  # missing now: the cache is all there is
        try:
            now = file_fingerprint(path, known)
        except OSError:
            continue
        if now["sha256"] != known.get("sha256"):
            return None, f"{Path(path).name} changed"
    needed = ("arrays.npz", "image.npy", *((VIDEO_FRAMES_FILE,) if meta.get("video") else ()))
    if not all((folder / n).is_file() for n in needed):
        return None, "cache incomplete"
    return meta, ""


def register_avatar(
    image_path: str | os.PathLike[str],
    checkpoints: CheckpointSet,
    cache_dir: str | os.PathLike[str] | None = None,
    device: Any = "cpu",
    progress: Progress | None = None,
    refresh: bool = False,
    *,
    settings: RegistrationSettings | None = None,
) -> Avatar:
    """Register (or reopen from the cache) the avatar in ``image_path``: a face photo, or a
    short video of one (:func:`_build_video`; every per-frame array then has a row per frame).

    ``checkpoints`` supplies the aux models (``ditto_pytorch/aux_models/`` or ``ditto_onnx/``)
    and the motion/appearance extractors (``ditto_pytorch/models/*.pth``); ``device`` runs the
    extractors and warps (and ONNX Runtime on CUDA when available); ``progress(stage, done,
    total)`` is called after each step; ``refresh`` rebuilds even a valid cache. InputError for a
    missing/unreadable file, neither image nor video, no face (in a video: in its first frame;
    lost later, or a cut),  a face below :data:`MIN_FACE_PX` px, or
    a missing model file (named with its stage).
    """
    settings = settings or RegistrationSettings()
    path = Path(image_path).expanduser()
    video = is_video(path)
    data = None if video else read_image_bytes(path)
    image_sha = video_sha256(path) if data is None else hashlib.sha256(data).hexdigest()
    files, missing = _resolve_files(checkpoints)
    eye_key, _ = planned_method(files.get("face_landmarker"))
    wanted = {**settings.to_dict(), "eye_method": eye_key}
    if video:  # what shapes a video's frames and features (an image's key stays as it was)
        wanted["video"] = {
            "fps": VIDEO_FPS,
            "max_frames": MAX_VIDEO_FRAMES,
            "smooth": SOURCE_SMOOTH_FRAMES,
        }
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    folder = root / image_sha[:24]

    if not refresh:
        cached = _reopen(folder, image_sha, wanted, files, progress)
        if cached is not None:
            return cached

    for role in (*_AUX_ROLES, *_NET_ROLES):
        if role in missing:
            raise missing[role]
    _check_cache_root(root)  # before the work; a cache hit above writes nothing
    # one registration per image at a time: a second process waits, then reopens the first's
    with build_lock(folder, f"the avatar of {path.name}"):
        cached = None if refresh else _reopen(folder, image_sha, wanted, files, progress)
        if cached is not None:
            return cached
        steps = _Steps(progress)
        if progress is not None:
            progress(STAGE, 0, len(_STEPS))
        used = {r: p for r, p in files.items() if r != "face_landmarker" or eye_key == "mediapipe"}
        if data is None:
            avatar, extra = _build_video(path, files, settings, device, steps)
        else:
            avatar, extra = _build(path, data, files, settings, device, steps)
        meta = {
            "format_version": FORMAT_VERSION,
            "image_sha256": image_sha,
            "settings": wanted,
            "models": {r: file_fingerprint(p) for r, p in used.items()},
            "eye_method": avatar.eye_method,
            "notes": avatar.notes,
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "timings_ms": steps.ms,
            **extra,
        }
        avatar.folder = folder
        _write_cache(folder, avatar, meta)
    steps("cache")
    return avatar


def _reopen(
    folder: Path,
    image_sha: str,
    wanted: dict[str, Any],
    files: dict[str, Path],
    progress: Progress | None,
) -> Avatar | None:
    """The avatar from a cache folder valid for these inputs, else None (absent, stale or
    damaged: registered anew)."""
    meta, _why = _cache_state(folder, image_sha, wanted, files)
    if meta is None:
        return None
    try:
        avatar = _load_cache(folder, meta)
    except (OSError, ValueError, KeyError):
        return None  # damaged: rebuilt
    gone = [r for r in meta.get("models", {}) if r not in files]
    if gone:
        names = ", ".join(Path(meta["models"][r]["path"]).name for r in gone)
        avatar.notes.append(f"loaded from the cache; {names} missing now")
    if progress is not None:
        progress(f"{STAGE}: reused from cache", len(_STEPS), len(_STEPS))
    return avatar
