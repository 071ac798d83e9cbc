"""The build's command line (imagerecords.cli.flags): generated flags, layering, unknown flags."""

import dataclasses
import glob
import os
import re

import pytest

from imagerecords.cli import flags
from imagerecords.cli.exit_codes import exit_code
from imagerecords.pipeline import config as config_lib
from imagerecords.pipeline.config import BuildConfig
from imagerecords.pipeline.encode.image_codec import ImageOptions
from imagerecords.pipeline.errors import UsageError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IO = ["--input", "in/", "--output", "out/"]

# Every flag the build had before the flags were generated, with a value and where it lands.
# (argv, attribute path on Parsed, expected value)
CURRENT_FLAGS = [
    (["--name", "pets"], "config.name", "pets"),
    (["--schema", "tf-models"], "config.schema", "tf-models"),
    (["--seed", "7"], "config.split.seed", 7),
    (["--splits", "train=0.75,validation=0.25"], "config.split.splits", (("train", 0.75), ("validation", 0.25))),
    (["--split_seed", "3"], "config.split.split_seed", 3),
    (["--split_names", "train,test"], "config.split.split_names", ("train", "test")),
    (["--num_shards", "5"], "config.shards.num_shards", 5),
    (["--target_shard_mb", "64.5"], "config.shards.target_shard_mb", 64.5),
    (["--min_shards", "2"], "config.shards.min_shards", 2),
    (["--max_side", "64"], "config.image.max_side", 64),
    (["--short_side", "32"], "config.image.short_side", 32),
    (["--quality", "70"], "config.image.quality", 70),
    (["--reencode"], "config.image.reencode", True),
    (["--writer", "beam"], "config.writer", "beam"),
    (["--label_map", "labels.txt"], "config.labels.label_map", "labels.txt"),
    (["--label_type", "int"], "config.labels.label_type", "int"),
    (["--schema", "tf-models", "--label_offset", "1"], "config.labels.label_offset", 1),
    (["--path_column", "file"], "config.columns.path_column", "file"),
    (["--label_column", "cls"], "config.columns.label_column", "cls"),
    (["--split_column", "fold"], "config.columns.split_column", "fold"),
    (["--key_column", "id"], "config.columns.key_column", "id"),
    (["--max_reject_fraction", "0.25"], "config.publish.max_reject_fraction", 0.25),
    (["--threads", "2"], "config.threads", 2),
    (["--write_index"], "config.publish.write_index", True),
    (["--overwrite"], "config.publish.overwrite", True),
    (["--no_progress"], "launcher.no_progress", True),
    (["--verbose"], "launcher.verbose", True),
    (["--ignore_split_column"], "options.ignore_split_column", True),
    (["--break_lock"], "options.break_lock", True),
    (["--detached"], "options.detached", True),
    (["--local_workers", "3"], "options.local_workers", 3),
]


def _get(obj, path):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def _help_of(flag):
    """The help text argparse shows for `flag`, with %-escapes expanded."""
    for action in flags.parser()._actions:
        if flag in action.option_strings:
            return action.help % {"default": action.default}
    raise AssertionError(f"{flag} is not a flag")


@pytest.mark.parametrize("argv,attr,expected", CURRENT_FLAGS, ids=[c[0][-1] if len(c[0]) == 1 else c[0][-2]
                                                                 for c in CURRENT_FLAGS])
def test_every_current_flag_parses_to_the_same_value(argv, attr, expected):
    parsed = flags.parse_args(IO + argv)
    assert _get(parsed, attr) == expected
    assert parsed.beam_args == []


def test_no_flags_give_the_dataclass_defaults():
    parsed = flags.parse_args(IO)
    assert parsed.config == BuildConfig.of(input="in/", output="out/")
    assert parsed.launcher == flags.LauncherFlags()
    assert parsed.beam_args == []


def test_input_and_output_flags():
    parsed = flags.parse_args(["--output", "gs://b/ds", "--input", "gs://b/photos/train.csv"])
    assert (parsed.config.input, parsed.config.output) == ("gs://b/photos/train.csv", "gs://b/ds")


def test_config_flag_is_the_preset_path(tmp_path):
    path = _write(tmp_path / "p.yaml", "seed: 1\n")
    assert flags.parse_args(IO + ["--config", path]).launcher.config_file == path


def test_every_dataclass_field_has_a_flag():
    names = set(flags.build_flag_names())
    fields = [name for name in config_lib.SETTINGS if name != "features"]  # the image's settings among them
    assert {f"--{n}" for n in fields} <= names
    assert "--feature" in names  # features: one repeatable --feature NAME=DTYPE[DIMS] each
    assert "--image" not in names
    old = {c[0][-1] if c[0][-1].startswith("--") else c[0][-2] for c in CURRENT_FLAGS}
    assert old | {"--input", "--output", "--config"} <= names


def test_build_flags_do_not_collide_with_beam_options():
    assert set(flags.build_flag_names()) & set(flags.beam_flag_names()) == set()


def test_preset_is_layered_under_flags(tmp_path):
    path = _write(tmp_path / "preset.yaml",
                  "seed: 5\nnum_shards: 3\nquality: 80\nsplit_names: [train, test]\n"
                  "splits: {train: 0.5, test: 0.5}\n"
                  "beam_options:\n  runner: DirectRunner\n  direct_num_workers: 2\n")
    parsed = flags.parse_args(IO + ["--config", path, "--seed", "9", "--direct_num_workers=4"])
    assert parsed.config.split.seed == 9  # flag wins
    assert parsed.config.shards.num_shards == 3  # preset wins over the default
    assert parsed.config.image.quality == 80
    assert parsed.config.split.split_names == ("train", "test")
    assert parsed.config.split.splits == (("train", 0.5), ("test", 0.5))
    assert parsed.config.shards.min_shards == 8  # default
    # The preset's Beam options come first, so the command line's win when Beam parses them.
    assert parsed.beam_args == ["--runner=DirectRunner", "--direct_num_workers=2", "--direct_num_workers=4"]


def test_preset_can_hold_input_and_output(tmp_path):
    path = _write(tmp_path / "p.yaml", "input: a/\noutput: b/\n")
    parsed = flags.parse_args(["--config", path])
    assert (parsed.config.input, parsed.config.output) == ("a/", "b/")


@pytest.mark.parametrize("preset", sorted(glob.glob(os.path.join(REPO, "configs", "*.yaml"))),
                         ids=os.path.basename)
def test_shipped_presets_parse(preset):
    parsed = flags.parse_args(IO + ["--config", preset])
    assert parsed.launcher.config_file == preset
    assert all(a.startswith("--") for a in parsed.beam_args)


@pytest.mark.parametrize("typo,meant", [
    ("--num-shards", "--num_shards"),
    ("--max-side", "--max_side"),
    ("--target-shard-mb", "--target_shard_mb"),
    ("--num_shard", "--num_shards"),
    ("--runer", "--runner"),
    ("--flink-master", "--flink_master"),
])
def test_unknown_flag_is_refused_with_a_suggestion(typo, meant):
    with pytest.raises(UsageError) as e:
        flags.parse_args(IO + [typo, "2"])
    assert str(e.value) == f"unknown flag {typo} (did you mean {meant}?)"
    assert exit_code(e.value) == 2


def test_unknown_flag_with_equals_is_named_without_its_value():
    with pytest.raises(UsageError, match=r"^unknown flag --num-shards \(did you mean --num_shards\?\)$"):
        flags.parse_args(IO + ["--num-shards=2"])


def test_unknown_flag_without_a_close_match():
    with pytest.raises(UsageError) as e:
        flags.parse_args(IO + ["--frobnicate"])
    assert str(e.value).startswith("unknown flag --frobnicate; it is neither a build flag nor a Beam pipeline option")


def test_a_prefix_is_not_taken_for_a_longer_flag():
    # argparse (and Beam's parser) would expand --num to --num_shards or --num_workers by default.
    with pytest.raises(UsageError, match="unknown flag --num"):
        flags.parse_args(IO + ["--num", "2"])


def test_a_stray_value_is_refused():
    with pytest.raises(UsageError, match="unexpected argument 'photos'"):
        flags.parse_args(IO + ["photos"])


def test_beam_options_pass_through_in_both_forms():
    beam = ["--runner=DirectRunner", "--direct_num_workers", "2", "--flink_master=localhost:8081",
            "--experiments=a", "--job_name", "my-job", "--save_main_session"]
    parsed = flags.parse_args(IO + beam + ["--num_shards", "3"])
    assert parsed.beam_args == beam
    assert parsed.config.shards.num_shards == 3
    assert parsed.config == BuildConfig.of(input="in/", output="out/").replace(num_shards=3)


def test_a_beam_value_is_not_taken_for_a_flag():
    # '-1' and '2' are values of the Beam flags before them, not flags or stray arguments.
    parsed = flags.parse_args(IO + ["--direct_num_workers", "2", "--max_cache_memory_usage_mb", "-1"])
    assert parsed.beam_args == ["--direct_num_workers", "2", "--max_cache_memory_usage_mb", "-1"]


def test_a_bad_beam_value_is_a_usage_error():
    with pytest.raises(UsageError, match="--direct_num_workers: invalid int value: 'many'"):
        flags.parse_args(IO + ["--direct_num_workers", "many"])


def test_a_bad_build_value_is_a_usage_error():
    with pytest.raises(UsageError, match="--num_shards: invalid int value: 'x'"):
        flags.parse_args(IO + ["--num_shards", "x"])
    with pytest.raises(UsageError, match=r"--writer: invalid choice: 'fast'"):
        flags.parse_args(IO + ["--writer", "fast"])


def test_unknown_beam_option_in_a_preset_names_the_file(tmp_path):
    path = _write(tmp_path / "cluster.yaml", "beam_options:\n  runner: FlinkRunner\n  flink_mastr: host:8081\n")
    with pytest.raises(UsageError) as e:
        flags.parse_args(IO + ["--config", path])
    assert str(e.value) == f"--config {path}: beam_options: unknown flag --flink_mastr (did you mean --flink_master?)"


def test_unknown_setting_in_a_preset_names_the_file(tmp_path):
    path = _write(tmp_path / "p.yaml", "num_shard: 3\n")
    with pytest.raises(UsageError, match=f"^{path}: unknown setting\\(s\\) num_shard$"):
        flags.parse_args(IO + ["--config", path])


def test_preset_value_of_the_wrong_type_names_the_file(tmp_path):
    path = _write(tmp_path / "p.yaml", "num_shards: many\n")
    with pytest.raises(UsageError) as e:
        flags.parse_args(IO + ["--config", path])
    assert str(e.value) == f"--config {path}: num_shards must be int, got 'many'"


def test_invalid_yaml_names_the_file_and_line(tmp_path):
    path = _write(tmp_path / "p.yaml", "seed: 1\nnum_shards: [3\n")
    with pytest.raises(UsageError, match=f"^--config {path}: not valid YAML at line 3"):
        flags.parse_args(IO + ["--config", path])


def test_missing_config_file(tmp_path):
    path = str(tmp_path / "nope.yaml")
    with pytest.raises(UsageError) as e:
        flags.parse_args(IO + ["--config", path])
    assert str(e.value) == f"--config {path}: no such file"
    assert exit_code(e.value) == 2


@pytest.mark.parametrize("argv,missing", [
    (["--output", "o"], "--input is required"),
    (["--input", "i"], "--output is required"),
    ([], "--input and --output are required"),
])
def test_missing_input_or_output(argv, missing):
    with pytest.raises(UsageError, match=missing):
        flags.parse_args(argv)


def test_config_validation_error_is_a_usage_error_with_its_text():
    with pytest.raises(UsageError) as e:
        flags.parse_args(IO + ["--num_shards", "0"])
    assert str(e.value) == "invalid build configuration: num_shards must be within 1..99,999 (shards of one split), got 0"
    with pytest.raises(UsageError, match=r"^--splits: fractions sum to 0.9, not 1"):
        flags.parse_args(IO + ["--splits", "train=0.5,validation=0.4"])
    with pytest.raises(UsageError, match=r"^quality must be within 1..100"):
        flags.parse_args(IO + ["--quality", "101"])
    assert flags.parse_args(IO + ["--quality", "100"]).config.image.quality == 100


def _expected_default_text(value):
    # The rendering rule, spelled out independently of flags._format_default.
    if value is None:
        return "not set"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value == int(value):
        return str(int(value))
    if isinstance(value, tuple):  # a list flag: as it is typed, comma-separated
        return ",".join(map(str, value))
    return str(value)


@pytest.mark.parametrize("field", [f for cls in (*config_lib.CONCERNS, BuildConfig, ImageOptions)
                                   for f in dataclasses.fields(cls) if config_lib.SETTINGS.get(f.name) is not None
                                   and f.name != "features"], ids=lambda f: f.name)
def test_help_shows_each_field_default_from_the_dataclass(field):
    text = _help_of(f"--{field.name}")
    if field.default is dataclasses.MISSING:
        assert text.endswith("(required)")
    else:
        # An empty field the code fills shows what it fills in (test_help_texts.py checks the User-Agent's).
        shown = flags._SHOWN_DEFAULTS.get(field.name) or _expected_default_text(field.default)
        assert text.endswith(f"(default: {shown})")


def test_help_text_comes_from_the_attributes_docstring():
    # A field named in backticks in the docstring is its flag on the command line.
    assert _help_of("--target_shard_mb") == ("wanted shard size in MB (input bytes) when --num_shards is not set "
                                             "(default: 192)")
    assert _help_of("--quality").startswith("JPEG quality (1-100; above 95 files grow fast for little gain) used")
    assert _help_of("--key_column").startswith("manifest column with each image's unique id")
    assert "'uri'" in _help_of("--path_column") and "'uri'" not in _help_of("--label_column")


def _help_texts():
    """{flag: help text} of every flag the build itself takes, defaults included."""
    return {a.option_strings[-1]: a.help % {"default": a.default}
            for a in flags.parser()._actions if a.option_strings and a.help}


def test_no_two_flags_share_a_help_text():
    texts = _help_texts()
    # The text without its "(default: ...)" tail: two flags told apart only by their default share it.
    bodies = {}
    for flag, text in texts.items():
        bodies.setdefault(text.rsplit(" (default: ", 1)[0], []).append(flag)
    assert [flags_ for flags_ in bodies.values() if len(flags_) > 1] == []
    assert len(texts) > 30  # every build and launcher flag was looked at


# Python in a help text: module.CONSTANT, None/True/False, a field named as in the docstring
# (`num_shards`, or num_shards not written as --num_shards).
_FIELD_NAMES = list(config_lib.SETTINGS)
_CODE_PATTERNS = [r"\b[a-z_]\w*\.[A-Z][A-Z0-9_]+\b", r"\b(None|True|False)\b", r"`\w+`"] + \
    [rf"(?<![-\w]){name}\b" for name in _FIELD_NAMES if "_" in name]


@pytest.mark.parametrize("pattern", _CODE_PATTERNS[:3] + [p for p in _CODE_PATTERNS if "num_shards" in p])
def test_the_code_patterns_catch_what_they_are_for(pattern):
    assert re.search(pattern, "example schema preset, one of schema.PRESETS; None picks `num_shards` "
                              "from num_shards")


def test_no_help_text_names_python_code():
    found = {flag: [m.group(0) for p in _CODE_PATTERNS for m in re.finditer(p, text)]
             for flag, text in _help_texts().items()}
    assert {flag: hits for flag, hits in found.items() if hits} == {}


@pytest.mark.parametrize("flag,field", [(f"--{name}", name) for name in flags.CHOICES])
def test_help_of_a_fixed_choice_names_every_choice(flag, field):
    text = _help_of(flag)
    assert all(f"'{choice}'" in text for choice in flags.CHOICES[field]), text


@pytest.mark.parametrize("runner,hint", [("DirectRuner", " (did you mean DirectRunner?)"), ("Foo", "")])
def test_a_mistyped_runner_is_a_usage_error_naming_the_known_runners(runner, hint):
    with pytest.raises(UsageError) as e:
        flags.parse_args(IO + ["--runner", runner])
    assert str(e.value).startswith(f"--runner {runner}: no such Beam runner{hint}; known runners: DataflowRunner, ")
    assert "FlinkRunner" in str(e.value) and "\n" not in str(e.value)
    assert exit_code(e.value) == 2


def test_known_runners_pass_in_the_forms_beam_takes(tmp_path):
    for runner in ("DirectRunner", "directrunner", "Direct", "FlinkRunner", "apache_beam.runners.direct.DirectRunner"):
        assert flags.parse_args(IO + [f"--runner={runner}"]).beam_args == [f"--runner={runner}"]
    # A preset's runner is checked too; the last --runner given is the one Beam takes.
    path = _write(tmp_path / "p.yaml", "beam_options:\n  runner: DirectRuner\n")
    with pytest.raises(UsageError, match="--runner DirectRuner: no such Beam runner"):
        flags.parse_args(IO + ["--config", path])
    assert flags.parse_args(IO + ["--config", path, "--runner", "DirectRunner"]).beam_args[-1] == "DirectRunner"
    with pytest.raises(UsageError, match="no module nowhere.at_all to import the runner from"):
        flags.parse_args(IO + ["--runner", "nowhere.at_all.Runner"])


def test_help_lists_defaults_and_points_to_beam(capsys):
    with pytest.raises(SystemExit) as e:
        flags.parse_args(["--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--target_shard_mb TARGET_SHARD_MB" in out
    assert "(default: 192)" in out and "(default: 0.01)" in out and "(default: tfds)" in out
    assert "Any other flag must be an Apache Beam pipeline option" in out
    assert "--ignore_split_column" in out and "--break_lock" in out and "--verbose" in out
