"""Transform tests: each composite step on a real TestPipeline (DirectRunner in memory: the fast tier), asserted
with assert_that."""

import apache_beam as beam
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from imagerecords.pipeline import refs as refs_lib
from imagerecords.pipeline.refs import ImageRef, LabelMap
from imagerecords.transforms import AssignLabels, GlobalShuffle, ReadImages, ReadManifest
from imagerecords.transforms.common import REJECTED


def _refs(n, split="train"):
    return [ImageRef(f"c{i % 3}/{i:04d}.jpg", f"/x/{i}.jpg", f"c{i % 3}", split, size=100) for i in range(n)]


def test_global_shuffle_balances_and_orders_by_hash():
    data = _refs(23) + _refs(5, "validation")

    def check(groups):
        by_split = {}
        for (split, index, num), members in groups:
            by_split.setdefault(split, {})[index] = members
            hashes = [refs_lib.shuffle_hash(7, r.key) for r in members]
            assert hashes == sorted(hashes), "shard not in hash order"
        train = by_split["train"]
        assert sorted(train) == list(range(4))
        sizes = [len(m) for m in train.values()]
        assert sum(sizes) == 23 and max(sizes) - min(sizes) <= 1
        # Concatenated shards give the global hash order.
        flat = [r.key for i in sorted(train) for r in train[i]]
        assert flat == sorted((r.key for r in data if r.split == "train"), key=lambda k: refs_lib.shuffle_hash(7, k))
        assert sum(len(m) for m in by_split["validation"].values()) == 5

    with TestPipeline() as p:
        out = p | beam.Create(data) | GlobalShuffle(seed=7, num_shards=4)
        assert_that(out["shards"], check, label="CheckShards")


def test_global_shuffle_emits_empty_planned_shards():
    # Three copies of one key share a hash, so one shard holds them all and two stay empty.
    data = [ImageRef("same", f"/x/{i}.jpg", "a", "train", size=1) for i in range(3)]
    with TestPipeline() as p:
        out = p | beam.Create(data) | GlobalShuffle(num_shards=3)
        sizes = out["shards"] | beam.Map(lambda kv: (kv[0], len(kv[1])))
        assert_that(sizes | beam.Map(lambda kv: kv[1]), equal_to([0, 0, 3]), label="Sizes")
        assert_that(sizes | beam.Map(lambda kv: kv[0][1]), equal_to([0, 1, 2]), label="Indices")


def test_assign_labels_builds_vocabulary_and_rejects_unknown():
    data = [ImageRef("a", "/a", "dog", ""), ImageRef("b", "/b", "cat", "validation"), ImageRef("c", "/c", "emu", "")]
    with TestPipeline() as p:
        out = p | beam.Create(data) | AssignLabels()
        assert_that(out["refs"] | beam.Map(lambda r: (r.key, r.label_id, r.split)),
                    equal_to([("a", 1, "train"), ("b", 0, "validation"), ("c", 2, "train")]), label="Ids")
        assert_that(out["labels"] | beam.Map(lambda m: m.names), equal_to([("cat", "dog", "emu")]), label="Vocab")

    with TestPipeline() as p:
        out = p | beam.Create(data) | AssignLabels(label_map=LabelMap(("cat", "dog"), offset=1))
        assert_that(out["refs"] | beam.Map(lambda r: (r.key, r.label_id)), equal_to([("a", 2), ("b", 1)]), label="Ids")
        assert_that(out[REJECTED] | beam.Map(lambda r: (r.uri, r.reason, r.stage)),
                    equal_to([("/c", "label 'emu' is not in the label map", "label")]), label="Rejected")


def test_list_images_and_read_manifest_agree(image_tree, tmp_path):
    root, files = image_tree
    manifest = tmp_path / "m.csv"
    rows = ["path,label"] + [f"{root}/{cls}/{rel},{cls}" for cls, rels in files.items() for rel in rels]
    manifest.write_text("\n".join(rows) + "\n/nowhere/x.jpg,cat\n")
    with TestPipeline() as p:
        listed = p | "List" >> ReadImages(str(root))
        read = p | "Read" >> ReadManifest(str(manifest), header="path,label")
        want = sorted((f"{root}/{c}/{r}", c) for c, rels in files.items() for r in rels) + [(f"{root}/circle/truncated.jpg", "circle")]
        assert_that(listed.refs | "L" >> beam.Map(lambda r: (r.uri, r.label)), equal_to(want), label="Listed")
        assert_that(read.refs | "R" >> beam.Map(lambda r: (r.uri, r.label)),
                    equal_to([w for w in want if not w[0].endswith("truncated.jpg")]), label="Read")
        assert_that(read[REJECTED] | beam.Map(lambda r: (r.uri, r.reason, r.stage, r.error)),
                    equal_to([("/nowhere/x.jpg", "file not found", "list", "FileNotFoundError")]), label="Missing")
        assert_that(listed[REJECTED], equal_to([]), label="NothingRejectedAtListing")


def test_repeated_keys_are_ordered_whatever_the_grouping():
    # The same key listed with two labels: the kept one must not depend on input order.
    a = ImageRef("k", "/x/a.jpg", "cat", "train", size=1, label_id=0)
    b = ImageRef("k", "/x/a.jpg", "dog", "train", size=1, label_id=1)
    for data in ([a, b], [b, a]):
        with TestPipeline() as p:
            out = p | beam.Create(data) | GlobalShuffle(num_shards=1)
            assert_that(out["shards"] | beam.Map(lambda kv: [r.label for r in kv[1]]), equal_to([["cat", "dog"]]))


def test_refs_cross_stages_with_the_compact_deterministic_coder():
    from apache_beam.coders import typecoders

    from imagerecords.transforms.coders import ImageRefCoder

    coder = typecoders.registry.get_coder(ImageRef)
    ref = ImageRef("n01440764/n01440764_10026.JPEG", "gs://b/train/n01440764/n01440764_10026.JPEG", "n01440764",
                   "train", 110_000, 3)
    assert isinstance(coder, ImageRefCoder) and coder.is_deterministic()
    assert coder.decode(coder.encode(ref)) == ref
    assert coder.decode(coder.encode(ImageRef("k", "u", None, ""))) == ImageRef("k", "u", None, "")
    row = ImageRef("d.npz:000000007", "d.npz#row=7", "3", "train", 12, 3, '{"w":[1]}', row=7)  # a row stays one
    assert coder.decode(coder.encode(row)) == row and coder.decode(coder.encode(row)).row == 7
    # Fields only: the pickled dataclass Beam used before was ~220 bytes for this ref; a file's row is one byte.
    assert len(coder.encode(ref)) == len(ref.key) + len(ref.uri) + len(ref.label) + len(ref.split) + 4 + 1 + 3 + 1 + 1
    p = TestPipeline()
    shards = p | beam.Create(_refs(3)) | GlobalShuffle(num_shards=1)
    assert "ImageRefCoder" in str(typecoders.registry.get_coder(shards["shards"].element_type))


def test_manifest_size_column_and_skip_stat_avoid_the_per_row_lookup(tmp_path):
    # The rows name files that do not exist: only a lookup could notice, and none is made.
    (tmp_path / "sized.csv").write_text("path,label,size\n/nowhere/a.jpg,cat,1234\n/nowhere/b.jpg,cat,x\n")
    (tmp_path / "plain.csv").write_text("path,label\n/nowhere/c.jpg,dog\n")
    with TestPipeline() as p:
        sized = p | "Sized" >> ReadManifest(str(tmp_path / "sized.csv"), header="path,label,size")
        plain = p | "Plain" >> ReadManifest(str(tmp_path / "plain.csv"), header="path,label", stat=False)
        assert_that(sized.refs | "S" >> beam.Map(lambda r: (r.uri, r.size)), equal_to([("/nowhere/a.jpg", 1234)]),
                    label="SizeFromColumn")
        assert_that(sized[REJECTED] | "SR" >> beam.Map(lambda r: (r.uri, r.stage, r.reason)),
                    equal_to([("/nowhere/b.jpg", "list", "manifest row's 'size' is not a size in bytes: 'x'")]),
                    label="BadSize")
        assert_that(plain.refs | "P" >> beam.Map(lambda r: (r.uri, r.size)), equal_to([("/nowhere/c.jpg", -1)]),
                    label="NoLookup")
