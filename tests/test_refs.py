"""Unit tests of listing, labelling, splitting and shard planning (pure functions, no Beam)."""

import pytest

from imagerecords.pipeline import config
from imagerecords.pipeline import refs
from imagerecords.pipeline.plan import shard_plan as planning
from imagerecords.pipeline.refs import ManifestColumns


def test_golden_shuffle_order():
    # Pins the shuffle: if this changes, every dataset built before gets a new order. Decide it.
    keys = [f"cls/{i:03d}.jpg" for i in range(8)]
    order = sorted(keys, key=lambda k: refs.shuffle_hash(0, k))
    assert order == GOLDEN_ORDER_SEED0
    assert refs.shuffle_hash(0, "cls/000.jpg") == GOLDEN_HASH
    assert sorted(keys, key=lambda k: refs.shuffle_hash(1, k)) != order


GOLDEN_ORDER_SEED0 = ["cls/006.jpg", "cls/007.jpg", "cls/003.jpg", "cls/000.jpg",
                      "cls/004.jpg", "cls/001.jpg", "cls/002.jpg", "cls/005.jpg"]
GOLDEN_HASH = 5430367262580387544


def test_split_assignment_is_stable_when_images_are_added():
    splits = (("train", 0.8), ("validation", 0.2))
    first = {f"k{i}": refs.assign_split(splits, 0, f"k{i}") for i in range(2000)}
    more = {f"k{i}": refs.assign_split(splits, 0, f"k{i}") for i in range(4000)}
    assert all(more[k] == v for k, v in first.items())
    share = sum(v == "validation" for v in more.values()) / len(more)
    assert 0.17 < share < 0.23
    assert {refs.assign_split(splits, 1, f"k{i}") for i in range(50)} == {"train", "validation"}


def test_plan_cuts_balanced_shards():
    hashes = sorted(refs.shuffle_hash(0, f"k{i}") for i in range(103))
    plan = planning.plan_shards("train", hashes, 0, 10)
    sizes = [0] * 10
    for h in hashes:
        sizes[plan.shard_of(h)] += 1
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 103


@pytest.mark.parametrize("count,num_bytes,asked,want", [
    (10, 10_000, None, 8),             # floor of 8 shards
    (3, 10_000, None, 3),              # never more shards than images
    (100_000, 10 * 192_000_000, None, 10),  # target size wins above the floor
    (5, 1, 7, 7),                      # explicit count is kept
    (100_000, 0, None, 58),            # no size known (URL rows): by count, 110 KB each
    (1_000, 0, None, 8),               # ... with the same floor
])
def test_choose_num_shards(count, num_bytes, asked, want):
    assert planning.choose_num_shards(count, num_bytes, asked, 192, 8) == want


def test_vocabulary_sorted_names_or_integers():
    names = refs.vocabulary(["dog", "cat", "dog", "ant"], "auto", 0)
    assert names.names == ("ant", "cat", "dog") and names.label_id("dog") == 2
    assert names.label_id("bird") is None
    ints = refs.vocabulary(["3", "0", "1"], "auto", 1)
    assert ints.integer and ints.names == ("0", "1", "2", "3") and ints.label_id("3") == 4
    assert not refs.vocabulary(["3", "0"], "name", 0).integer


def test_label_map_files():
    lm = refs.read_label_map("zebra\napple\n", "labels.txt", 1)
    assert lm.label_id("zebra") == 1 and lm.label_id("apple") == 2
    lm = refs.read_label_map('{"b": 1, "a": 0}', "m.json", 0)
    assert lm.names == ("a", "b")
    with pytest.raises(ValueError, match="m.json: label ids must be exactly 0..1"):
        refs.read_label_map('{"b": 2, "a": 0}', "m.json", 0)
    with pytest.raises(ValueError, match="repeats"):
        refs.read_label_map("a\na\n", "x.txt", 0)


def test_manifest_rows_resolve_relative_paths():
    cols = ManifestColumns()
    ref, rej = refs.parse_manifest_row({"path": "img/a.jpg", "label": "cat"}, "/data/m", cols)
    assert rej is None and ref.uri == "/data/m/img/a.jpg" and ref.key == "img/a.jpg"
    ref, _ = refs.parse_manifest_row({"uri": "gs://b/x.png", "label": 3, "key": "x", "split": "validation"}, "/d", cols)
    assert ref.uri == "gs://b/x.png" and ref.label == "3" and ref.key == "x" and ref.split == "validation"
    ref, _ = refs.parse_manifest_row({"path": "a.jpg", "label": "c"}, "gs://bucket/dir", cols)
    assert ref.uri == "gs://bucket/dir/a.jpg"
    _, rej = refs.parse_manifest_row({"path": "a.jpg"}, "/d", cols)
    assert (rej.uri, rej.reason, rej.stage, rej.skipped) == ("a.jpg", "manifest row has no 'label' value", "list", False)
    _, rej = refs.parse_manifest_row({"label": "cat"}, "/d", cols)
    assert (rej.uri, rej.stage) == ('{"label": "cat"}', "list")


def test_folder_paths_give_class_from_first_folder():
    ref, rej = refs.ref_from_folder_path("/r/", "/r/cat/sub/a.jpg", 10)
    assert (ref.label, ref.key, ref.size) == ("cat", "cat/sub/a.jpg", 10)
    _, rej = refs.ref_from_folder_path("/r/", "/r/loose.jpg", 10)
    assert "not inside a class folder" in rej.reason
    assert (rej.uri, rej.key, rej.stage, rej.error, rej.skipped) == ("/r/loose.jpg", "loose.jpg", "list", "", True)
    assert refs.is_hidden("/r/cat/.DS_Store", "/r/") and not refs.is_hidden("/r/cat/a.jpg", "/r/")


def test_config_reports_every_problem_together():
    with pytest.raises(ValueError) as e:
        config.make_config({"input": "x", "output": "y", "name": "Bad Name", "num_shards": 0, "label_offset": 1})
    msg = str(e.value)
    assert "name 'Bad Name'" in msg and "num_shards" in msg and "label_offset must be 0 with schema 'tfds'" in msg
    with pytest.raises(ValueError, match="sum to 0.9"):
        config.parse_splits("train=0.7,validation=0.2")


def test_rejected_rows_write_every_field_with_sorted_keys():
    row = refs.Rejected("/r/c/a.jpg", "not a supported image: unrecognized file signature", "c/a.jpg", "train",
                        stage="decode", error="ImageError")
    assert row.to_json() == (
        '{"error": "ImageError", "key": "c/a.jpg", "reason": "not a supported image: unrecognized file signature", '
        '"skipped": false, "split": "train", "stage": "decode", "uri": "/r/c/a.jpg"}')
    assert row.stage in refs.STAGES


def _reference_plan(sorted_hashes, num_shards):
    """The plan by definition: boundary i is the hash ranked i*n//S in one sorted list."""
    n = len(sorted_hashes)
    return tuple(sorted_hashes[(i * n) // num_shards] for i in range(1, num_shards))


@pytest.mark.parametrize("n,num_shards,spread", [
    (103, 10, 64), (5000, 37, 64), (1000, 7, 0), (64, 64, 64), (1, 1, 64), (9, 4, 1),
])
def test_bucketed_plan_equals_the_sorted_list_plan(n, num_shards, spread):
    """The bucket-count plan cuts at exactly the hashes a global sort would, including skewed inputs
    (spread 0: every hash in one bucket; 1: two buckets) and repeated hashes."""
    import random

    rng = random.Random(n * 1000 + num_shards)
    hashes = sorted(rng.getrandbits(spread) << (64 - max(spread, 1)) | rng.getrandbits(8) for _ in range(n))
    hashes = sorted(hashes + hashes[: n // 10])  # some repeats, as keys listed twice give
    plan = planning.plan_shards("train", hashes, 0, num_shards)
    assert plan.boundaries == _reference_plan(hashes, num_shards)
    counts = [0] * num_shards
    for h in hashes:
        counts[plan.shard_of(h)] += 1
    assert sum(counts) == len(hashes)


def test_coarse_plan_names_bucket_and_offset_of_each_cut():
    # Bucket 0 holds 3 hashes, bucket 5 holds 2: ranks 1, 2, 3 of 5 (S=5 -> ranks 1..4).
    counts = {0: 3, 5: 2}
    plan = planning.coarse_plan("train", counts, 0, 5)
    assert plan.cuts == ((1, 0, 1), (2, 0, 2), (3, 5, 0), (4, 5, 1))
    assert plan.buckets == {0, 5} and plan.count == 5


@pytest.mark.parametrize("label,code", [("cat\ndog", "000A"), ("a\tb", "0009"), ("nul\0", "0000"), ("del\x7f", "007F"),
                                        ("c1\x85", "0085"), ("cr\r", "000D"), ("ls\u2028", "2028")])
def test_control_characters_in_labels_are_rejected_rows(label, code):
    cols = ManifestColumns()
    ref, rej = refs.parse_manifest_row({"path": "a.jpg", "label": label, "key": "k", "split": "train"}, "/d", cols)
    assert ref is None
    assert (rej.uri, rej.key, rej.split, rej.stage, rej.skipped) == ("a.jpg", "k", "train", "label", False)
    assert rej.reason.startswith(f"label {label!r} holds control character U+{code}: ")
    assert "one per line into label.labels.txt" in rej.reason
    ref, rej = refs.ref_from_folder_path("/r/", f"/r/{label}/a.jpg", 10)
    assert ref is None and (rej.uri, rej.key, rej.stage) == (f"/r/{label}/a.jpg", f"{label}/a.jpg", "label")
    assert rej.reason.startswith(f"class folder name {label!r} holds control character U+{code}")


def test_printable_labels_are_kept_as_they_are():
    for label in ("cat dog", "chat noir é", "日本", "a/b", "0"):
        assert refs.label_problem(label) is None
        ref, rej = refs.parse_manifest_row({"path": "a.jpg", "label": label}, "/d", ManifestColumns())
        assert rej is None and ref.label == label


def test_list_and_object_labels_are_rejected_rows():
    cols = ManifestColumns()
    _, rej = refs.parse_manifest_row({"path": "a.jpg", "label": ["cat", "dog"], "key": "k"}, "/d", cols)
    assert (rej.key, rej.stage) == ("k", "label")
    assert rej.reason == ("label [\"cat\", \"dog\"] is a list, not a class label: give one class name in 'label'; "
                          "for several classes per image, put them in another column and declare it a class list "
                          "(--feature tags=class_list)")
    _, rej = refs.parse_manifest_row({"path": "a.jpg", "label": {"name": "cat"}}, "/d", cols)
    assert rej.reason.startswith('label {"name": "cat"} is a JSON object, not a class label')


def test_label_map_names_with_control_characters_are_refused():
    with pytest.raises(ValueError, match=r"m.json: label name 'a\\nb' holds control character U\+000A"):
        refs.read_label_map('{"a\\nb": 0, "c": 1}', "m.json", 0)
    with pytest.raises(ValueError, match=r"x.txt: label name 'a\\tb' holds control character U\+0009"):
        refs.read_label_map("a\tb\nc\n", "x.txt", 0)
