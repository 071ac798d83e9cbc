"""`imagerecords report`: one self-contained HTML page showing what a published dataset holds."""

from __future__ import annotations

import argparse
import base64
import collections
import dataclasses
import html
import io
import json
import math
import os
import re
from typing import Any, BinaryIO, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from imagerecords import errors, records, schema
from imagerecords.manifest import ERRORS, Manifest, Split
from imagerecords.refs import has_scheme
from imagerecords.storage import exists, join, open_read

# Written by the builder's duplicate detection when it found any; a build without the check (or
# without duplicates) has no such file.
DUPLICATES = "duplicates.jsonl"
THUMB_SIDE = 96  # px, the longer side of a contact-sheet thumbnail
DEFAULT_PER_CLASS = 8
DEFAULT_MAX_CLASSES = 100
DEFAULT_SAMPLE = 1000
_EXAMPLES_PER_REASON = 3
_DUPLICATE_GROUPS_SHOWN = 50
_SHARD_BARS_MAX = 64  # above this many shards a split's shard sizes are shown as a histogram


# Sampling the shards ------------------------------------------------------------------------------


@dataclasses.dataclass
class Thumb:
    """One contact-sheet image: a record's image made small.

    Attributes:
      label: stored label id.
      filename: the record's filename feature.
      shard: shard file it came from.
      height: the stored image's height in px.
      width: the stored image's width in px.
      data_uri: the thumbnail as a data: URI, or None when the image did not decode.
      size: (width, height) of the thumbnail.
      error: why the image did not decode.
    """

    label: int
    filename: str
    shard: str
    height: int
    width: int
    data_uri: Optional[str] = None
    size: Tuple[int, int] = (0, 0)
    error: Optional[str] = None


@dataclasses.dataclass
class Sample:
    """What was read from one split's shards.

    Attributes:
      split: the split read.
      thumbs: {label id: thumbnails in shard order}.
      sizes: (height, width) of the first `limit` records in shard order.
      image_bytes: image byte sizes of the same records.
      limit: the sample size asked for.
      records_read: records read in all.
      shards_read: names of the shards opened, in order.
      problems: shards that could not be read to the end, with why.
    """

    split: str
    thumbs: Dict[int, List[Thumb]]
    sizes: List[Tuple[int, int]]
    image_bytes: List[int]
    limit: int
    records_read: int = 0
    shards_read: List[str] = dataclasses.field(default_factory=list)
    problems: List[str] = dataclasses.field(default_factory=list)


def _open(path: str) -> Optional[BinaryIO]:
    """Opens a local or remote file for reading; None when it does not exist."""
    if not has_scheme(path):
        try:
            return open(path, "rb")
        except FileNotFoundError:
            return None
    # Remote folders (gs://, s3://) need Beam's file systems, i.e. the builder extra.
    return open_read(path) if exists(path) else None


def thumbnail(image: bytes, side: int = THUMB_SIDE) -> Tuple[str, Tuple[int, int]]:
    """Returns (JPEG data URI, (width, height)) of `image` shrunk to fit `side` x `side`.

    Raises:
      OSError, ValueError: if Pillow cannot decode the image.
    """
    from PIL import Image

    with Image.open(io.BytesIO(image)) as img:
        img.draft("RGB", (side, side))  # JPEG: decode at a reduced DCT scale, much faster for big images
        img = img.convert("RGB")
        img.thumbnail((side, side), Image.Resampling.LANCZOS)  # keeps the aspect ratio, never enlarges
        out = io.BytesIO()
        img.save(out, format="JPEG", quality=85)
        size = img.size
    return "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode("ascii"), size


def sample_split(output: str, manifest: Manifest, split: Split, classes: Sequence[int], per_class: int,
                 limit: int) -> Sample:
    """Reads `split`'s shards in order until each of `classes` has `per_class` thumbnails (or the
    split has no more of it) and the first `limit` records were seen, and stops there.

    Shards whose manifest histogram holds no class still short of thumbnails are skipped once the
    size sample is complete, so rare classes do not cost a read of every shard.
    """
    keys = schema.keys(manifest.schema)
    in_split: Dict[int, int] = collections.Counter()
    for shard in split.shards:
        for label, n in shard.labels:
            in_split[label] += n
    want = {c: min(per_class, in_split.get(c, 0)) for c in classes}
    want = {c: n for c, n in want.items() if n > 0}
    sample = Sample(split.name, {c: [] for c in classes}, [], [], limit)

    def short() -> set:
        return {c for c, n in want.items() if len(sample.thumbs[c]) < n}

    for shard in split.shards:
        missing = short()
        if not missing and len(sample.sizes) >= limit:
            break
        if len(sample.sizes) >= limit and not missing.intersection(label for label, _ in shard.labels):
            continue
        path = join(output, shard.filename)
        stream = _open(path)
        if stream is None:
            sample.problems.append(f"{shard.filename}: missing")
            continue
        sample.shards_read.append(shard.filename)
        try:
            with stream:
                for raw in records.read_records(stream, shard.filename):
                    sample.records_read += 1
                    _take(sample, schema.parse_example(raw), keys, shard.filename, want)
                    if len(sample.sizes) >= limit and not short():
                        break
        except records.CorruptRecordError as e:
            sample.problems.append(f"{e} (run `imagerecords verify --records`)")
    return sample


def _take(sample: Sample, example: Mapping[str, List[Any]], keys: schema.SchemaKeys, shard: str,
          want: Mapping[int, int]) -> None:
    image = (example.get(keys.image) or [b""])[0]
    height = (example.get(keys.height) or [0])[0]
    width = (example.get(keys.width) or [0])[0]
    if len(sample.sizes) < sample.limit:
        sample.sizes.append((height, width))
        sample.image_bytes.append(len(image))
    label = (example.get(keys.label) or [None])[0]
    if label not in want or len(sample.thumbs[label]) >= want[label]:
        return
    filename = (example.get(keys.filename) or [b""])[0].decode("utf-8", errors="replace")
    thumb = Thumb(label, filename, shard, height, width)
    try:
        thumb.data_uri, thumb.size = thumbnail(image)
    except (OSError, ValueError) as e:  # Pillow's UnidentifiedImageError is an OSError
        thumb.error = f"{type(e).__name__}: {e}"
    sample.thumbs[label].append(thumb)


# errors.jsonl and duplicates.jsonl ----------------------------------------------------------------


@dataclasses.dataclass
class ReasonGroup:
    """Rejected (or skipped) rows that share a stage and a reason.

    Attributes:
      stage: pipeline stage that rejected them.
      reason: the reason, with quoted names replaced by '…' so rows differing only in a key group.
      count: rows in the group.
      examples: up to a few (key, split, full reason) of them, in file order.
    """

    stage: str
    reason: str
    count: int = 0
    examples: List[Tuple[str, str, str]] = dataclasses.field(default_factory=list)


_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


def _json_objects(stream: BinaryIO) -> Iterator[Optional[dict]]:
    """Yields each non-blank line of a JSONL stream as a dict, or None where it is not a JSON object."""
    for line in stream:
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            yield None
            continue
        yield row if isinstance(row, dict) else None


def read_errors(stream: BinaryIO) -> Tuple[List[ReasonGroup], List[ReasonGroup], int]:
    """Groups errors.jsonl rows by stage and reason, streaming (the file can have millions of rows).

    Returns:
      (rejected groups, skipped groups, lines that were not JSON objects); groups by count, largest first.
    """
    groups: Dict[Tuple[bool, str, str], ReasonGroup] = {}
    bad = 0
    for row in _json_objects(stream):
        if row is None:
            bad += 1
            continue
        reason = str(row.get("reason", ""))
        key = (bool(row.get("skipped")), str(row.get("stage", "")), _QUOTED.sub("'…'", reason))
        group = groups.setdefault(key, ReasonGroup(key[1], key[2]))
        group.count += 1
        if len(group.examples) < _EXAMPLES_PER_REASON:
            group.examples.append((str(row.get("key") or row.get("uri", "")), str(row.get("split", "")), reason))
    order = sorted(groups.items(), key=lambda kv: (-kv[1].count, kv[0]))
    return [g for k, g in order if not k[0]], [g for k, g in order if k[0]], bad


def read_duplicates(stream: BinaryIO) -> Tuple[List[dict], int]:
    """Returns (rows of duplicates.jsonl, lines that were not such rows); each row is
    {content, members: [{key, split, uri, label}], ...} (no member label before label conflicts
    were counted)."""
    rows, bad = [], 0
    for row in _json_objects(stream):
        if row is None or not isinstance(row.get("members"), list):
            bad += 1
            continue
        rows.append(row)
    return rows, bad


# HTML ---------------------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd}h3{font-size:15px;margin:16px 0 4px}
table{border-collapse:collapse;margin:6px 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
.src{color:#666;font-size:12px;margin:2px 0 8px}.warn{color:#a40}
.sheet{display:flex;flex-wrap:wrap;gap:6px}.sheet figure{margin:0;width:100px;text-align:center}
.sheet img{image-rendering:auto;border:1px solid #ccc;background:#eee}
.sheet figcaption{font-size:10px;color:#555;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
svg text{font:11px system-ui,sans-serif}.bar{fill:#4a7bd0}.zero{fill:#c33}.leak{background:#fde}
code{font-size:12px}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def bars_svg(rows: Sequence[Tuple[str, int, Mapping[str, Any]]], value_text=str, label_width: int = 180) -> str:
    """A horizontal bar chart as inline SVG: one row per (label, value, data attributes).

    Each row is a <g> carrying its data attributes and data-value, with the value as its <text>,
    so the numbers can be read back from the page.
    """
    row_h, bar_w, text_w = 16, 420, 110
    top = max((v for _, v, _ in rows), default=0) or 1
    parts = [f'<svg width="{label_width + bar_w + text_w}" height="{row_h * len(rows) + 4}" role="img">']
    for i, (label, value, attrs) in enumerate(rows):
        y = i * row_h + 2
        w = 0 if value <= 0 else max(1, round(bar_w * value / top))
        extra = "".join(f' data-{k}="{_e(v)}"' for k, v in attrs.items())
        parts.append(
            f'<g data-value="{value}"{extra}><title>{_e(label)}: {_e(value_text(value))}</title>'
            f'<text x="{label_width - 6}" y="{y + 11}" text-anchor="end">{_e(label[:40])}</text>'
            f'<rect class="{"bar" if value > 0 else "zero"}" x="{label_width}" y="{y}" width="{w if value > 0 else 2}" '
            f'height="{row_h - 4}"/>'
            f'<text class="value" x="{label_width + w + 6}" y="{y + 11}">{_e(value_text(value))}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


def histogram(values: Sequence[int], max_bins: int = 20) -> List[Tuple[int, int, int]]:
    """Returns equal-width integer bins (low, high, count) covering min..max of `values` (none if empty)."""
    if not values:
        return []
    low, high = min(values), max(values)
    width = max(1, math.ceil((high - low + 1) / max_bins))
    counts = collections.Counter((v - low) // width for v in values)
    return [(low + i * width, low + (i + 1) * width - 1, counts.get(i, 0))
            for i in range((high - low) // width + 1)]


def _histogram_svg(name: str, values: Sequence[int], fmt=str) -> str:
    rows = [(fmt(lo) if lo == hi else f"{fmt(lo)} – {fmt(hi)}", n, {"hist": name, "low": lo, "high": hi})
            for lo, hi, n in histogram(values)]
    return bars_svg(rows) if rows else "<p>(no records read)</p>"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], numeric: Sequence[int] = (), attrs: str = "") -> str:
    head = "".join(f'<th{" class=n" if i in numeric else ""}>{_e(h)}</th>' for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f'<td{" class=n" if i in numeric else ""}>{c}</td>' for i, c in enumerate(row))
                   + "</tr>" for row in rows)
    return f"<table{attrs}><tr>{head}</tr>{body}</table>"


def _flatten(d: Mapping[str, Any], prefix: str = "") -> List[Tuple[str, Any]]:
    out = []
    for k in sorted(d):
        v = d[k]
        if isinstance(v, Mapping) and v:
            out.extend(_flatten(v, f"{prefix}{k}."))
        else:
            out.append((f"{prefix}{k}", v))
    return out


def _label_name(manifest: Manifest, label: int) -> str:
    i = label - manifest.label_offset
    return manifest.label_names[i] if 0 <= i < len(manifest.label_names) else f"#{label}"


def _label_ids(manifest: Manifest) -> List[int]:
    """Every label id of the dataset: the named ones and any a shard holds beyond them."""
    ids = {i + manifest.label_offset for i in range(len(manifest.label_names))}
    ids.update(label for split in manifest.splits for shard in split.shards for label, _ in shard.labels)
    return sorted(ids)


@dataclasses.dataclass
class Extras:
    """The optional files next to the manifest.

    Attributes:
      rejected: groups of rejected rows; None when errors.jsonl is absent.
      skipped: groups of skipped rows.
      bad_error_lines: errors.jsonl lines that were not JSON objects.
      duplicates: duplicates.jsonl rows; None when the file is absent.
      bad_duplicate_lines: duplicates.jsonl lines that were not rows.
    """

    rejected: Optional[List[ReasonGroup]] = None
    skipped: List[ReasonGroup] = dataclasses.field(default_factory=list)
    bad_error_lines: int = 0
    duplicates: Optional[List[dict]] = None
    bad_duplicate_lines: int = 0


def render(output: str, manifest: Manifest, sample: Optional[Sample], classes: Sequence[int], extras: Extras,
           per_class: int) -> str:
    """Returns the report page for `manifest` (no clock or random input: equal inputs, equal bytes)."""
    m = manifest
    s: List[str] = [f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
                    f"<title>{_e(m.name)} — imagerecords report</title><style>{_CSS}</style></head><body>"]
    s.append(f"<h1>{_e(m.name)}</h1><p>Dataset folder <code>{_e(output)}</code>, built {_e(m.created or '?')}, "
             f"schema <code>{_e(m.schema)}</code>, {len(m.label_names)} classes, {m.num_examples} records.</p>")
    s.append('<p>Contents: <a href="#splits">splits</a> · <a href="#sheet">contact sheet</a> · '
             '<a href="#labels">labels per split</a> · <a href="#sizes">image sizes</a> · '
             '<a href="#shards">shard sizes</a> · <a href="#rejected">rejected</a> · '
             '<a href="#duplicates">duplicates</a> · <a href="#conflicts">label conflicts</a> · '
             '<a href="#build">build</a></p>')

    # Splits --------------------------------------------------------------------------------------
    s.append('<h2 id="splits">Splits</h2><p class=src>From manifest.json.</p>')
    rows = [[_e(sp.name), sp.num_examples, len(sp.shards), _e(_human(sp.num_bytes))] for sp in m.splits]
    rows.append(["<b>all</b>", m.num_examples, sum(len(sp.shards) for sp in m.splits),
                 _e(_human(sum(sp.num_bytes for sp in m.splits)))])
    s.append(_table(["split", "records", "shards", "bytes"], rows, numeric=(1, 2, 3), attrs=' id="split-table"'))
    s.append(f'<p>Rejected inputs: <b data-total="rejected">{m.num_rejected}</b>; skipped (not images of a class): '
             f'<b data-total="skipped">{m.num_skipped}</b> (manifest.json; reasons under '
             f'<a href="#rejected">Rejected</a>).</p>')

    # Contact sheet -------------------------------------------------------------------------------
    s.append('<h2 id="sheet">Contact sheet</h2>')
    if sample is None:
        s.append("<p>The dataset has no records.</p>")
    else:
        split = m.split(sample.split)
        total_shards = len(split.shards)
        s.append(f'<p class=src data-shards-read="{len(sample.shards_read)}" data-shards-total="{total_shards}" '
                 f'data-records-read="{sample.records_read}">Decoded from the records of split '
                 f'<b>{_e(sample.split)}</b>: the first {per_class} records of each class in shard order '
                 f'(the build\'s shuffled order), thumbnails at most {THUMB_SIDE} px. Read '
                 f'{sample.records_read} records from {len(sample.shards_read)} of {total_shards} shards.</p>')
        for problem in sample.problems:
            s.append(f'<p class=warn>{_e(problem)}</p>')
        all_ids = _label_ids(m)
        if len(classes) < len(all_ids):
            s.append(f"<p class=warn>Showing {len(classes)} of {len(all_ids)} classes (the lowest label ids; "
                     "--max_classes shows more).</p>")
        in_split = collections.Counter()
        for shard in split.shards:
            for label, n in shard.labels:
                in_split[label] += n
        if not per_class:
            s.append("<p>--per_class 0: no thumbnails.</p>")
        for label in classes if per_class else ():
            thumbs = sample.thumbs.get(label, [])
            s.append(f'<section class=class data-class="{_e(_label_name(m, label))}" data-label="{label}">'
                     f'<h3>{label} · {_e(_label_name(m, label))} <small>({in_split.get(label, 0)} in '
                     f'{_e(sample.split)})</small></h3><div class=sheet>')
            if not thumbs:
                s.append(f"<p>No records of this class in {_e(sample.split)}.</p>")
            for t in thumbs:
                tip = f"{t.filename} · {t.height}×{t.width} px (h×w) · {t.shard}"
                if t.data_uri:
                    s.append(f'<figure><img src="{t.data_uri}" width="{t.size[0]}" height="{t.size[1]}" '
                             f'alt="{_e(t.filename)}" title="{_e(tip)}" data-class="{_e(_label_name(m, label))}" '
                             f'data-height="{t.height}" data-width="{t.width}">'
                             f'<figcaption>{_e(os.path.basename(t.filename))}</figcaption></figure>')
                else:
                    s.append(f'<figure class=warn title="{_e(tip)}">cannot decode: {_e(t.error)}'
                             f'<figcaption>{_e(os.path.basename(t.filename))}</figcaption></figure>')
            s.append("</div></section>")

    # Labels per split ------------------------------------------------------------------------------
    s.append('<h2 id="labels">Labels per split</h2><p class=src>From manifest.json (the sum of each shard\'s '
             'label histogram). Red: a class with no record in the split.</p>')
    for sp in m.splits:
        counts = collections.Counter()
        for shard in sp.shards:
            for label, n in shard.labels:
                counts[label] += n
        s.append(f"<h3>{_e(sp.name)} ({sp.num_examples} records)</h3>")
        s.append(bars_svg([(f"{label} {_label_name(m, label)}", counts.get(label, 0),
                            {"split": sp.name, "label": label}) for label in _label_ids(m)]))

    # Image sizes -----------------------------------------------------------------------------------
    s.append('<h2 id="sizes">Image sizes</h2>')
    if sample is None or not sample.sizes:
        s.append("<p>No records read.</p>")
    else:
        n = len(sample.sizes)
        scope = "the whole split" if n == m.split(sample.split).num_examples else "a sample; --sample sets its size"
        s.append(f'<p class=src data-sample="{n}">From the records read: the first {n} records of split '
                 f'<b>{_e(sample.split)}</b> in shard order ({scope}), '
                 'the height and width features and the length of the stored JPEG bytes.</p>')
        common = collections.Counter(sample.sizes).most_common(10)
        s.append("<h3>Most common sizes (height × width)</h3>")
        s.append(_table(["height × width", "records"], [[f"{h} × {w}", c] for (h, w), c in common], numeric=(1,),
                        attrs=" id=common-sizes"))
        s.append("<h3>Height (px)</h3>" + _histogram_svg("height", [h for h, _ in sample.sizes]))
        s.append("<h3>Width (px)</h3>" + _histogram_svg("width", [w for _, w in sample.sizes]))
        s.append("<h3>Stored image bytes</h3>" + _histogram_svg("bytes", sample.image_bytes, _human))

    # Shards ----------------------------------------------------------------------------------------
    s.append('<h2 id="shards">Shard sizes</h2><p class=src>From manifest.json (file bytes, records).</p>')
    for sp in m.splits:
        sizes = [sh.num_bytes for sh in sp.shards]
        if not sizes:
            continue
        s.append(f"<h3>{_e(sp.name)}: {len(sizes)} shards, {_human(min(sizes))} – {_human(max(sizes))}</h3>")
        if len(sizes) <= _SHARD_BARS_MAX:
            s.append(bars_svg([(f"{sh.index:05d} ({sh.count} rec)", sh.num_bytes,
                                {"split": sp.name, "shard": sh.index, "count": sh.count}) for sh in sp.shards],
                              value_text=_human))
        else:
            s.append(_histogram_svg(f"shards-{sp.name}", sizes, _human))

    # Rejected --------------------------------------------------------------------------------------
    s.append(f'<h2 id="rejected">Rejected inputs</h2><p class=src>From {_e(m.errors_file)}, grouped by stage and '
             'reason (quoted names in a reason are shown as \'…\' so they group).</p>')
    if extras.rejected is None:
        s.append(f"<p class=warn>{_e(m.errors_file)} is missing.</p>")
    else:
        for title, groups, kind in (("Rejected", extras.rejected, "rejected"), ("Skipped", extras.skipped, "skipped")):
            total = sum(g.count for g in groups)
            s.append(f"<h3>{title}: {total}</h3>")
            counted = m.num_rejected if kind == "rejected" else m.num_skipped
            if total != counted:
                s.append(f"<p class=warn>manifest.json counts {counted} {kind}; "
                         f"{_e(m.errors_file)} has {total} rows.</p>")
            if groups:
                s.append(_table(["stage", "reason", "count", "examples (key · split · reason)"], [
                    [_e(g.stage), _e(g.reason), g.count,
                     "<br>".join(f"<code>{_e(k)}</code> · {_e(sp or '-')} · {_e(r)}" for k, sp, r in g.examples)]
                    for g in groups], numeric=(2,), attrs=f' class=reasons data-kind="{kind}"'))
        if extras.bad_error_lines:
            s.append(f"<p class=warn>{extras.bad_error_lines} lines of {_e(m.errors_file)} are not JSON rows.</p>")

    # Duplicates and label conflicts ----------------------------------------------------------------
    s.extend(_duplicates_section(extras))
    s.extend(_conflicts_section(m, extras))

    # Build -----------------------------------------------------------------------------------------
    s.append('<h2 id="build">Build</h2><p class=src>From manifest.json.</p>')
    top = [("name", m.name), ("schema", m.schema), ("seed", m.seed), ("label_offset", m.label_offset),
           ("integer_labels", m.integer_labels), ("created", m.created)]
    s.append(_table(["setting", "value"], [[_e(k), f"<code>{_e(json.dumps(v))}</code>"]
                                           for k, v in top + _flatten(m.parameters)], attrs=" id=parameters"))
    s.append("<h3>Versions</h3>")
    s.append(_table(["package", "version"], [[_e(k), _e(v)] for k, v in sorted(m.versions.items())],
                    attrs=" id=versions"))
    s.append("</body></html>\n")
    return "".join(s)


def _members(row: Mapping[str, Any]) -> List[Mapping[str, Any]]:
    return [mb for mb in row["members"] if isinstance(mb, Mapping)]


def _duplicates_section(extras: Extras) -> List[str]:
    s = [f'<h2 id="duplicates">Duplicate content</h2><p class=src>From {DUPLICATES}.</p>']
    if extras.duplicates is None:
        s.append(f"<p data-duplicates=absent>No {DUPLICATES} in the dataset folder: this build reported no "
                 "duplicate content (or did not check for it).</p>")
        return s
    dups = extras.duplicates
    cross = [row for row in dups if len({str(mb.get("split", "")) for mb in _members(row)}) > 1]
    s.append(f'<p data-duplicates="{len(dups)}" data-leaks="{len(cross)}">{len(dups)} groups of identical '
             f'content, {sum(len(r["members"]) for r in dups)} inputs; <b>{len(cross)} groups span splits</b> '
             '(the same image in two splits: leakage), highlighted.</p>')
    leaking = {id(row) for row in cross}
    s.append('<table class=dups><tr><th>content</th><th class=n>inputs</th><th>members (key · split)</th></tr>')
    shown = sorted(dups, key=lambda r: (id(r) not in leaking, str(r.get("content", ""))))
    for row in shown[:_DUPLICATE_GROUPS_SHOWN]:
        members = "<br>".join(f"<code>{_e(mb.get('key', ''))}</code> · {_e(mb.get('split', ''))}"
                              for mb in _members(row))
        s.append(f'<tr{" class=leak data-leak=1" if id(row) in leaking else ""}>'
                 f'<td><code>{_e(str(row.get("content", ""))[:16])}</code></td>'
                 f'<td class=n>{len(row["members"])}</td><td>{members}</td></tr>')
    s.append("</table>")
    if len(dups) > _DUPLICATE_GROUPS_SHOWN:
        s.append(f"<p>First {_DUPLICATE_GROUPS_SHOWN} groups shown (cross-split ones first).</p>")
    if extras.bad_duplicate_lines:
        s.append(f"<p class=warn>{extras.bad_duplicate_lines} lines of {DUPLICATES} are not rows.</p>")
    return s


def _conflicts_section(m: Manifest, extras: Extras) -> List[str]:
    """The duplicate groups whose members carry different labels: one image, two classes."""
    s = [f'<h2 id="conflicts">Label conflicts</h2><p class=src>From {DUPLICATES}: groups of identical '
         'content whose members have different labels.</p>']
    if extras.duplicates is None:
        s.append(f"<p data-conflicts=absent>No {DUPLICATES} in the dataset folder: label conflicts were not "
                 "looked for.</p>")
        return s
    if extras.duplicates and not any("label" in mb for row in extras.duplicates for mb in _members(row)):
        s.append(f"<p data-conflicts=unknown>This {DUPLICATES} records no labels (written before label "
                 "conflicts were counted); rebuild to see them.</p>")
        return s
    conflicts = [row for row in extras.duplicates if len({str(mb.get("label", "")) for mb in _members(row)}) > 1]
    s.append(f'<p data-conflicts="{len(conflicts)}"><b>{len(conflicts)} groups</b> of identical content carry '
             f'more than one label, {sum(len(r["members"]) for r in conflicts)} inputs: the same image is '
             'taught as two classes.</p>')
    if m.num_duplicate_groups >= 0 and m.num_label_conflicts != len(conflicts):
        s.append(f"<p class=warn>manifest.json counts {m.num_label_conflicts} label conflicts; {DUPLICATES} "
                 f"has {len(conflicts)}.</p>")
    if not conflicts:
        return s
    s.append('<table class=conflicts><tr><th>content</th><th>labels</th><th class=n>inputs</th>'
             '<th>members (key · label · split)</th></tr>')
    for row in sorted(conflicts, key=lambda r: str(r.get("content", "")))[:_DUPLICATE_GROUPS_SHOWN]:
        labels = sorted({str(mb.get("label", "")) for mb in _members(row)})
        members = "<br>".join(f"<code>{_e(mb.get('key', ''))}</code> · {_e(mb.get('label', ''))} · "
                              f"{_e(mb.get('split', ''))}" for mb in _members(row))
        s.append(f'<tr data-conflict="{_e(str(row.get("content", "")))}">'
                 f'<td><code>{_e(str(row.get("content", ""))[:16])}</code></td>'
                 f'<td>{_e(", ".join(labels))}</td><td class=n>{len(row["members"])}</td><td>{members}</td></tr>')
    s.append("</table>")
    if len(conflicts) > _DUPLICATE_GROUPS_SHOWN:
        s.append(f"<p>First {_DUPLICATE_GROUPS_SHOWN} of {len(conflicts)} groups shown.</p>")
    return s


# The command --------------------------------------------------------------------------------------


def default_html(manifest: Manifest) -> str:
    """`./<name>-report.html`: the current folder, never the dataset folder (see write_report)."""
    return f"{manifest.name}-report.html"


def write_report(output: str, html_path: Optional[str] = None, per_class: int = DEFAULT_PER_CLASS,
                 max_classes: int = DEFAULT_MAX_CLASSES, split: Optional[str] = None,
                 sample: int = DEFAULT_SAMPLE) -> str:
    """Writes the report page of the dataset in `output` and returns its path.

    The page does not go into the dataset folder unless asked: a published folder is the unit
    readers, `verify` and the next `--overwrite` build reason about, and it may be read-only or
    remote; so the default is `./<name>-report.html`.

    Args:
      output: the dataset folder (local, or gs://... with the builder's gcp extra).
      html_path: where to write the page; default `./<name>-report.html`.
      per_class: thumbnails per class.
      max_classes: classes on the contact sheet (the lowest label ids).
      split: the split to take thumbnails and size distributions from; default the largest.
      sample: records whose sizes make the size distributions (the first ones in shard order).

    Returns:
      The path written.

    Raises:
      errors.InputError: no readable manifest, or an unknown split.
      errors.UsageError: a bad argument or an --html path that cannot be written.
      errors.BuildError: Pillow is not installed.
    """
    import importlib.util

    from imagerecords.pipeline import checkup

    for flag, value, low in (("--per_class", per_class, 0), ("--max_classes", max_classes, 0), ("--sample", sample, 0)):
        if value < low:
            raise errors.UsageError(f"{flag} must be >= {low}, got {value}")
    if importlib.util.find_spec("PIL") is None:
        raise errors.BuildError("imagerecords report needs Pillow to make thumbnails: pip install pillow "
                                "(or 'imagerecords[build]')")
    manifest = checkup.load(output)
    html_path = html_path or default_html(manifest)
    if has_scheme(html_path):
        raise errors.UsageError(f"--html {html_path}: the report is written to a local file")
    parent = os.path.dirname(os.path.abspath(html_path))
    if not os.path.isdir(parent):
        raise errors.UsageError(f"--html {html_path}: folder {parent} does not exist")

    if split is None:
        nonempty = [s for s in manifest.splits if s.num_examples]
        # max() keeps the first of equals, and splits are sorted by name: deterministic.
        chosen = max(nonempty, key=lambda s: s.num_examples) if nonempty else None
    else:
        try:
            chosen = manifest.split(split)
        except KeyError as e:
            raise errors.InputError(f"{output}: {e.args[0]}") from None
    classes = _label_ids(manifest)[:max_classes]
    taken = sample_split(output, manifest, chosen, classes, per_class, sample) if chosen else None

    extras = Extras()
    stream = _open(join(output, manifest.errors_file or ERRORS))
    if stream is not None:
        with stream:
            extras.rejected, extras.skipped, extras.bad_error_lines = read_errors(stream)
    stream = _open(join(output, DUPLICATES))
    if stream is not None:
        with stream:
            extras.duplicates, extras.bad_duplicate_lines = read_duplicates(stream)

    page = render(output, manifest, taken, classes, extras, per_class)
    tmp = f"{html_path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(page)
        os.replace(tmp, html_path)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise errors.UsageError(f"--html {html_path}: cannot write ({e.strerror or e})") from None
    return html_path


def main(argv: Sequence[str]) -> int:
    """`imagerecords report OUT [--html PATH] [--per_class N] [--max_classes M] [--split S] [--sample K]`."""
    p = argparse.ArgumentParser(prog="imagerecords report",
                                description="Write one self-contained HTML page showing a dataset: sample "
                                            "images per class, label histograms, sizes, shards, rejects.")
    p.add_argument("output", help="the dataset folder (local or gs://...)")
    p.add_argument("--html", default=None,
                   help="file to write (default: ./<name>-report.html; not the dataset folder, which stays "
                        "as published)")
    p.add_argument("--per_class", type=int, default=DEFAULT_PER_CLASS,
                   help=f"thumbnails per class (default: {DEFAULT_PER_CLASS})")
    p.add_argument("--max_classes", type=int, default=DEFAULT_MAX_CLASSES,
                   help=f"classes on the contact sheet, lowest ids first (default: {DEFAULT_MAX_CLASSES})")
    p.add_argument("--split", default=None, help="split to sample images from (default: the largest)")
    p.add_argument("--sample", type=int, default=DEFAULT_SAMPLE,
                   help=f"records whose sizes make the size histograms (default: {DEFAULT_SAMPLE})")
    args = p.parse_args(list(argv))
    path = write_report(args.output, args.html, args.per_class, args.max_classes, args.split, args.sample)
    print(f"imagerecords report: wrote {path}")
    return 0
