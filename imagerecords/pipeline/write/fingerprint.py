"""The resume fingerprint of a shard: sha256 of everything its bytes depend on. A resumed build
takes a staged shard whose fingerprint is the one it would write (shard_writer.ShardWriter.write)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from importlib import metadata as importlib_metadata
from typing import Any, List, Optional, Sequence, Tuple

from imagerecords import __version__
from imagerecords.pipeline import storage
from imagerecords.pipeline.encode import image_codec as codec
from imagerecords.pipeline.refs import ImageRef, LabelMap


def shard_fingerprint(shard: Tuple[str, int, int], refs: Sequence[ImageRef], *, name: str, preset: str,
                      labels: LabelMap, options: codec.ImageOptions, write_index: bool, contents: bool,
                      features: Sequence[Any] = (), source: str = "", lines: Optional[str] = None,
                      record_format: str = "tfrecord", near: bool = False) -> str:
    """sha256 of everything a shard's bytes depend on: its place, its refs in order (key, path,
    label, size), the size and modification time of every local file a ref reads (its image and
    each image feature's file), the label map, the encoding settings and the code version. A
    remote file counts by its listed size only (a stat per object would cost a request each).
    `lines`: the refs' lines already spelled (row_writer.fingerprint_text of a row shard)."""
    h = hashlib.sha256()
    h.update(json.dumps({"shard": list(shard), "name": name, "preset": preset, "labels": labels.to_json(),
                         "options": dataclasses.asdict(options), "write_index": write_index, "contents": contents,
                         "code": __version__, "pillow": _version("pillow"),
                         "png_writer": [codec.PNG_WRITER, _version("deflate")],
                         **({"features": [f.to_json() | {"name": f.name} for f in features]} if features else {}),
                         **({"source": source} if source else {}),
                         **({"record_format": record_format} if record_format != "tfrecord" else {}),
                         **({"near": True} if near else {})},
                        sort_keys=True, default=str).encode())
    images = [f.name for f in features if f.dtype == "image"]
    # One update of the joined lines hashes the same bytes as one per line, without a call and an encode per ref.
    h.update((lines if lines is not None else "".join([_fingerprint_line(r, images) for r in refs])).encode())
    return h.hexdigest()


def ref_line(key: str, uri: str, label: str, label_id: object, split: str, size: object, tail: str = "") -> str:
    """A ref's line from its values spelled as json.dumps spells them (strings quoted), `tail` the
    stat of its file (", \"size:mtime\"") or "" (an arrays row); row_writer passes %-format slots."""
    return f"[{key}, {uri}, {label}, {label_id}, {split}, {size}{tail}]\n"


def _fingerprint_line(r: ImageRef, images: Sequence[str]) -> str:
    """json.dumps([key, uri, label, label id, split, size, extras if any, each file read's stat]) + newline."""
    if not r.extras and type(r.label) is str:  # the common line, spelled as json.dumps spells it
        text = _ascii_string
        tail = "" if r.row >= 0 else ", " + text(_stat(r.uri))
        return ref_line(text(r.key), text(r.uri), text(r.label), r.label_id, text(r.split), r.size, tail)
    return _json_list([r.key, r.uri, r.label, r.label_id, r.split, r.size, *([r.extras] if r.extras else []),
                       *_read_files(r, images)])


_ascii_string = json.encoder.encode_basestring_ascii


def _json_list(values: Sequence[Any]) -> str:
    """json.dumps(values) + newline, for a list of str and int (a ref's fingerprint line) written
    without the encoder's per-call set-up, which cost more than the line; other values go to json.dumps."""
    parts = []
    for v in values:
        if type(v) is str:
            parts.append(_ascii_string(v))
        elif type(v) is int:
            parts.append(int.__repr__(v))
        else:
            return json.dumps(list(values)) + "\n"
    return "[" + ", ".join(parts) + "]\n"


def _read_files(ref: ImageRef, images: Sequence[str]) -> List[str]:
    """'size:mtime' of each local file `ref` reads (an arrays row's files are in the writer's source)."""
    paths = [] if ref.row >= 0 else [ref.uri]
    if images and ref.extras:
        values = json.loads(ref.extras)
        paths += [values[n] for n in images if isinstance(values.get(n), str)]
    return [_stat(p) for p in paths]


def _stat(path: str) -> str:
    if not storage.is_local(path):
        return ""
    try:
        st = os.stat(path)
    except OSError:  # read (and rejected) at write time; a file that appears later changes this
        return "missing"
    return f"{st.st_size}:{st.st_mtime_ns}"


def look_up_versions() -> None:
    """Reads the versions a fingerprint names now: a process forked later (the local engine's
    workers) then inherits them instead of reading package metadata again (20 ms each)."""
    _version("pillow")
    _version("deflate")


@functools.lru_cache(maxsize=4)
def _version(distribution: str) -> str:
    try:
        return importlib_metadata.version(distribution)
    except importlib_metadata.PackageNotFoundError:
        return ""
