"""--append: what the published dataset already holds, and how a delta's inputs are checked against it."""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
from typing import Any, Collection, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from imagerecords.format import features as features_lib
from imagerecords.format import side_files

from imagerecords.format import record_format, schema
from imagerecords.format import manifest as manifest_lib
from imagerecords.format.manifest import MANIFEST, Manifest, ManifestError, Split
from imagerecords.format.record_format import index_file_name
from imagerecords.pipeline import config as config_lib
from imagerecords.pipeline import errors, storage
from imagerecords.pipeline.encode import image_codec as codec
from imagerecords.pipeline.naming import setting
from imagerecords.pipeline import refs as refs_lib
from imagerecords.pipeline.plan import near
from imagerecords.pipeline.refs import DuplicateGroup, ImageRef, LabelMap, Rejected
from imagerecords.pipeline.read import download
from imagerecords.pipeline.write.stream import content_digest

log = logging.getLogger(__name__)

__all__ = ["Base", "Known", "load_base", "grow_labels", "against", "merged_manifest", "with_dataset_settings"]

# Build settings that shape a record's bytes, its split or its place in the shuffle: an append
# refuses one given with another value than the dataset's (the seed too: the manifest records one).
_SAME = ("image", "splits", "split_seed", "label_offset", "label_type", "write_index", "writer", "split_column",
         "key_column", "seed")
# Recorded settings an append does not take from the dataset: sized or placed for the run that
# recorded them (a shard count for the whole dataset, not a delta; that machine's threads and paths;
# split names only the Beam sink reads, which cannot append). The dataset's class ids come from its
# manifest, not from its label map file.
_NOT_TAKEN = ("num_shards", "threads", "skip_stat", "label_map", "split_names", "features_only")


@dataclasses.dataclass(frozen=True)
class Known:
    """What the dataset stores under one key.

    Attributes:
      split: its split.
      label: its class name ('' when the record has none).
      shard: the shard file (relative to the dataset folder) holding it.
      digest: content digest (stream.content_digest) of the source file's bytes (from the
        shard's keys file), or of the stored image bytes (read from the shard when it has none).
      size: the source file's size when it was listed (-1: unknown).
      since_ns: when the build that wrote it started (ns since the epoch; None: unknown): a local
        file neither modified nor linked since then is the file that build read.
    """

    split: str
    label: str
    shard: str
    digest: bytes
    size: int = -1
    since_ns: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class Base:
    """The published dataset an append adds to.

    Attributes:
      manifest: its manifest.
      keys: {key: Known} of every record it holds.
    """

    manifest: Manifest
    keys: Mapping[str, Known]

    @property
    def labels(self) -> LabelMap:
        """The published class ids (and class-list vocabularies): an append only adds after them."""
        lists = tuple(sorted((name, tuple(spec.get("names") or ())) for name, spec in self.manifest.features.items()
                             if spec.get("dtype") == "class_list"))
        return LabelMap(tuple(self.manifest.label_names), self.manifest.label_offset, self.manifest.integer_labels,
                        lists)


def _one_line(text: str) -> errors.UsageError:
    return errors.UsageError(f"{setting('append')} refused: {text}; append with the settings the dataset was built with, or "
                             f"rebuild with {setting('overwrite')}")


def _shown(value: Any) -> str:
    return "not set" if value is None else json.dumps(value, sort_keys=True)


def _differs(name: str, mine: Any, theirs: Any) -> errors.UsageError:
    return errors.UsageError(f"{setting('append')} refused: {name} {_shown(mine)} differs from the dataset's {_shown(theirs)}; "
                             f"leave it out to take the dataset's, or rebuild with {setting('overwrite')}")


def _check_compatible(config, manifest: Manifest) -> None:
    """Refuses, in one line naming the first difference, a delta whose records would not match the
    dataset's (feature spec, image options, splits, label settings, seed). A setting the caller left
    out is already the dataset's (with_dataset_settings), so what differs here was given."""
    if manifest.version is None:
        raise _one_line(f"{config.output} is a dataset written before versions had folders")
    if manifest.features_only:
        raise _one_line("arrays datasets cannot be appended to yet")
    if config.name != manifest.name:
        raise _differs("name", config.name, manifest.name)
    if config.schema != manifest.schema:
        raise _differs("schema", config.schema, manifest.schema)
    if config.record_format != manifest.record_format:
        raise _differs("record_format", config.record_format, manifest.record_format)
    mine = config.to_json()
    theirs = dict(manifest.parameters, seed=manifest.seed)  # the seed is recorded beside the parameters
    image = _recorded_image(theirs)
    if "png_level" not in mine.get("image", {}):
        image.pop("png_level", None)  # this build writes no PNG: the level shapes no byte of it
    mine_image = dict(mine.get("image") or {})
    if "png_level" in image:
        writer = image.pop("png_writer", codec.LEGACY_PNG_WRITER)  # a level without a writer: Pillow's
        mine_writer = mine_image.pop("png_writer", None)
        if image == mine_image and writer != mine_writer:
            # The same pixels at the same level are other bytes from another writer: never mixed in one dataset.
            raise _one_line(f"the dataset's PNGs were written by {writer!r} (another version), "
                            f"this version writes them with {codec.PNG_WRITER!r}")
    else:
        mine_image.pop("png_writer", None)
    for key in sorted(set(image) | set(mine_image)):  # named one by one: `max_side 256`, not the whole dict
        if mine_image.get(key, _IMAGE_DEFAULTS.get(key)) != image.get(key, _IMAGE_DEFAULTS.get(key)):
            raise _differs(key, mine_image.get(key, _IMAGE_DEFAULTS.get(key)), image.get(key, _IMAGE_DEFAULTS.get(key)))
    for key in _SAME:
        if key != "image" and mine.get(key) != theirs.get(key):
            raise _differs(key, mine.get(key), theirs.get(key))
    declared = {k: {f: v for f, v in spec.items() if f != "names"}
                for k, spec in features_lib.specs_to_json(config.features).items()} if config.features else {}
    published = {k: {f: v for f, v in dict(spec).items() if f != "names"} for k, spec in manifest.features.items()}
    for name in sorted(set(declared) | set(published)):
        if declared.get(name) != published.get(name):
            raise _one_line(f"feature {name!r} is {json.dumps(declared.get(name), sort_keys=True)} here, "
                            f"{json.dumps(published.get(name), sort_keys=True)} in the dataset")


# What a recorded image setting left out of the manifest's parameters was (config.to_json drops the
# defaults of a JPEG build, so that its manifest keeps the bytes it had before those settings).
_IMAGE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(codec.ImageOptions)}


def _recorded_image(parameters: Mapping[str, Any]) -> Dict[str, Any]:
    """The dataset's image settings as its manifest records them; a PNG level written before the
    level was a setting is the level every PNG had then."""
    image = dict(parameters.get("image") or {})
    if image and "png_level" not in image:
        image["png_level"] = codec.LEGACY_PNG_LEVEL
    return image


def _given_by_default(config) -> FrozenSet[str]:
    """The settings of `config` that differ from their defaults: what a caller that says nothing
    else about them must have set."""
    defaults = {k: v for k, v in config_lib.defaults().items() if k != "features"}
    mine = config.flat()
    given = {k for k, v in mine.items() if k in defaults and v != defaults[k]}
    return frozenset(given | ({"features"} if config.features else set()))


def with_dataset_settings(config, given: Optional[Collection[str]] = None):
    """The settings of an append: those in `given` as `config` has them, every other one the
    dataset's in `config.output` (its manifest's parameters; BuildConfig.to_json), so an append
    needs no setting repeated. load_base then refuses a given one that differs (one line naming it).

    Args:
      config: the BuildConfig the caller's settings made (the others at their defaults).
      given: the names of the settings the caller set (BuildConfig's and ImageOptions' fields);
        None: those whose values differ from their defaults.

    Returns:
      The BuildConfig to append with; `config` itself when `config.output` holds no dataset an
      append can take settings from (load_base says why in one line).

    Raises:
      errors.UsageError: the dataset's settings and the given ones make no valid build (one line).
    """
    try:
        manifest = _load(config.output)
    except (OSError, ManifestError):
        return config
    if manifest.version is None or manifest.features_only:
        return config
    given = _given_by_default(config) if given is None else frozenset(given)
    recorded = dict(manifest.parameters)
    fields = set(config_lib.SETTINGS) - set(_IMAGE_DEFAULTS) - {"input", "output"} - set(_NOT_TAKEN)
    theirs: Dict[str, Any] = {k: v for k, v in recorded.items() if k in fields}
    image = _recorded_image(recorded)
    image.pop("png_writer", None)  # not a setting: the writer this version has
    theirs.update({k: image.get(k, default) for k, default in _IMAGE_DEFAULTS.items()})
    # Recorded beside the parameters: the dataset's name, schema, seed and features.
    theirs.update(name=manifest.name, schema=manifest.schema, seed=manifest.seed,
                  features={k: {f: v for f, v in dict(spec).items() if f != "names"}  # class lists grow as an append's
                            for k, spec in manifest.features.items()})
    settings = config.flat()  # one make_config layer: the flat settings, the image's among them
    for key, value in theirs.items():
        if key in given:
            continue
        if value is None:
            settings.pop(key, None)  # recorded unset: the default
        else:
            settings[key] = value
    try:
        return config_lib.make_config(settings)
    except ValueError as e:
        raise errors.UsageError(f"{setting('append')} refused: with the dataset's settings, {e}") from None


def _started_ns(folder: str) -> Optional[int]:
    """When the build of a v-<build id> folder started (its id begins with the UTC time); None for a named one."""
    stamp = folder.rsplit("/", 1)[-1][2:].split("-", 1)[0] if folder.startswith("v-") else ""
    try:
        when = datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%S.%fZ").replace(tzinfo=datetime.timezone.utc)
    except ValueError:
        return None
    return int(when.timestamp()) * 10**9 + when.microsecond * 1000


def _keys_file(output: str, shard) -> Optional[List[Tuple[str, str, int, bytes]]]:
    """The rows of a shard's keys file, or None when it has none (written before keys files), one
    whose sha256 is not the one the manifest records for it (a build that recorded none: whose row
    count is not the shard's); then its records are read instead."""

    path = side_files.keys_path(output, shard.filename)
    data = storage.open_if_exists(path) if path else None
    if data is None:
        return None
    with data:
        content = data.read()
    if not side_files.keys_file_is_the_builds(content, shard):
        log.warning("%s is not the keys file its build wrote (sha256 differs from the manifest's); reading %s "
                    "instead", path, shard.filename)
        return None
    try:
        rows = side_files.parse_keys(content)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
    return rows if len(rows) == shard.count else None


def _scan(output: str, manifest: Manifest) -> Dict[str, Known]:
    """Every key the dataset holds: from each shard's keys file, else read from the shard (the
    records store their key)."""
    keys = schema.keys(manifest.schema)
    wanted = (keys.filename, keys.image, keys.label)

    known: Dict[str, Known] = {}
    offset = manifest.label_offset
    for split in manifest.splits:
        for shard in split.shards:
            build = manifest.shard_build(split.name, shard.index)
            since = _started_ns(f"v-{build}" if build else "") if manifest.shard_builds else \
                _started_ns(shard.filename.rpartition("/")[0])
            rows = _keys_file(output, shard)
            if rows is not None:
                for key, label, size, digest in rows:
                    known[key] = Known(split.name, label, shard.filename, digest, size, since)
                continue
            path = storage.join(output, shard.filename)
            with storage.open_read(path) as f:
                for record in record_format.of(manifest).read(f, path):
                    values = {k: v[0] for k, v in schema.parse_example(record, only=wanted).items() if v}
                    key = values.get(keys.filename, b"").decode("utf-8")
                    label_id = values.get(keys.label)
                    index = label_id - offset if isinstance(label_id, int) else -1
                    name = manifest.label_names[index] if 0 <= index < len(manifest.label_names) else ""
                    known[key] = Known(split.name, name, shard.filename,
                                       content_digest(values.get(keys.image, b"")))
    return known


def near_items(output: str, manifest: Manifest) -> List["near.Item"]:
    """The near-duplicate check's items of the dataset's records (uri: the shard holding each), from
    each shard's keys and hashes files; a shard without both (built with --near_duplicates off,
    before hashes were kept, or whose files are not its build's) adds none, and is not compared."""
    out: List[near.Item] = []
    for split in manifest.splits:
        for shard in split.shards:
            path = side_files.hashes_path(output, shard.filename)
            data = storage.open_if_exists(path) if path else None
            if data is None:
                continue
            with data:
                hashes = near.parse_hashes(data.read(), shard.keys_sha256, shard.count)
            rows = _keys_file(output, shard) if hashes is not None else None
            if rows is None:
                log.warning("%s is not the hashes file of %s; its records are not compared for near-duplicates",
                            path, shard.filename)
                continue
            out.extend((h, digest.hex(), (key, split.name, shard.filename, label), True)
                       for h, (key, label, _, digest) in zip(hashes, rows) if h is not None)
    return out


def _load(output: str, details: bool = False) -> Manifest:
    """`output`'s manifest through the readers' one loader (manifest.load), on the builder's storage."""
    return manifest_lib.load(output, storage.read_bytes, storage.exists, details=details, size=storage.size)


_CACHE: Dict[str, Tuple[Manifest, Base]] = {}


def load_base(config) -> Base:
    """The published dataset in `config.output` (read once per manifest), checked against `config`.

    Raises:
      errors.UsageError: no dataset to append to, or one whose settings differ (one line).
    """
    path = storage.join(config.output, MANIFEST)
    if not storage.exists(path):
        raise errors.UsageError(f"{setting('append')} refused: {config.output} holds no published dataset to append to; "
                                f"build it first (without {setting('append')})")
    try:
        # Its side files too: the merged manifest writes every shard's histogram again.
        manifest = _load(config.output, details=True)
    except ManifestError as e:
        raise errors.OutputError(f"{setting('append')} refused: {e}") from None
    _check_compatible(config, manifest)
    seen, cached = _CACHE.get(config.output, (None, None))
    if cached is None or seen != manifest:
        try:
            cached = Base(manifest, _scan(config.output, manifest))
        except (OSError, ValueError) as e:
            raise errors.OutputError(f"{setting('append')} refused: a shard of {config.output} cannot be read ({e}); "
                                     f"rebuild with {setting('overwrite')}") from None
        _CACHE.clear()
        _CACHE[config.output] = (manifest, cached)
    return cached


def grow_labels(base: LabelMap, seen: Iterable[str], declared: Optional[LabelMap] = None) -> LabelMap:
    """The published ids with the new classes after them: sorted new names (or a declared list that
    starts with the published names), integers up to the largest one seen.

    Raises:
      errors.UsageError: a declared list that does not start with the published names.
    """
    if declared is not None:
        if tuple(declared.names[:len(base.names)]) != tuple(base.names):
            raise _one_line(f"{setting('label_map')} must list the dataset's classes first, in their order, new ones after")
        return dataclasses.replace(declared, offset=base.offset, lists=base.lists)
    seen = set(seen)
    if base.integer:
        top = max((v for v in map(refs_lib.int_label, seen) if v is not None), default=-1)
        names = tuple(base.names) + tuple(str(i) for i in range(len(base.names), top + 1))
        return dataclasses.replace(base, names=names)
    return dataclasses.replace(base, names=tuple(base.names) + tuple(sorted(seen - set(base.names))))


def grow_lists(base: LabelMap, features: Sequence[Any], pairs: Iterable[Tuple[str, str]]) -> LabelMap:
    """The class-list vocabularies grown like the class names: published names first, new ones sorted after."""
    published = dict(base.lists)
    seen: Dict[str, set] = {}
    for feature, name in pairs:
        seen.setdefault(feature, set()).add(name)
    lists = []
    for f in sorted((f for f in features if f.dtype == "class_list"), key=lambda f: f.name):
        old = tuple(published.get(f.name, ()))
        if f.names:
            if tuple(f.names[:len(old)]) != old:
                raise _one_line(f"feature {f.name!r}: the declared class list must start with the dataset's names")
            lists.append((f.name, tuple(f.names)))
        else:
            lists.append((f.name, old + tuple(sorted(seen.get(f.name, set()) - set(old)))))
    return dataclasses.replace(base, lists=tuple(lists))


def against(ref: ImageRef, base: Base, read_bytes, options: codec.ImageOptions,
            splits: Optional[Sequence[Tuple[str, float]]], split_seed: int
            ) -> Union[ImageRef, Rejected, DuplicateGroup]:
    """A listed ref checked against the dataset: the ref when its key is new; a DuplicateGroup
    (a duplicates.jsonl row) when the dataset holds its key with the same content; a Rejected row
    when the file under that key changed: another size than it was listed with, or (a file modified
    since its build, or not local) bytes whose digest differs from the stored one."""
    known = base.keys.get(ref.key)
    if known is None:
        return ref

    split = refs_lib.assign_split(splits, split_seed, ref.key) if splits else (ref.split or "train")
    if known.size >= 0 and ref.size >= 0 and known.size != ref.size:
        return _changed(ref, known, split, f"its size is {ref.size} bytes, {known.size} when it was stored")
    if _untouched_since(ref.uri, known.since_ns):  # the file the build read: no need to read it again
        return _repeated(ref, known, split)
    if download.is_url(ref.uri):  # a URL the dataset holds is not fetched again (by the launcher, at that)
        return _repeated(ref, known, split)
    try:
        data = read_bytes(ref.uri)
    except OSError as e:
        return Rejected(ref.uri, f"key {ref.key!r} is in the dataset ({known.shard}) but its file cannot be read now "
                        f"({type(e).__name__}); a rebuild (--overwrite) would drop it", ref.key, split, stage="read")
    digest = content_digest(data)
    same = digest == known.digest
    if not same:  # a re-encoded record: encode the file again as the build did and compare
        try:
            same = content_digest(codec.prepare_image(data, options).data) == known.digest
        except codec.ImageError:
            same = False
    if same:
        return _repeated(ref, known, split, digest)
    return _changed(ref, known, split, "its bytes differ from the stored record")


# Coarse file-system clocks and a file written in the second its build started: those are read again.
_CLOCK_SLACK_NS = 2 * 10**9


def _untouched_since(uri: str, since_ns: Optional[int]) -> bool:
    """Whether a local file was neither modified nor re-linked (ctime: moved, copied over, touched;
    not settable by users) since `since_ns`."""
    if since_ns is None or not storage.is_local(uri):
        return False

    try:
        st = os.stat(uri)
    except OSError:
        return False
    return max(st.st_mtime_ns, st.st_ctime_ns) < since_ns - _CLOCK_SLACK_NS


def _repeated(ref: ImageRef, known: Known, split: str, digest: Optional[bytes] = None) -> DuplicateGroup:
    # Named by the source file's digest, as a keys file stores it: a shard read instead (no keys
    # file) holds the re-encoded bytes, whose digest would name the same file otherwise.
    return DuplicateGroup((digest or known.digest).hex(), tuple(sorted({
        (ref.key, known.split, known.shard, known.label), (ref.key, split, ref.uri, ref.label or "")})))


def _changed(ref: ImageRef, known: Known, split: str, how: str) -> Rejected:
    return Rejected(ref.uri, f"key {ref.key!r} is in the dataset ({known.shard}) but its file changed since "
                    f"({how}); an append never replaces a record: rebuild with --overwrite to replace it",
                    ref.key, split, stage="list")


def merged_manifest(base: Mapping[str, Any], delta: Manifest, build_id: str) -> Tuple[Manifest, Dict[str, str]]:
    """The manifest of an append, and where each of its files comes from.

    The new version's folder is whole: every shard of the dataset, the base's then the delta's,
    lies in it under the one `<name>-<split>.tfrecord-NNNNN-of-NNNNN` numbering per split, so a
    consumer of the folder or of a glob (TFDS, Model Garden, DALI) reads the whole dataset. The
    commit puts the base's files there as second names of the published ones (no bytes copied
    through the launcher) and moves the delta's staged files there under their new names.

    Args:
      base: the published manifest (JSON) the delta adds to.
      delta: the manifest of this build's own shards, in its version folder.
      build_id: this build's id (recorded for its shards in Manifest.shard_builds).

    Returns:
      (manifest, {file name in the manifest: the file it comes from}), both relative to the
      dataset folder, for every shard and index file (a delta's: its name in this build's staging).
    """
    old = Manifest.from_json(base, "base manifest")

    folder = delta.version
    fmt = record_format.of(delta)
    splits, sources, builds = [], {}, {}
    for name in sorted(set(old.split_names) | set(delta.split_names)):
        before = tuple(old.split(name).shards) if name in old.split_names else ()
        added = tuple(delta.split(name).shards) if name in delta.split_names else ()
        total = len(before) + len(added)
        shards = []
        for i, shard in enumerate(before + added):
            filename = f"{folder}/{fmt.shard_file_name(delta.name, name, i, total)}"
            index_file = index_file_name(filename) if shard.index_file else None
            sources[filename] = shard.filename
            if index_file:
                sources[index_file] = shard.index_file
            shards.append(dataclasses.replace(shard, index=i, filename=filename, index_file=index_file))
        splits.append(Split(name, tuple(shards)))
        runs = list(old.shard_builds.get(name, ())) or _builds_by_folder(before)
        if added:
            runs.append((len(before), build_id))
        builds[name] = tuple(runs)
    features = dict(old.features)
    for name, spec in delta.features.items():
        features[name] = spec
    manifest = dataclasses.replace(
        delta, splits=tuple(splits), parameters=old.parameters, seed=old.seed, features=features,
        image_encoding=old.image_encoding, shard_builds={k: v for k, v in builds.items() if v})
    return manifest, sources


def _builds_by_folder(shards: Sequence[Any]) -> List[Tuple[int, str]]:
    """Runs of (first shard, build id) of shards whose v-<build id> folder names their build (a
    dataset published before appends recorded it); '' for a shard whose build is not known."""
    runs: List[Tuple[int, str]] = []
    for i, shard in enumerate(shards):
        folder = shard.filename.rpartition("/")[0]
        build = folder[len("v-"):] if folder.startswith("v-") else ""
        if not runs or runs[-1][1] != build:
            runs.append((i, build))
    return runs
