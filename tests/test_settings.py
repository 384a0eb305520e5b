"""The settings schema: one range, one list of choices and one default per setting, shared by
presets, the CLI's options and the GUI's widgets; every bad value a one-line error."""

import json
import math

import pytest

from studio.errors import InputError, OptionError
from studio.motion.cadence import CadenceThresholds
from studio.motion.kinematics import MIN_ACCEL_LIMIT
from studio.settings import PRESET_FORMAT, RenderSettings, keys, spec

NUMBERS = [k for k in keys() if spec(k).kind in (int, float)]
CHOICES = [k for k in keys() if spec(k).choices]
BOOLS = [k for k in keys() if spec(k).kind is bool]
# values a bound needs from its neighbours (the cross-field rules)
COMPANIONS = {
    ("smooth_order", "high"): {"smooth_window": 101},
    ("cadence.fast_flux", "low"): {"cadence.calm_flux": 0.0},
    ("cadence.calm_flux", "high"): {"cadence.fast_flux": 1.0},
}


def _preset(values: dict) -> dict:
    """A preset dict from dotted keys (``cadence.x`` nested)."""
    data: dict = {}
    for key, value in values.items():
        owner, _, name = key.rpartition(".")
        (data.setdefault(owner, {}) if owner else data)[name] = value
    return data


def _load(tmp_path, values: dict | str) -> RenderSettings:
    p = tmp_path / "p.json"
    p.write_text(values if isinstance(values, str) else json.dumps(_preset(values)))
    return RenderSettings.load(p)


def _refused(tmp_path, values: dict | str, *words: str) -> str:
    with pytest.raises(InputError) as info:
        _load(tmp_path, values)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(tmp_path / "p.json")), message
    for w in words:
        assert w in message, message
    return message


def _get(s: RenderSettings, key: str):
    owner, _, name = key.rpartition(".")
    return getattr(getattr(s, owner) if owner else s, name)


def _past(s, side: str):
    """Just past a bound: the next integer (of the same parity), or the next float."""
    bound = s.low if side == "low" else s.high
    sign = -1 if side == "low" else 1
    if s.kind is int:
        return bound + sign * (2 if s.parity else 1)
    return math.nextafter(float(bound), sign * math.inf)


@pytest.mark.parametrize("key", NUMBERS)
def test_every_number_is_accepted_at_its_bounds_and_refused_just_past(tmp_path, key):
    s = spec(key)
    assert s.low is not None and s.high is not None and s.low < s.high
    assert s.low <= s.default <= s.high and s.help
    for side, bound in (("low", s.low), ("high", s.high)):
        extra = COMPANIONS.get((key, side), {})
        assert _get(_load(tmp_path, {**extra, key: bound}), key) == bound
        words = ("below the minimum",) if side == "low" else ("above the maximum",)
        _refused(tmp_path, {**extra, key: _past(s, side)}, f": {key}: ", *words)


@pytest.mark.parametrize("key", CHOICES)
def test_every_choice_is_accepted_and_others_refused_with_the_list(tmp_path, key):
    for choice in spec(key).choices:
        assert _get(_load(tmp_path, {key: choice}), key) == choice
    _refused(tmp_path, {key: "warp"}, f"{key}: the string 'warp' is not one of", spec(key).allowed)


@pytest.mark.parametrize("key", NUMBERS)
def test_a_number_of_the_wrong_type_is_named_as_such(tmp_path, key):
    s = spec(key)
    _refused(tmp_path, {key: str(s.default)}, f"{key}: got the string", f"must be {s.allowed}")
    _refused(tmp_path, {key: True}, f"{key}: got true")
    _refused(tmp_path, {key: None}, f"{key}: got null")
    _refused(tmp_path, {key: [s.default]}, f"{key}: got a list")
    _refused(tmp_path, {key: {"value": s.default}}, f"{key}: got an object")
    if s.kind is int:
        _refused(tmp_path, {key: float(s.default)}, f"{key}: got {float(s.default)!r}")


@pytest.mark.parametrize("key", BOOLS)
def test_a_bool_is_true_or_false_only(tmp_path, key):
    for bad in ("no", "false", 0, 1, None):
        _refused(tmp_path, {key: bad}, f"{key}: got", "must be true or false")
    assert _get(_load(tmp_path, {key: False}), key) is False


def test_no_smooth_in_a_preset_turns_smoothing_off_and_no_is_refused(tmp_path):
    assert _load(tmp_path, {"smooth": False}).smoothing.enabled is False
    _refused(tmp_path, {"smooth": "no"}, "smooth: got the string 'no'; must be true or false")


@pytest.mark.parametrize("key", [k for k in NUMBERS if spec(k).kind is float])
@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_nan_and_infinity_are_refused(tmp_path, key, literal):
    owner, _, name = key.rpartition(".")
    text = f'{{"{name}": {literal}}}'
    if owner:
        text = f'{{"{owner}": {text}}}'
    _refused(tmp_path, text, f"{key}: ", "is not a finite number")


def test_absurd_nesting_is_one_line(tmp_path):
    deep = "[" * 10_000 + "]" * 10_000
    message = _refused(tmp_path, f'{{"seed": {deep}}}', "nested too deeply")
    assert len(message) < 300
    _refused(tmp_path, {"seed": [[[[[[1]]]]]]}, "seed: got a list")
    _refused(tmp_path, {"cadence": [1, 2]}, "cadence: got a list; must be an object")
    _refused(tmp_path, {"cadence": {"fast_flux": {"a": {"b": 1}}}}, "cadence.fast_flux: got an")
    _refused(tmp_path, "[1, 2]", "must be a JSON object, not a list")
    _refused(tmp_path, '{"seed": ' + "9" * 5000 + "}", "cannot read the preset")


def test_unknown_keys_are_named_with_the_known_ones(tmp_path):
    message = _refused(tmp_path, {"smooth_windw": 5}, "smooth_windw: unknown key", "smooth_window")
    assert all(k in message for k in ("accel_limit", "cadence", "runtime"))
    message = _refused(tmp_path, {"cadence.fast": 0.5}, "cadence.fast: unknown key")
    assert all(name in message for name in CadenceThresholds.__pydantic_fields__)
    _refused(tmp_path, {"format": "other/preset-9"}, "format: the string 'other/preset-9'")


def test_cross_field_rules(tmp_path):
    _refused(tmp_path, {"smooth_window": 4}, "smooth_window: 4 is even; must be an odd integer")
    _refused(tmp_path, {"size": 511}, "size: 511 is odd; must be an even integer 64..2048")
    _refused(tmp_path, {"smooth_window": 7, "smooth_order": 7}, "smooth_order: 7 must be below")
    _refused(
        tmp_path,
        {"cadence.fast_flux": 0.3, "cadence.calm_flux": 0.3},
        "cadence.calm_flux: 0.3 must be below fast_flux, 0.3",
    )


def test_the_issue_cases_load_without_a_clamp(tmp_path):
    s = _load(tmp_path, {"smooth_window": 51, "accel_limit": 20})
    assert (s.smooth_window, s.accel_limit) == (51, 20.0)
    _refused(tmp_path, {"smooth_window": 151}, "smooth_window: 151 is above the maximum, 101")
    assert _load(tmp_path, {"preset": "veryslow"}).preset == "veryslow"


def test_old_presets_still_load(tmp_path):
    first = {  # the first preset format (demo engine only), with a numeric stride
        "format": PRESET_FORMAT,
        "smooth": True,
        "smooth_window": 9,
        "smooth_order": 3,
        "accel_limit": 0.25,
        "stride": 2,
        "cadence": {
            "plosive_guard": 2,
            "fast_flux": 0.55,
            "calm_flux": 0.1,
            "calm_voicing": 0.5,
            "calm_level_step": 0.08,
            "max_pose_gap_deg": 1.5,
        },
        "seed": 7,
        "size": 384,
        "crf": 20,
        "preset": "veryfast",
        "backend": "demo",
    }
    p = tmp_path / "old.json"
    p.write_text(json.dumps(first))
    s = RenderSettings.load(p)
    assert (s.smooth_window, s.stride, s.cadence.plosive_guard, s.preset) == (9, "2", 2, "veryfast")
    assert s.steps == RenderSettings().steps  # later keys take their defaults
    everything = {**first, "stride": "auto", "backend": "ditto", "emotion": 6}
    everything |= {"delta_pitch": -3.0, "delta_yaw": 12.5, "delta_roll": 0.0}
    everything |= {"steps": 25, "memory": "streamed", "batch": 16, "precision": "bf16"}
    everything |= {"frame": "crop", "compile": True, "runtime": "onnxruntime"}
    everything["cadence"] = {**first["cadence"], "max_warp_px": 8.0}  # a later key
    p.write_text(json.dumps(everything))
    # later keys take their defaults (issue 21: frame rate, codec and background)
    later = {"fps": "25", "codec": "h264", "hw_encode": False, "background": "avatar"}
    later |= {"crop_scale": 2.3, "crop_vx": 0.0, "crop_vy": -0.125}  # and framing
    later["video_loop"] = "pingpong"  # and a video avatar's playback order
    later["motion_precision"] = "fp32"  # and LMDM's precision (issue 20)
    later["cadence"] = {**everything["cadence"], "max_lid_px": 2.0}  # and the blink bound
    assert RenderSettings.load(p).to_dict() == {**everything, **later}


def test_the_preset_format_keeps_its_keys_and_round_trips(tmp_path):
    s = RenderSettings(smooth_window=9, stride="2", seed=4, accel_limit=0.125)
    d = s.to_dict()
    assert list(d) == ["format", *(k for k in RenderSettings.model_fields)]
    assert list(d["cadence"]) == list(CadenceThresholds.__pydantic_fields__)
    s.save(tmp_path / "p.json")
    assert RenderSettings.load(tmp_path / "p.json") == s
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]  # written atomically


def test_preset_files_that_are_not_presets(tmp_path):
    with pytest.raises(InputError, match="absent.json: preset file not found"):
        RenderSettings.load(tmp_path / "absent.json")
    with pytest.raises(InputError, match="not a regular file"):
        RenderSettings.load(tmp_path)
    big = tmp_path / "big.json"
    big.write_text(" " * (2 << 20) + "{}")
    with pytest.raises(InputError, match="too large for a preset"):
        RenderSettings.load(big)


def test_built_settings_are_checked_and_errors_name_the_option():
    with pytest.raises(OptionError, match=r"^--smooth-window: 151 is above the maximum, 101$"):
        RenderSettings(smooth_window=151)
    with pytest.raises(OptionError, match=r"^--x264-preset: the string 'warp' is not one of"):
        RenderSettings().replace(preset="warp")
    with pytest.raises(OptionError, match=r"^cadence\.calm_flux: "):
        RenderSettings(cadence=CadenceThresholds()).replace(cadence={"calm_flux": 0.9})
    with pytest.raises(OptionError, match=r"^--accel-limit: nan is not a finite number"):
        RenderSettings(accel_limit=float("nan"))
    s = RenderSettings().replace(crf=20, stride="3")
    assert (s.crf, s.stride, s.validate()) == (20, "3", s) and s != RenderSettings()
    assert hash(s) == hash(RenderSettings(crf=20, stride="3"))


def test_the_acceleration_limit_starts_where_the_smoother_honours_it():
    assert spec("accel_limit").low == MIN_ACCEL_LIMIT


def test_the_cli_options_come_from_the_schema():
    from studio.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    render = sub["render"]
    text = " ".join(render.format_help().split())
    by_option = {o: a for a in render._actions for o in a.option_strings}
    for key in keys():
        s = spec(key)
        if s.option is None or s.kind is bool:
            continue
        action = by_option[s.option]
        assert s.option in text and s.help.split()[0] in text
        if s.choices:
            assert tuple(action.choices) == s.choices, key
            assert s.allowed in text
        else:
            assert action.type is s.kind and f"{s.allowed}; default {s.default})" in text, key


@pytest.mark.parametrize(
    "argv, value",
    [(["--x264-preset", "veryslow"], "veryslow"), (["--x264-preset", "placebo"], "placebo")],
)
def test_every_x264_preset_is_accepted_everywhere(tmp_path, argv, value):
    from studio.cli import _settings, build_parser

    args = build_parser().parse_args(["render", "--demo", "--out", str(tmp_path / "o.mp4"), *argv])
    assert _settings(args, preset=args.x264_preset).preset == value


def test_cli_values_over_a_preset_are_checked_together(tmp_path):
    from studio.cli import _settings, build_parser

    p = tmp_path / "p.json"
    RenderSettings(smooth_window=9, seed=3).save(p)
    parse = build_parser().parse_args
    args = parse(["analyze", "--demo", "--preset", str(p), "--smooth-order", "4"])
    s = _settings(args)
    assert (s.smooth_window, s.smooth_order, s.seed) == (9, 4, 3)
    args = parse(["analyze", "--demo", "--preset", str(p), "--smooth-order", "9"])
    with pytest.raises(OptionError, match=r"^--smooth-order: 9 must be below the window, 9$"):
        _settings(args)


def test_the_gui_widgets_have_the_schema_ranges_and_choices(qtbot):
    pytest.importorskip("PySide6")
    from PySide6.QtWidgets import QCheckBox, QComboBox, QDoubleSpinBox, QSpinBox

    from studio.gui.export_dialog import ExportDialog
    from studio.gui.widgets.controls import ControlsPanel

    panel = ControlsPanel()
    qtbot.addWidget(panel)
    dialog = ExportDialog("/tmp/x.mp4", 512, 18)
    qtbot.addWidget(dialog)
    panel.window.setValue(int(spec("smooth_window").high))  # the order's range follows it
    widgets = {**panel.fields, "crf": dialog.crf, "preset": dialog.preset}
    widgets |= {"fps": dialog.fps, "codec": dialog.codec, "background": dialog.background}
    widgets["hw_encode"] = dialog.hw_encode
    shown_elsewhere = {"backend", "memory", "batch"}  # engine menu; Ditto's automatic choices
    not_shown = {"cadence.calm_voicing", "cadence.calm_level_step"}  # kept from a preset
    assert set(widgets) == set(keys()) - shown_elsewhere - not_shown
    for key, w in widgets.items():
        s = spec(key)
        if isinstance(w, QSpinBox | QDoubleSpinBox):
            assert (w.minimum(), w.maximum(), w.singleStep()) == (s.low, s.high, s.step), key
            if isinstance(w, QDoubleSpinBox):
                assert w.decimals() >= s.decimals, key
        elif isinstance(w, QComboBox):
            data = [w.itemData(i) for i in range(w.count())]
            if s.choices:
                assert tuple(data) == s.choices, key
            elif key == "emotion":
                assert data == list(range(int(s.low), int(s.high) + 1))
            else:  # the size menu offers some sides, each one the schema allows
                assert data and all(s.low <= v <= s.high and v % 2 == 0 for v in data), key
        else:
            assert isinstance(w, QCheckBox) and s.kind is bool, key


def test_the_gui_shows_a_preset_as_it_is(qtbot):
    pytest.importorskip("PySide6")
    from studio.gui.widgets.controls import ControlsPanel

    panel = ControlsPanel()
    qtbot.addWidget(panel)
    cadence = CadenceThresholds(fast_flux=0.625, calm_flux=0.1234, calm_voicing=0.7)
    s = RenderSettings(
        smooth_window=51,
        smooth_order=40,
        accel_limit=20.0,
        cadence=cadence,
        delta_yaw=-12.345,
        seed=2**31 - 1,
        size=640,
        precision="fp32",  # what the demo engine runs (others fall back to it)
    )
    panel.set_settings(s)
    assert panel.window.value() == 51 and panel.accel.value() == 20.0
    assert panel.settings().to_dict() == s.to_dict()


def test_a_preset_carries_control_tracks(tmp_path, capsys):
    from conftest import run_cli

    from studio.motion.controls import ControlTracks
    from studio.settings import load_preset_tracks

    nod = ControlTracks.from_dict(
        {"tracks": {"pitch": [{"t": 1.0, "value": 0}, {"t": 1.3, "value": 8}]}}
    )
    p = tmp_path / "nod.json"
    RenderSettings(smooth_window=9).save(p, nod)
    assert RenderSettings.load(p) == RenderSettings(smooth_window=9)
    assert load_preset_tracks(p) == nod
    RenderSettings().save(tmp_path / "plain.json")
    assert load_preset_tracks(tmp_path / "plain.json") is None
    report = tmp_path / "r.json"
    argv = ["analyze", "--demo", "--preset", str(p), "--json", str(report)]
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    assert json.loads(report.read_text())["controls"] == nod.to_dict()
    bad = json.loads(p.read_text())
    bad["controls"]["tracks"]["pitch"][0]["value"] = 99
    p.write_text(json.dumps(bad))
    with pytest.raises(InputError, match=r"nod\.json: controls: pitch\[0\]: value 99"):
        load_preset_tracks(p)
