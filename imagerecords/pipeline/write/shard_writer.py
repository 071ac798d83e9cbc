"""ShardWriter: one shard written into the build's staging area (WriteShards in Beam, the local
engine's workers), its StagedShard record, and a resumed build's reuse of an earlier build's
staged shard. Both engines hold the same writer, which keeps their shards byte-identical.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
import uuid
from typing import Any, Callable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from imagerecords.format import side_files

from imagerecords.format import record_format, records
from imagerecords.format.manifest import Shard
from imagerecords.pipeline import staging
from imagerecords.pipeline import phases, storage
from imagerecords.pipeline.encode import image_codec as codec
from imagerecords.pipeline.plan import array_rows
from imagerecords.pipeline.plan import near as near_lib
from imagerecords.pipeline.plan import shard_plan as planning
from imagerecords.pipeline.read import array_files as arrays
from imagerecords.pipeline.refs import ImageRef, LabelMap, Rejected
from imagerecords.pipeline.read import input_files
from imagerecords.pipeline.write import dataset_files, shard_members
from imagerecords.pipeline.write import fingerprint as fingerprint_lib
from imagerecords.pipeline.write.dataset_files import ShardResult

log = logging.getLogger(__name__)

# Writing a shard ----------------------------------------------------------------------------------


class BuildAbandoned(RuntimeError):
    """A shard writer's build lost the output's lock (its launcher died and another build took over)."""



@dataclasses.dataclass
class StagedShard:
    """What ShardWriter.write wrote: the shard, the inputs it turned away, and (with contents) the
    (16-byte source digest, (key, split, uri, label name)) of every record written, for the
    duplicate check, and (with near) the near-duplicate check's near.Item of every record hashed."""

    result: ShardResult
    rejected: List[Rejected]
    contents: List[Tuple[bytes, Tuple[str, str, str, str]]]
    passthrough: int
    near: List[near_lib.Item] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict:
        return {"result": self.result.to_json(), "rejected": [dataclasses.asdict(r) for r in self.rejected],
                "contents": [[d.hex(), list(m)] for d, m in self.contents], "passthrough": self.passthrough,
                **({"near": _near_json(self.near)} if self.near else {})}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "StagedShard":
        return cls(ShardResult.from_json(d["result"]), [Rejected(**r) for r in d["rejected"]],
                   [(bytes.fromhex(h), tuple(m)) for h, m in d["contents"]], int(d["passthrough"]),
                   [(int(h, 16), digest, tuple(m), False) for h, digest, m in d.get("near", ())])


def _near_json(items: Sequence[near_lib.Item]) -> List[list]:
    return [[f"{h:016x}", digest, list(m)] for h, digest, m, _ in items]


# Observes a shard being written: (shard file name, images done, rejected, total). The local engine
# passes one for its progress line and raises KeyboardInterrupt from it to cancel; Beam passes none.
Observer = Callable[[str, int, int, int], None]


@dataclasses.dataclass(frozen=True)
class ShardWriter:
    """Writes one shard into the build's staging area: everything a shard's bytes depend on besides
    its refs and labels, built once from the config (ShardWriter.of) and held by both engines.

    A new per-image or per-shard option is a field here and a line in `of`; the engines pass the
    writer along and never see it.

    Attributes:
      output: the output folder.
      build_id: the build whose staging area it writes into, and whose lock it must still hold.
      name: the dataset name (shard file prefix).
      preset: the Example schema preset.
      options: how images are decoded, resized and encoded.
      write_index: also write each shard's tfrecord2idx index.
      contents: keep each written record's source digest (for the duplicate check).
      near: take each image's perceptual hash where it is decoded, write the shard's hashes file and
        keep the near-duplicate check's items.
      features: the declared features each record also holds (ImageRef.extras has their values).
      resume_from: the earlier builds (ids, newest first) whose staging areas a resumed build takes
        shards from when they staged one with the same fingerprint (moved, not rewritten); listed
        once, when the writer is made, not once per shard.
    """

    output: str
    build_id: str
    name: str
    preset: str
    options: codec.ImageOptions
    write_index: bool = False
    contents: bool = True
    near: bool = False
    resume_from: Tuple[str, ...] = ()
    features: Tuple[Any, ...] = ()  # imagerecords.format.features.Feature
    source: str = ""  # the input's identity beyond its refs (Source.identity), in the resume fingerprint
    input: Any = None  # the sources.Source the refs come from (it reads them); None: files
    record_format: str = record_format.DEFAULT  # the registry's name of the shard files' format

    @classmethod
    def of(cls, config, build_id: str, source=None) -> "ShardWriter":
        """The writer of `config` (a BuildConfig) for build `build_id`, reading its refs with
        `source` (a sources.Source; None: refs that name files)."""
        earlier = tuple(b for b in reversed(staging.staged_builds(config.output)) if b != build_id) if config.publish.resume \
            else ()
        fingerprint_lib.look_up_versions()
        return cls(output=config.output, build_id=build_id, name=config.name, preset=config.schema,
                   options=config.image, write_index=config.publish.write_index, contents=not config.publish.skip_duplicate_check,
                   near=config.publish.near_duplicates == "report" and config.writer == "shards",
                   resume_from=earlier, features=tuple(config.features),
                   source=source.identity(config.input) if source is not None else "", input=source,
                   record_format=config.record_format)

    def reader(self) -> Callable[[str], bytes]:
        """The `read_bytes` of this writer's refs: its source's, one per worker."""
        return self.input.reader(self.options) if self.input is not None else input_files.limited_reader(self.options)

    def write(self, shard: Tuple[str, int, int], refs: Union[Sequence[ImageRef], "array_rows.RowShard"],
              labels: LabelMap, *, read_bytes: Callable[[str], bytes],
              executor: Optional[concurrent.futures.Executor] = None, window: int = 2,
              observe: Optional[Observer] = None) -> "StagedShard":
        """Writes one shard (refs in hash order) to a temporary file in the build's staging area and
        renames it to its shard name when complete, if the build still holds the output's lock (a
        writer that outlived its launcher must not touch what the next build stages); with
        write_index, its tfrecord2idx index too; then its record (fingerprint and result).

        Args:
          shard: (split, shard index, number of shards of the split).
          refs: the refs, or an arrays build's RowShard (the same shard written from its columns,
            row_writer; its StagedShard's contents are then an array_rows.RowContents); both are
            written through shard_members, so everything around the records is spelled here once.
          read_bytes: reads an input (ShardWriter.reader), one per worker.
          executor, window: where images are read and prepared, and how many at once (bounded memory).
          observe: called as images are done; may raise KeyboardInterrupt to stop the write.
        """
        split, index, num_shards = shard
        phases.reached("before_shards")
        members = shard_members.of(refs)
        arrays_path = members.arrays_path() if self.source else None
        if arrays_path is not None:  # arrays rows: this process's cached arrays must be this input's
            arrays.forget_if_changed(arrays_path, self.source)
        fmt = record_format.get(self.record_format)
        filename = planning.shard_name(self.name, split, index, num_shards, fmt.name)
        staged_dir = staging.staging_dir(self.output, self.build_id)
        fingerprint_refs, fingerprint_lines = members.fingerprint()
        fingerprint = fingerprint_lib.shard_fingerprint(shard, fingerprint_refs, name=self.name, preset=self.preset,
                                                        labels=labels, options=self.options,
                                                        write_index=self.write_index, contents=self.contents,
                                                        features=self.features, source=self.source,
                                                        lines=fingerprint_lines, record_format=fmt.name, near=self.near)
        if self.resume_from:
            reused = _reuse_staged(self.output, self.build_id, self.resume_from, filename, fingerprint)
            if reused is not None:
                if observe:
                    observe(filename, len(members), len(reused.rejected), len(members))
                return reused
        # A unique temporary name per attempt: a retried or speculative bundle never writes into
        # another attempt's file, and the last rename wins with identical bytes.
        tmp = storage.join(staged_dir, f".{filename}.{uuid.uuid4().hex}.tmp")
        to_write = members.to_write()
        duplicates = members.duplicates

        def on_progress(done: int, rejected: int) -> None:
            if observe:
                observe(filename, done + len(duplicates), rejected + len(duplicates), len(members))
            if done == to_write // 2:
                phases.reached("mid_shard", filename=filename)

        try:
            with _records_file(fmt, tmp) as file_writer:
                stats, rejected = members.write(file_writer, read_bytes=read_bytes, preset=self.preset, labels=labels,
                                                options=self.options, features=self.features, executor=executor,
                                                window=window, on_progress=on_progress, perceptual=self.near)
            phases.reached("before_rename", filename=filename)
            if not staging.owns_output(self.output, self.build_id):
                raise BuildAbandoned(f"build {self.build_id} no longer holds the lock of {self.output}: {filename} "
                                     "was not staged")
            storage.rename(tmp, storage.join(staged_dir, filename))
        except BaseException:
            if storage.exists(tmp):
                storage.delete(tmp)
            raise
        if observe:
            observe(filename, len(members), len(duplicates) + len(rejected), len(members))
        phases.reached("shard_staged", filename=filename, records=stats.count)
        index_file = index_sha256 = index_crc32c = None
        if self.write_index:
            # The format's index file (TFRecord's: tfrecord2idx), in the index folder no shard glob reaches.
            index_file = dataset_files.index_name(filename)
            index_data = fmt.index_bytes(stats.offsets, stats.num_bytes)
            index_sha256 = hashlib.sha256(index_data).hexdigest()
            index_crc32c = records.crc32c_of(index_data)
            storage.write_bytes(storage.join(staged_dir, index_file), index_data)
        result = ShardResult(split, Shard(index, filename, stats.count, stats.num_bytes, stats.sha256, stats.labels,
                                          stats.passthrough, index_file, index_sha256, stats.kinds,
                                          ends_crc=stats.ends_crc),
                             stats.crc32c, index_crc32c, storage.checked_identity(storage.join(staged_dir, filename),
                                                                                  stats.crc32c),
                             storage.checked_identity(storage.join(staged_dir, index_file), index_crc32c)
                             if index_file else None)
        keys, written, passthrough, spelled = members.staged(labels, self.contents)
        hashes, items = members.hashes(labels)
        out = StagedShard(result, duplicates + rejected, written, passthrough, items)
        storage.write_bytes(storage.join(staged_dir, side_files.keys_name(filename)), keys)
        # Its digest goes to the manifest with the shard: --append trusts no other keys file.
        out.result = dataclasses.replace(out.result, shard=dataclasses.replace(
            out.result.shard, keys_sha256=side_files.keys_digest(keys)))
        if hashes:  # bound to the keys file by its digest, which the manifest records
            storage.write_bytes(storage.join(staged_dir, side_files.hashes_name(filename)),
                                near_lib.hashes_text(hashes, out.result.shard.keys_sha256))
        storage.write_bytes(storage.join(staged_dir, filename + staging.STAGED_RECORD), _staged_record_bytes(
            fingerprint, out, spelled))
        phases.reached("mid_shards")
        return out




@contextlib.contextmanager
def _records_file(fmt: record_format.RecordFormat, path: str) -> Iterator[record_format.RecordWriter]:
    """The format's writer of the file at `path` (local or remote), closed on the way out; a format
    that writes local paths only writes a remote file through a local one, then copies it."""
    if fmt.writes_streams:
        with storage.create(path) as stream:
            writer = fmt.writer(stream)
            yield writer
            writer.close()
        return
    if storage.is_local(path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)  # as storage.create makes a stream's folder
        writer = fmt.writer(path)
        try:
            yield writer
        finally:
            writer.close()
        return
    with tempfile.TemporaryDirectory() as folder:
        local = os.path.join(folder, "records")
        writer = fmt.writer(local)
        try:
            yield writer
        finally:
            writer.close()
        with open(local, "rb") as f, storage.create(path) as stream:
            shutil.copyfileobj(f, stream, 1 << 20)


def _record_bytes(record: Mapping[str, Any]) -> bytes:
    """A staged shard's record as JSON, compact: json's C encoder (indent takes its pure-Python one,
    which cost a third of an arrays shard's writing in the row-per-record `contents`)."""
    return (json.dumps(record, sort_keys=True, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def _staged_record_bytes(fingerprint: str, staged: StagedShard, contents: Optional[str] = None) -> bytes:
    """_record_bytes({"fingerprint": fingerprint, "staged": staged.to_json()}), its contents spelled
    row by row as the encoder spells them: a list and a hex string per record cost twice the line.
    A row shard's writer passes its `contents` already spelled (row_writer.written_lines)."""
    text = _utf8_string
    if contents is None:
        try:
            contents = ",".join([dataset_files.contents_entry(d.hex(), text(k), text(s), text(u), text(n))
                                 for d, (k, s, u, n) in staged.contents])
        except (AttributeError, TypeError, ValueError):  # not (bytes, four strings): the encoder spells it
            return _record_bytes({"fingerprint": fingerprint, "staged": staged.to_json()})
    rest = _record_bytes({**({"near": _near_json(staged.near)} if staged.near else {}),
                          "passthrough": staged.passthrough, "rejected": [dataclasses.asdict(r) for r in staged.rejected],
                          "result": staged.result.to_json()})
    # Sorted keys: "contents" comes before "passthrough", "rejected" and "result".
    head = _record_bytes({"fingerprint": fingerprint})
    return head[:-2] + b',"staged":{"contents":[' + contents.encode("utf-8") + b"]," + rest[1:-1] + b"}\n"


_utf8_string = json.encoder.encode_basestring  # what json.dumps(ensure_ascii=False) writes for a str


def _reuse_staged(output: str, build_id: str, earlier: Sequence[str], filename: str, fingerprint: str
                  ) -> Optional["StagedShard"]:
    """Moves `filename` (and its index and record) from the staging area of one of the `earlier`
    builds into this build's when it staged it with the same fingerprint; returns what it recorded."""
    for other in earlier:
        source = staging.staging_dir(output, other)
        record_path = storage.join(source, filename + staging.STAGED_RECORD)
        if not storage.exists(record_path):  # asked first: a missing object's read fails late on gs://
            continue
        try:
            record = json.loads(storage.read_bytes(record_path))
            if record.get("fingerprint") != fingerprint:
                continue
            # Shard.from_json refuses names that climb out of staging; a record naming another
            # shard than the one it sits beside is not this shard's either.
            staged = StagedShard.from_json(record["staged"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # rewritten, not reused: "resumed: N of M shards reused" shows it
        if staged.result.shard.filename != filename or staged.result.shard.index_file not in (
                None, dataset_files.index_name(filename)):
            continue
        moves = [staged.result.shard.filename] + ([staged.result.shard.index_file] if staged.result.shard.index_file
                                                  else [])
        if not all(storage.exists(storage.join(source, n)) for n in moves):
            continue
        damage = _staged_damage(source, staged.result)
        if damage:  # truncated or changed since it was staged: written again, never carried to the commit
            log.warning("not reusing %s: %s; writing it again", storage.join(source, filename), damage)
            continue
        target = staging.staging_dir(output, build_id)
        for side in side_files.side_names(filename):
            if storage.exists(storage.join(source, side)):  # without a keys file, --append reads the shard instead
                moves.append(side)
        checked = {staged.result.shard.filename: staged.result.identity,
                   staged.result.shard.index_file: staged.result.index_identity}
        for n in moves + [filename + staging.STAGED_RECORD]:
            destination = storage.join(target, n)
            if storage.is_local(destination):
                os.makedirs(os.path.dirname(destination), exist_ok=True)
            storage.rename(storage.join(source, n), destination)
        # Moved, the files have new change times: recorded when nothing else changed, so the commit
        # need not read them back either.
        staged.result = dataclasses.replace(
            staged.result,
            identity=storage.moved_identity(checked[staged.result.shard.filename],
                                            storage.join(target, staged.result.shard.filename)),
            index_identity=storage.moved_identity(checked[staged.result.shard.index_file],
                                                  storage.join(target, staged.result.shard.index_file))
            if staged.result.shard.index_file else None)
        record["staged"]["result"] = staged.result.to_json()
        storage.write_bytes(storage.join(target, filename + staging.STAGED_RECORD), _record_bytes(
            {"fingerprint": fingerprint, "staged": record["staged"], "reused": True}))
        return staged
    return None


def _staged_damage(folder: str, result: ShardResult) -> Optional[str]:
    """Why a staged shard (or its index) differs from what its writer recorded, or None; a local file
    whose identity is the one its writer recorded (storage.identity) is not read back."""
    shard = result.shard
    expected = [(shard.filename, shard.num_bytes, shard.sha256, result.identity)]
    if shard.index_file and shard.index_sha256:
        expected.append((shard.index_file, -1, shard.index_sha256, result.index_identity))
    for name, num_bytes, sha256, seen in expected:
        if seen is not None and seen == storage.identity(storage.join(folder, name)):
            continue
        try:
            got_sha, got_size = staging.sha256_and_size(storage.join(folder, name))
        except OSError as e:
            return f"{name} cannot be read ({storage.os_reason(e)})"
        if (num_bytes >= 0 and got_size != num_bytes) or got_sha != sha256:
            return f"{name} is {got_size} bytes with sha256 {got_sha[:12]}..., its writer recorded " \
                   f"{num_bytes if num_bytes >= 0 else '?'} bytes with sha256 {sha256[:12]}..."
    return None
