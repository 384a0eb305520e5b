"""Face model runners on the real ONNX Runtime, with the signature-true stand-ins; eye features."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from studio.avatar import eyes  # noqa: E402
from studio.avatar.crop import anchor_points  # noqa: E402
from studio.avatar.faces import (  # noqa: E402
    DET10G_INPUT,
    DET10G_OUTPUTS,
    DET_REEXPORT_INPUT,
    DET_REEXPORT_OUTPUTS,
    LMK106_INPUT,
    LMK106_OUTPUT,
    LMK203_INPUT,
    LMK203_OUTPUTS,
    FaceDetector,
    Landmark106,
    Landmark203,
    nms,
)
from studio.errors import InputError  # noqa: E402
from studio.fixtures.face_standins import (  # noqa: E402
    EYE_SIZE,
    SKIN_RGB,
    build_det_standin,
    build_landmark106_standin,
    build_landmark203_standin,
    face_image,
    face_layout,
    write_aux_standins,
)
from studio.models.checkpoints import S_DET, S_LMK106, S_LMK203  # noqa: E402

CPU = ("CPUExecutionProvider",)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_aux_standins(tmp_path_factory.mktemp("aux"))


@pytest.fixture(scope="module")
def detector(models: dict[str, Path]) -> FaceDetector:
    return FaceDetector(models["insightface_det"], CPU)


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    area = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / area


def test_standins_have_the_released_interfaces(models: dict[str, Path]) -> None:
    import onnxruntime as ort

    det = ort.InferenceSession(str(models["insightface_det"]), providers=list(CPU))
    assert [i.name for i in det.get_inputs()] == [DET10G_INPUT]
    assert det.get_inputs()[0].shape[:2] == [1, 3]
    assert [o.name for o in det.get_outputs()] == list(DET10G_OUTPUTS)
    assert [o.shape[1] for o in det.get_outputs()] == [1] * 3 + [4] * 3 + [10] * 3
    lmk = ort.InferenceSession(str(models["landmark106"]), providers=list(CPU))
    assert [(i.name, i.shape) for i in lmk.get_inputs()] == [(LMK106_INPUT, [1, 3, 192, 192])]
    assert [(o.name, o.shape) for o in lmk.get_outputs()] == [(LMK106_OUTPUT, [1, 212])]
    lp = ort.InferenceSession(str(models["landmark203"]), providers=list(CPU))
    assert [(i.name, i.shape) for i in lp.get_inputs()] == [(LMK203_INPUT, [1, 3, 224, 224])]
    assert [o.name for o in lp.get_outputs()] == list(LMK203_OUTPUTS)
    assert [o.shape for o in lp.get_outputs()] == [[1, 214], [1, 262], [1, 406]]
    # At Ditto's 512 px letterbox the rows are (512 / stride)^2 * 2 anchors.
    outs = det.run(None, {DET10G_INPUT: np.zeros((1, 3, 512, 512), np.float32)})
    assert [o.shape[0] for o in outs[:3]] == [8192, 2048, 512]


@pytest.mark.parametrize(
    ("size_hw", "box", "noise"),
    [
        ((480, 640), (100, 80, 300, 320), 0.0),  # landscape: letterbox pads the bottom
        ((700, 420), (60, 200, 380, 560), 0.0),  # portrait: pads the right
        ((512, 512), (300, 40, 420, 190), 6.0),  # small face, noisy image
        ((360, 360), (10, 20, 350, 355), 0.0),  # nearly fills the frame
    ],
)
def test_detection_box_is_where_the_face_was_drawn(
    detector: FaceDetector, size_hw: tuple[int, int], box: tuple, noise: float
) -> None:
    found = detector(face_image(size_hw, [box], noise=noise))
    assert len(found) == 1
    assert _iou(found.boxes[0], np.asarray(box, float)) > 0.9
    assert 0.5 <= found.scores[0] <= 1.0
    kps = found.kps[0]  # five points: eyes first, on the drawn eyes
    np.testing.assert_allclose(kps[:2], face_layout(box)["eyes"], atol=0.04 * (box[2] - box[0]))


def test_several_faces_are_each_found_and_sorted_by_area(detector: FaceDetector) -> None:
    boxes = [(30, 60, 150, 200), (240, 40, 500, 340), (560, 250, 650, 350)]
    found = detector(face_image((420, 700), boxes))
    assert len(found) == 3
    order = found.by_area()
    assert _iou(found.boxes[order[0]], np.asarray(boxes[1], float)) > 0.9
    for box in boxes:
        assert max(_iou(b, np.asarray(box, float)) for b in found.boxes) > 0.85


def test_no_face_and_colour_order(detector: FaceDetector) -> None:
    assert len(detector(face_image((300, 400), []))) == 0
    # The stand-in looks for the skin colour in BGR, as det_10g gets it from Ditto (R/B swapped
    # on an RGB frame): a face painted with R and B exchanged is invisible to it.
    img = face_image((300, 400), [(100, 50, 260, 250)])
    swapped = img.copy()
    skin = np.all(img == SKIN_RGB, axis=-1)
    swapped[skin] = SKIN_RGB[::-1]
    assert len(detector(img)) == 1
    assert len(detector(swapped)) == 0


def test_landmarks_land_on_the_drawn_eyes_and_mouth(models: dict[str, Path]) -> None:
    box = (180.0, 90.0, 420.0, 380.0)
    img = face_image((480, 600), [box, (470, 300, 560, 400)])
    found = FaceDetector(models["insightface_det"], CPU)(img)
    best = found.boxes[found.by_area()[0]]
    lay = face_layout(box)
    tol = 0.02 * (box[2] - box[0])
    p106 = Landmark106(models["landmark106"], CPU)(img, best)
    assert p106.shape == (106, 2) and p106.dtype == np.float32
    eye, mouth = anchor_points(p106)
    np.testing.assert_allclose(eye, lay["eyes"].mean(axis=0), atol=tol)
    np.testing.assert_allclose(mouth, lay["mouth"], atol=tol)
    np.testing.assert_allclose(p106[[33, 35, 40, 39]].mean(axis=0), lay["eyes"][0], atol=tol)
    p203 = Landmark203(models["landmark203"], CPU)(img, p106)
    assert p203.shape == (203, 2) and p203.dtype == np.float32
    np.testing.assert_allclose(p203[[0, 6, 12, 18]].mean(axis=0), lay["eyes"][0], atol=tol)
    np.testing.assert_allclose(p203[[24, 30, 36, 42]].mean(axis=0), lay["eyes"][1], atol=tol)
    np.testing.assert_allclose((p203[48] + p203[66]) / 2, lay["mouth"], atol=tol)
    # Eye corners span the drawn eye's width.
    width = np.linalg.norm(p203[0] - p203[12])
    assert width == pytest.approx(EYE_SIZE[0] * (box[2] - box[0]), rel=0.05)


def test_reexport_names_are_accepted(tmp_path: Path) -> None:
    path = build_det_standin(
        tmp_path / "insightface_det.onnx",
        input_name=DET_REEXPORT_INPUT,
        output_names=DET_REEXPORT_OUTPUTS,
    )
    box = (50, 40, 200, 220)
    found = FaceDetector(path, CPU)(face_image((300, 300), [box]))
    assert len(found) == 1 and _iou(found.boxes[0], np.asarray(box, float)) > 0.9


def _tiny_model(path: Path, inputs: list, outputs: list) -> Path:
    """A graph whose outputs are constants of the given shapes (signature tests)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits = [], []
    for name, shape in outputs:
        inits.append(numpy_helper.from_array(np.zeros(shape, np.float32), f"{name}_value"))
        nodes.append(helper.make_node("Identity", [f"{name}_value"], [name]))
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_models_that_do_not_fit_are_refused_naming_file_and_stage(tmp_path: Path) -> None:
    bad_det = build_det_standin(tmp_path / "det_10g.onnx", input_name="images")
    with pytest.raises(InputError, match=f"det_10g.onnx.*stage: {S_DET}.*'images'"):
        FaceDetector(bad_det, CPU)
    three = _tiny_model(
        tmp_path / "three.onnx", [("input.1", [1, 3, 512, 512])], [("a", [10, 1]), ("b", [10, 4])]
    )
    with pytest.raises(InputError, match="2 outputs"):
        FaceDetector(three, CPU)
    narrow = _tiny_model(
        tmp_path / "2d106det.onnx", [("data", [1, 3, 192, 192])], [("fc1", [1, 10])]
    )
    with pytest.raises(InputError, match=f"2d106det.onnx.*stage: {S_LMK106}.*fc1"):
        Landmark106(narrow, CPU)
    wrong_side = _tiny_model(
        tmp_path / "side.onnx", [("data", [1, 3, 112, 112])], [("fc1", [1, 212])]
    )
    with pytest.raises(InputError, match="shaped"):
        Landmark106(wrong_side, CPU)
    two = build_landmark203_standin(tmp_path / "landmark203.onnx", output_names=("a", "b"))
    with pytest.raises(InputError, match=f"landmark203.onnx.*stage: {S_LMK203}.*'a', 'b'"):
        Landmark203(two, CPU)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    with pytest.raises(InputError, match="could not be loaded by ONNX Runtime.*stage"):
        Landmark203(junk, CPU)
    with pytest.raises(InputError, match="does not exist"):
        FaceDetector(tmp_path / "absent.onnx", CPU)
    ok = build_landmark106_standin(tmp_path / "ok106.onnx")
    assert Landmark106(ok, CPU).output_name == LMK106_OUTPUT


def test_nms_uses_insightface_plus_one_areas() -> None:
    boxes = np.array([[0, 0, 9, 9], [1, 0, 10, 9], [20, 20, 29, 29], [0, 0, 4, 9]], float)
    scores = np.array([0.9, 0.8, 0.7, 0.95])
    # Box 3 (area 5x10 with +1) overlaps box 0 at IoU 0.5 > 0.4 and wins on score.
    np.testing.assert_array_equal(nms(boxes, scores), [3, 1, 2])


# --- eye features ---------------------------------------------------------------------------------


def _mesh() -> np.ndarray:
    m = np.zeros((478, 3))
    m[33], m[133] = (0.30, 0.40, 0.0), (0.40, 0.40, 0.0)  # left eye, width 0.1
    for (a, b), gap in zip(eyes.MP_LEFT_LIDS, (0.04, 0.03, 0.03), strict=True):
        m[a], m[b] = (0.35, 0.40 + gap / 2, 0.0), (0.35, 0.40 - gap / 2, 0.0)
    m[263], m[362] = (0.70, 0.40, 0.0), (0.60, 0.40, 0.0)  # right eye, outer on the right
    for (a, b), gap in zip(eyes.MP_RIGHT_LIDS, (0.02, 0.01, 0.01), strict=True):
        m[a], m[b] = (0.65, 0.40 + gap / 2, 0.0), (0.65, 0.40 - gap / 2, 0.0)
    m[468] = (0.36, 0.40, 0.0)  # left iris 0.01 towards the image right (inwards)
    m[473] = (0.65, 0.41, 0.0)  # right iris 0.01 down
    return m


def test_eye_features_from_the_mesh_follow_ditto() -> None:
    eye_open, eye_ball = eyes.features_from_mesh(_mesh())
    np.testing.assert_allclose(eye_open, [[1.0, 0.4]], rtol=1e-6)
    # (unit centre->iris - unit inner->outer) * distance, interleaved (xL, xR, yL, yR, zL, zR):
    # left: ((1, 0) - (-1, 0)) * 0.01; right: ((0, 1) - (1, 0)) * 0.01.
    np.testing.assert_allclose(eye_ball, [[0.02, -0.01, 0.0, 0.01, 0.0, 0.0]], atol=1e-7)
    assert eye_open.shape == (1, 2) and eye_ball.shape == (1, 6)
    assert eye_open.dtype == eye_ball.dtype == np.float32


def test_eye_fallback_from_203_points_and_its_label(monkeypatch: pytest.MonkeyPatch) -> None:
    from studio.fixtures.face_standins import template_203

    pts = template_203() * [200.0, 240.0]
    ratio = (EYE_SIZE[1] * 240.0) / (EYE_SIZE[0] * 200.0)
    want = ratio * eyes.MP_OPEN_PER_LP_RATIO
    np.testing.assert_allclose(eyes.eye_open_from_203(pts), [[want, want]], rtol=1e-5)
    assert eyes.MP_OPEN_PER_LP_RATIO == pytest.approx(2.936, abs=1e-3)
    monkeypatch.setattr(eyes, "mediapipe_status", lambda: "mediapipe not installed")
    got = eyes.eye_features(np.zeros((512, 512, 3), np.uint8), pts, Path("face_landmarker.task"))
    assert got.method == "landmark203"
    assert got.description == "landmark203 fallback (mediapipe not installed)"
    np.testing.assert_array_equal(got.eye_ball, np.zeros((1, 6), np.float32))
    monkeypatch.setattr(eyes, "mediapipe_status", lambda: None)
    assert eyes.planned_method(None) == (
        "landmark203",
        "landmark203 fallback (face_landmarker.task missing)",
    )
    key, label = eyes.planned_method(Path("/x/face_landmarker.task"))
    assert key == "mediapipe" and "face_landmarker.task" in label
