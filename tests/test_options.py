"""The build's settings by concern: small frozen classes that each check their own fields, of which
BuildConfig is made (one flat set of setting names for build(), the flags and the transforms)."""

import dataclasses

import pytest

from imagerecords.pipeline import config as config_lib
from imagerecords.pipeline.config import BuildConfig
from imagerecords.pipeline.encode.image_codec import ImageOptions

OWN = {"input", "output", "name", "schema", "image", "writer", "record_format", "threads", "features"}


def test_every_setting_belongs_to_one_concern_or_to_the_build_itself():
    owners = {}
    for concern in config_lib.CONCERNS:
        for f in dataclasses.fields(concern):
            assert f.name not in owners, f"{f.name} is in {owners.get(f.name)} and {concern.__name__}"
            owners[f.name] = concern.__name__
    assert set(owners) & OWN == set()
    # The concerns are fields of BuildConfig, never its bases; the flat names are one table's.
    concerns = {f.name for f in dataclasses.fields(BuildConfig)} - OWN
    assert concerns == {"columns", "labels", "split", "shards", "download", "publish"}
    assert not any(issubclass(BuildConfig, concern) for concern in config_lib.CONCERNS)
    image = {f.name for f in dataclasses.fields(ImageOptions)}
    assert set(config_lib.SETTINGS) == set(owners) | (OWN - {"image"}) | image
    config = BuildConfig.of(input="photos/", output="out/", num_shards=3, quality=80, http_per_host=2)
    assert (config.shards.num_shards, config.image.quality, config.download.http_per_host) == (3, 80, 2)
    for attr in concerns:
        concern = getattr(config, attr)
        assert type(concern) in config_lib.CONCERNS
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(concern, dataclasses.fields(concern)[0].name, None)
    assert config.replace(num_shards=5, version_name=None).shards.num_shards == 5
    assert config.replace(num_shards=5).flat() == dict(config.flat(), num_shards=5)


@pytest.mark.parametrize("concern, values, message", [
    (config_lib.ShardOptions, {"num_shards": 0}, "num_shards must be within 1..99,999 (shards of one split), got 0"),
    (config_lib.ShardOptions, {"target_shard_mb": 0.0}, "target_shard_mb must be > 0, got 0.0"),
    (config_lib.LabelOptions, {"label_type": "float"}, "label_type 'float' is not one of auto, name, int"),
    (config_lib.DownloadOptions, {"http_per_host": 0}, "http_per_host must be within 1..1024, got 0"),
    (config_lib.PublishOptions, {"keep_versions": 0}, "keep_versions must be >= 1, got 0"),
    (config_lib.PublishOptions, {"version_name": "v-1"}, "version_name 'v-1' starts with 'v-'"),
    (config_lib.PublishOptions, {"max_download_failures": 1.5}, "max_download_failures must be within 0..1, got 1.5"),
    (config_lib.SplitOptions, {"splits": (("train", 0.7), ("test", 0.2))}, "splits: fractions sum to 0.9, not 1"),
    (config_lib.SplitOptions, {"split_names": ("train", "a/b")}, "split_names: "),
    (config_lib.InputColumns, {"label_column": ""}, "label_column must name a column, got an empty name"),
])
def test_a_concern_checks_its_own_fields_alone_and_inside_the_build(concern, values, message):
    with pytest.raises(ValueError) as alone:
        concern(**values)
    with pytest.raises(ValueError) as inside:
        BuildConfig.of(input="photos/", output="out/", **values)
    assert str(alone.value).startswith("invalid build configuration: " + message)
    assert str(inside.value) == str(alone.value)


def test_a_stage_takes_only_its_concern():
    from imagerecords.pipeline.sources.manifests import ManifestSource

    alone = ManifestSource.downloading(config_lib.DownloadOptions(http_per_host=2, http_retries=0))
    whole = ManifestSource().bind(BuildConfig.of(input="a.csv", output="out/", http_per_host=2, http_retries=0))
    assert alone._http == whole._http
    assert (alone._http.per_host, alone._http.retries, alone._http.workers) == (2, 0, 16)
    columns = config_lib.InputColumns(path_column="url").manifest_columns()
    assert columns == BuildConfig.of(input="a.csv", output="out/", path_column="url").manifest_columns()


def test_the_download_budget_is_recorded_only_when_given():
    # Absent at its default: a default build's manifest keeps its bytes; given, an --append takes it from there.
    assert "max_download_failures" not in BuildConfig.of(input="urls.csv", output="out/").to_json()
    assert BuildConfig.of(input="urls.csv", output="out/", max_download_failures=0.3).to_json()["max_download_failures"] == 0.3
