"""WriteDataset: a pipeline's own rows become a published dataset, committed by the pipeline itself."""

from __future__ import annotations

import dataclasses
import numbers
import os
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple, Union

import apache_beam as beam
from apache_beam.metrics import Metrics

from imagerecords.format.manifest import MANIFEST
from imagerecords.pipeline import storage
from imagerecords.pipeline.config import BuildConfig
from imagerecords.pipeline.read import politeness
from imagerecords.pipeline.plan import assign as assign_lib
from imagerecords.pipeline import refs as refs_lib
from imagerecords.pipeline.refs import ImageRef, ManifestColumns, Rejected
from imagerecords.pipeline.publish import commit as publish
from imagerecords.pipeline import lock as output_lock
from imagerecords.pipeline.read import download, input_files
from imagerecords.pipeline.sources.manifests import ManifestSource, check_http
from imagerecords.pipeline.write import stream as write_stream
from imagerecords.transforms.common import METRICS_NAMESPACE, REJECTED
from imagerecords.pipeline.publish.build import Build
from imagerecords.transforms.dataset_graph import write_dataset
from imagerecords.transforms.write_shards import options_config

__all__ = ["WriteDataset", "row_to_ref", "BYTES_SCHEME"]

# The uri of a row that carried its image bytes: names the content, never a file.
BYTES_SCHEME = "bytes:"
_CARRIED = "carried"


def _kind(value: Any) -> str:
    return type(value).__name__


def _plain(value: Any) -> Any:
    # NumPy arrays and scalars become the lists and numbers a manifest row would hold.
    return value.tolist() if hasattr(value, "tolist") and not isinstance(value, (str, bytes)) else value


def row_to_ref(row: Any, base: str, columns: ManifestColumns, max_file_bytes: Optional[int] = None,
               stat: bool = True) -> Union[Tuple[ImageRef, Optional[bytes]], Rejected]:
    """One user row as (ImageRef, the image bytes it carried or None), or the Rejected row saying why not.

    The row is checked as a manifest row is (imagerecords.pipeline.refs.parse_manifest_row: label
    and key text, split, declared feature values), plus the types a Python row can get wrong.
    A row with "image" bytes gets the uri `bytes:<32 hex digits of its SHA-256>` and, without a
    "key", that digest as its key; a row with a "path" is keyed by the path as given, as a
    manifest row is.

    Args:
      row: the user's element.
      base: the folder relative paths resolve against.
      columns: the column names (path, label, split, key, size) and the declared features.
      max_file_bytes: an image over this size is a rejected row (stage 'read').
      stat: look up the size of a path row without one (a missing file is rejected here).
    """
    if not isinstance(row, Mapping):
        return Rejected(f"<{_kind(row)}>", f"a row must be a dict with 'image' or {columns.path!r} and "
                                           f"{columns.label!r}, got a {_kind(row)}", stage="list", error="TypeError")
    image, path = row.get("image"), row.get(columns.path)
    known = row.get(columns.key) if isinstance(row.get(columns.key), str) else ""  # for the rows refused early
    data = None
    if image is not None and path is not None:
        return Rejected(str(path), f"a row holds both 'image' and {columns.path!r}; give one", known, stage="list")
    if image is not None:
        if not isinstance(image, (bytes, bytearray, memoryview)):
            return Rejected(f"<{_kind(image)}>", f"'image' must be the encoded image's bytes, got a {_kind(image)}",
                            known, stage="list", error="TypeError")
        data = bytes(image)
        uri = BYTES_SCHEME + write_stream.content_digest(data).hex()
    elif path is not None:
        if not isinstance(path, str):
            return Rejected(f"<{_kind(path)}>", f"{columns.path!r} must be a path or URI string, got a {_kind(path)}",
                            known, stage="list", error="TypeError")
        uri = path
    else:
        return Rejected("<row>", f"a row needs 'image' (bytes) or {columns.path!r} (a path)", known, stage="list")
    key = row.get(columns.key)
    if key is not None and not isinstance(key, str):
        return Rejected(uri, f"{columns.key!r} must be text, got a {_kind(key)}", stage="list", error="TypeError")
    label = row.get(columns.label)
    if isinstance(label, numbers.Integral) and not isinstance(label, bool):
        label = int(label)  # np.int64(3) is the id 3
    if isinstance(label, bool) or not isinstance(label, (str, int, type(None), list, dict)):
        return Rejected(uri, f"label {label!r} is a {_kind(label)}, not a class label: give a class name (str) or "
                             "an integer id", key or "", stage="label", error="TypeError")
    split = row.get(columns.split)
    if split is not None and not isinstance(split, str):
        return Rejected(uri, f"{columns.split!r} must be a split name, got a {_kind(split)}", key or "",
                        stage="list", error="TypeError")
    fields: Dict[str, Any] = {f.source: _plain(row[f.source]) for f in columns.features if f.source in row}
    fields.update({columns.path: uri, columns.label: label, columns.split: split,
                   columns.key: key if key is not None or data is None else uri[len(BYTES_SCHEME):]})
    if data is not None:
        fields[columns.size] = len(data)
    elif row.get(columns.size) is not None:
        fields[columns.size] = row.get(columns.size)
    ref, rejected = refs_lib.parse_manifest_row(fields, base, columns)
    if rejected is not None:
        return rejected
    if data is not None:
        ref = dataclasses.replace(ref, uri=uri)  # parse_manifest_row resolved it as a path
    elif ref.size < 0 and stat and not download.is_url(ref.uri):  # a URL is fetched by its shard's writer alone
        size, problem = assign_lib.looked_up_size(ref)  # the manifest rows' own lookup: a missing file is a row here
        if problem is not None:
            return Rejected(ref.uri, problem[0], ref.key, ref.split, stage="list", error=problem[1])
        ref = dataclasses.replace(ref, size=size)
    too_big = input_files.size_refusal(ref.size, max_file_bytes)
    if too_big is not None:
        if data is not None:  # the bytes came with the row: they were read, but are not decoded
            too_big = too_big.replace("it was not read", "it was not decoded")
        return Rejected(ref.uri, too_big, ref.key, ref.split, stage="read")
    return ref, data


class _CheckRowFn(beam.DoFn):
    def __init__(self, base: str, columns: ManifestColumns, max_file_bytes: Optional[int], stat: bool):
        self._args = (base, columns, max_file_bytes, stat)
        self._listed = Metrics.counter(METRICS_NAMESPACE, "listed")

    def process(self, row: Any) -> Iterable[Union[ImageRef, beam.pvalue.TaggedOutput]]:
        self._listed.inc()
        out = row_to_ref(row, *self._args)
        if isinstance(out, Rejected):
            yield beam.pvalue.TaggedOutput(REJECTED, out)
            return
        ref, data = out
        yield ref
        if data is not None:
            yield beam.pvalue.TaggedOutput(_CARRIED, (ref, data))


def _new_build_id(_) -> str:
    return output_lock.new_build_id()


class WriteDataset(beam.PTransform):
    """Writes a PCollection of the pipeline's own rows as a published imagerecords dataset, with
    the manifest, errors.jsonl, reject budget, duplicate report and atomic, versioned publish of
    a command-line build. The pipeline's last step commits it, so `p.run()` alone (a Dataflow
    template, a detached Flink job) publishes; `imagerecords finish OUTPUT` completes a commit
    that was cut short.

    Input: dicts, one per image:
      "image": the encoded image's bytes (JPEG, PNG, ...), or "path": its file (local path,
        relative to the current folder when WriteDataset is made, or a FileSystems URI);
      "label": a class name (str) or an integer id;
      "key" (optional): the image's unique id, which the shuffle and split hashes use; by default
        the path as given, or for bytes `<32 hex digits of the bytes' SHA-256>`; a repeated key is
        a rejected duplicate row, as in a command-line build;
      "split" (optional): its split name (else 'train', or the `splits` fractions decide);
      one value per declared feature (features=...), under the feature's name or column.
    A row that is not such a dict, or holds a value of the wrong type, is a row of errors.jsonl
    with its reason, counted against max_reject_fraction.
    Output: a single Manifest (imagerecords.format.manifest), the one published.

    Cost: rows that carry bytes move every image byte through the shuffle (the runner holds them:
    all in RAM on DirectRunner; billed per GB on Dataflow); rows with paths move as references
    (~200 bytes each) and each shard's files are read by its one writer.

    Example:
        with beam.Pipeline() as p:
            (p | beam.Create(rows)
               | WriteDataset("/data/flowers", name="flowers", overwrite=True,
                              features={"boxes": {"dtype": "float32", "shape": [None, 4]}}))

    Args:
      output: the dataset folder (local path or FileSystems URI).
      **options: BuildConfig's field names (name, schema, seed, splits, num_shards, min_shards,
        target_shard_mb, features, max_reject_fraction, max_download_failures, overwrite, keep_versions, write_index,
        label_map, label_type, skip_duplicate_check, threads, ...) and ImageOptions' (quality,
        resize, image_encoding, max_file_mb, ...).

    Raises:
      ValueError: naming the bad option or value; or when `output` holds a published dataset and
        overwrite is not set.
    """

    def __init__(self, output: str, **options):
        super().__init__()
        config = options_config("WriteDataset", output, options)
        for setting, bad in (("resume", config.publish.resume), ("writer", config.writer != "shards")):
            if bad:
                raise ValueError(f"WriteDataset: {setting} {config.flat()[setting]!r} is not supported here "
                                 "(the command's build has it)")
        if config.publish.append:  # its commit runs when the job ends, and nothing would check the base is still current then
            raise ValueError("WriteDataset: append is not supported here: the pipeline commits itself whenever it "
                             "runs (a template, a detached job), so the version it would add to could be replaced "
                             "by then; append with `imagerecords build --append` (any runner)")
        try:
            check_http(config.download)  # as a command-line build checks them, before the pipeline runs
        except ValueError as e:
            raise ValueError(f"WriteDataset: {e}") from None
        if not config.publish.overwrite and storage.exists(storage.join(output, MANIFEST)):
            raise ValueError(f"WriteDataset: {output} holds a published dataset; pass overwrite=True to replace it")
        if config.publish.version_name and publish.version_taken(output, config.publish.version_name):
            raise ValueError(f"WriteDataset: version {config.publish.version_name!r} already exists in {output} (versions "
                             "are never rewritten); choose another version_name")
        self._label_map = None
        if config.labels.label_map:
            try:
                self._label_map = refs_lib.read_label_map(storage.read_bytes(config.labels.label_map).decode("utf-8"),
                                                          config.labels.label_map, config.labels.label_offset)
            except (OSError, ValueError) as e:
                raise ValueError(f"WriteDataset: label_map: {e}") from None
        self._config = config
        self._base = os.getcwd()  # relative paths are read where the pipeline was made

    def expand(self, rows):
        config: BuildConfig = self._config
        checked = rows | "CheckRows" >> beam.ParDo(_CheckRowFn(
            self._base, config.manifest_columns(), config.image.max_file_bytes, not config.columns.skip_stat)
        ).with_outputs(REJECTED, _CARRIED, main="refs")
        build_ids = rows.pipeline | "Once" >> beam.Create([None]) | "BuildId" >> beam.Map(_new_build_id)
        # Rows read as a manifest's: paths, FileSystems URIs, and http(s) URLs downloaded by the writers.
        source = politeness.divide(ManifestSource().bind(config), rows.pipeline.options)
        build = Build(config, "", publish.versions(), self._label_map)  # named as the job runs: build_ids
        return write_dataset(rows.pipeline, checked.refs, [checked[REJECTED]], build, source=source,
                             build_ids=build_ids, carried=checked[_CARRIED], commit=True)

