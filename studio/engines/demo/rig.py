"""The demo character's rig: what each of the 21 keypoints means to the demo engine.

The demo motion generator writes expression offsets for these keypoints in the
Ditto motion layout, and the demo renderer reads them back after the LivePortrait
keypoint transform, so both sides agree through this one table. Lip and eye
keypoints are the reference's lip and eye sets (``layout.LIP_KP``, ``layout.EYE_KP``).

Coordinates are the normalised keypoint space: x to the viewer's right, y down,
z towards the camera; the frame spans [-1, 1] on both axes.
"""

from __future__ import annotations

import numpy as np

from studio.layout import EMOTIONS, EYE_KP, LIP_KP, NUM_KP

HEAD_CENTER = 0
CHIN = 1
FOREHEAD = 2
BROW_L = 3
BROW_R = 4
NOSE = 5
LIP_UPPER = 6
CHEEK_L = 7
CHEEK_R = 8
EAR_L = 9
EAR_R = 10
LID_UPPER_L = 11
MOUTH_CORNER_L = 12
LID_LOWER_L = 13
LIP_LOWER = 14
LID_UPPER_R = 15
LID_LOWER_R = 16
MOUTH_CORNER_R = 17
GAZE = 18
MOUTH_INNER = 19
JAW = 20

assert {LIP_UPPER, MOUTH_CORNER_L, LIP_LOWER, MOUTH_CORNER_R, MOUTH_INNER, JAW} == set(LIP_KP)
assert {LID_UPPER_L, LID_LOWER_L, LID_UPPER_R, LID_LOWER_R, GAZE} == set(EYE_KP)

# Canonical (identity) keypoints of the demo character, [21, 3].
CANONICAL_KP = np.zeros((NUM_KP, 3), dtype=np.float32)
for _idx, _xyz in {
    HEAD_CENTER: (0.0, -0.05, 0.0),
    CHIN: (0.0, 0.40, 0.22),
    FOREHEAD: (0.0, -0.44, 0.18),
    BROW_L: (-0.15, -0.17, 0.34),
    BROW_R: (0.15, -0.17, 0.34),
    NOSE: (0.0, 0.06, 0.44),
    LIP_UPPER: (0.0, 0.185, 0.38),
    CHEEK_L: (-0.24, 0.10, 0.26),
    CHEEK_R: (0.24, 0.10, 0.26),
    EAR_L: (-0.38, 0.0, 0.0),
    EAR_R: (0.38, 0.0, 0.0),
    LID_UPPER_L: (-0.14, -0.085, 0.35),
    MOUTH_CORNER_L: (-0.10, 0.205, 0.33),
    LID_LOWER_L: (-0.14, -0.035, 0.35),
    LIP_LOWER: (0.0, 0.225, 0.37),
    LID_UPPER_R: (0.14, -0.085, 0.35),
    LID_LOWER_R: (0.14, -0.035, 0.35),
    MOUTH_CORNER_R: (0.10, 0.205, 0.33),
    GAZE: (0.0, -0.06, 0.35),
    MOUTH_INNER: (0.0, 0.205, 0.34),
    JAW: (0.0, 0.36, 0.20),
}.items():
    CANONICAL_KP[_idx] = _xyz

# Expression offsets (view space, keypoint units) for one unit of each control.
MOUTH_OPEN_LOWER_LIP = 0.10  # LIP_LOWER y per unit of mouth opening
MOUTH_OPEN_JAW = 0.06  # JAW y per unit of opening
MOUTH_OPEN_UPPER_LIP = -0.012  # LIP_UPPER y per unit of opening
LIP_PRESS = 0.008  # lips pressed together on a plosive closure
LIP_ROUND_X = 0.035  # mouth corners move inwards
LIP_ROUND_Z = 0.03  # lips protrude
LIP_SPREAD_X = 0.03  # mouth corners move outwards
LIP_SPREAD_Y = -0.01  # and slightly up
EYE_OPENING = 0.05  # lid gap of the canonical eye
BLINK_UPPER_LID = 0.045  # upper lid travel for a full blink
BLINK_LOWER_LID = -0.008  # lower lid travel for a full blink
BROW_RAISE = 0.03  # brow y per unit of raise
GAZE_RANGE = 0.012  # iris offset per unit of gaze

# The demo's emotions: an expression offset [21, 3] per label of layout.EMOTIONS (view space,
# keypoint units; y grows downwards), added to the motion in the proportions of the
# per-frame emotion rows, as Ditto's LMDM is conditioned on them. Neutral adds nothing.
EMOTION_OFFSETS = np.zeros((len(EMOTIONS), NUM_KP, 3), dtype=np.float32)
for _label, _moves in {
    "Angry": {
        BROW_L: (0.012, 0.022, 0.0),
        BROW_R: (-0.012, 0.022, 0.0),
        LIP_UPPER: (0, 0.006, 0),
        LIP_LOWER: (0, -0.006, 0),
        LID_UPPER_L: (0, 0.008, 0),
        LID_UPPER_R: (0, 0.008, 0),
    },
    "Disgust": {
        LIP_UPPER: (0, -0.014, 0.01),
        MOUTH_CORNER_L: (0.006, 0.012, 0),
        MOUTH_CORNER_R: (-0.006, 0.012, 0),
        BROW_L: (0.006, 0.012, 0),
        BROW_R: (-0.006, 0.012, 0),
        NOSE: (0, -0.006, 0),
    },
    "Fear": {
        BROW_L: (0.006, -0.026, 0),
        BROW_R: (-0.006, -0.026, 0),
        LID_UPPER_L: (0, -0.01, 0),
        LID_UPPER_R: (0, -0.01, 0),
        MOUTH_CORNER_L: (-0.014, 0.006, 0),
        MOUTH_CORNER_R: (0.014, 0.006, 0),
        LIP_LOWER: (0, 0.012, 0),
    },
    "Happy": {
        MOUTH_CORNER_L: (-0.026, -0.038, 0),
        MOUTH_CORNER_R: (0.026, -0.038, 0),
        CHEEK_L: (0, -0.014, 0.006),
        CHEEK_R: (0, -0.014, 0.006),
        LID_LOWER_L: (0, -0.007, 0),
        LID_LOWER_R: (0, -0.007, 0),
        LIP_LOWER: (0, 0.008, 0),
        BROW_L: (0, -0.006, 0),
        BROW_R: (0, -0.006, 0),
    },
    "Sad": {
        MOUTH_CORNER_L: (0.006, 0.022, 0),
        MOUTH_CORNER_R: (-0.006, 0.022, 0),
        BROW_L: (0.008, -0.012, 0),
        BROW_R: (-0.008, -0.012, 0),
        LID_UPPER_L: (0, 0.01, 0),
        LID_UPPER_R: (0, 0.01, 0),
        LIP_LOWER: (0, -0.004, 0.006),
    },
    "Surprise": {
        BROW_L: (0, -0.038, 0),
        BROW_R: (0, -0.038, 0),
        LID_UPPER_L: (0, -0.012, 0),
        LID_UPPER_R: (0, -0.012, 0),
        LIP_LOWER: (0, 0.03, 0),
        JAW: (0, 0.02, 0),
        MOUTH_CORNER_L: (0.008, 0.004, 0),
        MOUTH_CORNER_R: (-0.008, 0.004, 0),
    },
    "Contempt": {
        MOUTH_CORNER_R: (0.016, -0.022, 0),
        MOUTH_CORNER_L: (0.004, 0.004, 0),
        BROW_R: (0, -0.01, 0),
        LID_UPPER_L: (0, 0.006, 0),
        LID_UPPER_R: (0, 0.006, 0),
    },
}.items():
    for _idx, _xyz in _moves.items():
        EMOTION_OFFSETS[EMOTIONS.index(_label), _idx] = _xyz
