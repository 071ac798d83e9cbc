"""The report page: one function per section, joined in page order."""

from __future__ import annotations

import collections
import json
import os
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from imagerecords.format import schema
from imagerecords.format.manifest import DUPLICATES, Manifest
from imagerecords.cli.report.extras import Extras, ReasonGroup
from imagerecords.cli.report.markup import bars_svg, escape as _e, histogram_svg, human, table
from imagerecords.cli.report.render_features import boxes_svg, layers_html, values_section
from imagerecords.cli.report.sample import THUMB_SIDE, Sample, Thumb, label_counts, label_ids

_DUPLICATE_GROUPS_SHOWN = 50
_COMMON_SIZES_SHOWN = 10
_SHARD_BARS_MAX = 64  # above this many shards a split's shard sizes are shown as a histogram

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd}h3{font-size:15px;margin:16px 0 4px}
table{border-collapse:collapse;margin:6px 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
.src{color:#666;font-size:12px;margin:2px 0 8px}.warn{color:#a40}
.sheet{display:flex;flex-wrap:wrap;gap:6px}.sheet figure{margin:0;width:100px;text-align:center}
.sheet img{image-rendering:auto;border:1px solid #ccc;background:#eee}.sheet img.layer{image-rendering:pixelated}
.sheet figure.layered{width:auto;min-width:100px}.pic{position:relative;display:inline-block;line-height:0}
.pic svg.boxes{position:absolute;left:1px;top:1px}
.sheet figcaption{font-size:10px;color:#555;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
svg text{font:11px system-ui,sans-serif}.bar{fill:#4a7bd0}.zero{fill:#c33}.leak{background:#fde}
code{font-size:12px}
"""


def render(output: str, manifest: Manifest, sample: Optional[Sample], classes: Sequence[int], extras: Extras,
           per_class: int, near_thumbs: Optional[Mapping[str, Thumb]] = None) -> str:
    """Returns the report page for `manifest` (no clock or random input: equal inputs, equal bytes).

    Args:
      output: the dataset folder, as shown on the page.
      manifest: the dataset's manifest.
      sample: what was read from the shards; None when the dataset has no records.
      classes: the label ids on the contact sheet.
      extras: the errors and duplicates files' contents.
      per_class: thumbnails asked for per class.
      near_thumbs: {key: thumbnail} of the members of the cross-split near-duplicate groups shown
        (near_keys); a member without one is shown by its key.
    """
    sections = [
        _head(output, manifest),
        _splits(manifest),
        _features(extras),
        values_section(sample),
        _contact_sheet(manifest, sample, classes, per_class),
        _labels(manifest),
        _sizes(manifest, sample),
        _shards(manifest),
        _rejected(manifest, extras),
        _duplicates(extras),
        _near(extras, near_thumbs or {}),
        _conflicts(manifest, extras),
        _build(manifest),
        ["</body></html>\n"],
    ]
    return "".join(part for section in sections for part in section)


def _head(output: str, m: Manifest) -> List[str]:
    return [f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
            f"<title>{_e(m.name)} — imagerecords report</title><style>{_CSS}</style></head><body>",
            f"<h1>{_e(m.name)}</h1><p>Dataset folder <code>{_e(output)}</code>, built {_e(m.created or '?')}, "
            f"schema <code>{_e(m.schema)}</code>, {len(m.label_names)} classes, {m.num_examples} records.</p>",
            '<p>Contents: <a href="#splits">splits</a> · <a href="#features">features</a> · '
            '<a href="#values">feature values</a> · <a href="#sheet">contact sheet</a> · '
            '<a href="#labels">labels per split</a> · <a href="#sizes">image sizes</a> · '
            '<a href="#shards">shard sizes</a> · <a href="#rejected">rejected</a> · '
            '<a href="#duplicates">duplicates</a> · <a href="#near">near-duplicates</a> · '
            '<a href="#conflicts">label conflicts</a> · '
            '<a href="#build">build</a></p>']


def _splits(m: Manifest) -> List[str]:
    rows = [[_e(sp.name), sp.num_examples, len(sp.shards), _e(human(sp.num_bytes))] for sp in m.splits]
    rows.append(["<b>all</b>", m.num_examples, sum(len(sp.shards) for sp in m.splits),
                 _e(human(sum(sp.num_bytes for sp in m.splits)))])
    return ['<h2 id="splits">Splits</h2><p class=src>From manifest.json.</p>',
            table(["split", "records", "shards", "bytes"], rows, numeric=(1, 2, 3), attrs=' id="split-table"'),
            f'<p>Rejected inputs: <b data-total="rejected">{m.num_rejected}</b>; skipped (not images of a class): '
            f'<b data-total="skipped">{m.num_skipped}</b> (manifest.json; reasons under '
            f'<a href="#rejected">Rejected</a>).</p>'] + (
            [f'<p>Opted out (URLs whose sites said no, not downloaded): <b data-total="opted_out">{m.num_opted_out}</b>.</p>']
            if m.num_opted_out else [])


def _features(extras: Extras) -> List[str]:
    s = ['<h2 id="features">Declared features</h2><p class=src>From manifest.json\'s <code>features</code>.</p>']
    if extras.features is None:
        return s + ["<p data-features=absent>manifest.json declares no features.</p>"]
    s.append(f'<p data-features="{len(extras.features)}">{len(extras.features)} features declared.</p>')
    s.append(table(["name", "dtype", "shape", "encoding"],
                   [[f"<code>{_e(f.name)}</code>", _e(f.dtype or "—"), f"<code>{_e(f.shape or '—')}</code>",
                     _e(f.encoding or "—")] for f in extras.features], attrs=" id=features"))
    s.extend(f'<p class=warn data-feature-problem="{_e(f.name)}">{_e(f.problem)}</p>'
             for f in extras.features if f.problem)
    return s


def _contact_sheet(m: Manifest, sample: Optional[Sample], classes: Sequence[int], per_class: int) -> List[str]:
    s = ['<h2 id="sheet">Contact sheet</h2>']
    if sample is None:
        return s + ["<p>The dataset has no records.</p>"]
    split = m.split(sample.split)
    total_shards = len(split.shards)
    s.append(f'<p class=src data-shards-read="{len(sample.shards_read)}" data-shards-total="{total_shards}" '
             f'data-records-read="{sample.records_read}">Decoded from the records of split '
             f'<b>{_e(sample.split)}</b>: the first {per_class} records of each class in shard order '
             f'(the build\'s shuffled order), thumbnails at most {THUMB_SIDE} px. Read '
             f'{sample.records_read} records from {len(sample.shards_read)} of {total_shards} shards.</p>')
    s.extend(f'<p class=warn>{_e(problem)}</p>' for problem in sample.problems)
    if not sample.thumbs:
        return s + ['<p class=src data-no-image>The records hold no image (an arrays build without an '
                    '<code>image</code> array): nothing to show here; see <a href="#values">feature values</a>.</p>']
    all_ids = label_ids(m)
    if len(classes) < len(all_ids):
        s.append(f"<p class=warn>Showing {len(classes)} of {len(all_ids)} classes (the lowest label ids; "
                 "--max_classes shows more).</p>")
    if not per_class:
        return s + ["<p>--per_class 0: no thumbnails.</p>"]
    if sample.boxes:
        s.append(f"<p class=src>Boxes drawn from {', '.join(f'<code>{_e(b)}</code>' for b in sample.boxes)} "
                 "as (ymin, xmin, ymax, xmax); see <a href=\"#values\">feature values</a> for each one's units.</p>")
    in_split = label_counts(split)
    if None in sample.thumbs:
        return s + _class_sheet(m, None, sample, split.num_examples)
    for label in classes:
        s.extend(_class_sheet(m, label, sample, in_split.get(label, 0)))
    return s


def _class_sheet(m: Manifest, label: Optional[int], sample: Sample, in_split: int) -> List[str]:
    """One class's thumbnails; `label` None: the first records of a dataset without classes."""
    thumbs, split = sample.thumbs.get(label, []), sample.split
    if label is None:
        s = [f'<section class=class data-class="" data-label=""><h3>The first records <small>({in_split} in '
             f'{_e(split)}; the dataset has no classes)</small></h3><div class=sheet>']
        name = ""
    else:
        name = _e(_label_name(m, label))
        s = [f'<section class=class data-class="{name}" data-label="{label}">'
             f'<h3>{_e(_titled(m, label, " · "))} <small>({in_split} in {_e(split)})</small></h3><div class=sheet>']
    if not thumbs:
        s.append(f"<p>No records of this class in {_e(split)}.</p>")
    s.extend(_figure(t, name, sample) for t in thumbs)
    s.append("</div></section>")
    return s


def _figure(t: Thumb, class_name: str, sample: Sample) -> str:
    """One thumbnail with its boxes and image features, and its file name (or its place in its shard when
    the records hold no file name); `class_name` is already escaped."""
    where = f"{t.shard} record {t.index}"
    tip = f"{t.filename + ' · ' if t.filename else ''}{t.height}×{t.width} px (h×w) · {where}"
    caption = f"<figcaption>{_e(os.path.basename(t.filename) if t.filename else f'#{t.index}')}</figcaption></figure>"
    layered = " class=layered" if t.layers else ""
    if not t.data_uri:
        return (f'<figure class="warn{" layered" if t.layers else ""}" title="{_e(tip)}">cannot decode: '
                f'{_e(t.error)}{layers_html(t)}' + caption)
    return (f'<figure{layered}><span class=pic><img src="{t.data_uri}" width="{t.size[0]}" height="{t.size[1]}" '
            f'alt="{_e(t.filename or where)}" title="{_e(tip)}" data-class="{class_name}" '
            f'data-height="{t.height}" data-width="{t.width}">{boxes_svg(t, sample)}</span>{layers_html(t)}' + caption)


def _labels(m: Manifest) -> List[str]:
    counts = {sp.name: label_counts(sp) for sp in m.splits}
    top = max((n for c in counts.values() for n in c.values()), default=0)
    s = ['<h2 id="labels">Labels per split</h2><p class=src>From manifest.json (the sum of each shard\'s '
         f'label histogram). Every split is drawn to one scale: a full bar is <b data-label-scale="{top}">{top}'
         '</b> records, the largest class of any split. Red: a class with no record in the split.</p>']
    for sp in m.splits:
        s.append(f"<h3>{_e(sp.name)} ({sp.num_examples} records)</h3>")
        s.append(bars_svg([(_titled(m, label, " "), counts[sp.name].get(label, 0),
                            {"split": sp.name, "label": label}) for label in label_ids(m)], top=top))
    return s


def _sizes(m: Manifest, sample: Optional[Sample]) -> List[str]:
    s = ['<h2 id="sizes">Image sizes</h2>']
    if sample is None or not sample.sampled:
        return s + ["<p>No records read.</p>"]
    n = sample.sampled
    if not sample.sizes:
        keys = schema.keys(m.schema)
        s.append(f'<p data-sizes=absent data-sample="{n}">Read {n} records; they hold no <code>{_e(keys.height)}</code> and '
                 f'<code>{_e(keys.width)}</code> features (an arrays dataset: its image shape is in '
                 '<a href="#features">the features</a>).</p>')
        return s + (["<h3>Stored image bytes</h3>" + histogram_svg("bytes", sample.image_bytes, human)]
                    if sample.image_bytes else [])
    scope = "the whole split" if n == m.split(sample.split).num_examples else "a sample; --sample sets its size"
    return s + [
        f'<p class=src data-sample="{n}">From the records read: the first {n} records of split '
        f'<b>{_e(sample.split)}</b> in shard order ({scope}), '
        'the height and width features and the length of the stored JPEG bytes.</p>',
        "<h3>Most common sizes (height × width)</h3>",
        *_common_sizes(sample.sizes),
        "<h3>Height (px)</h3>" + histogram_svg("height", [h for h, _ in sample.sizes]),
        "<h3>Width (px)</h3>" + histogram_svg("width", [w for _, w in sample.sizes]),
        "<h3>Stored image bytes</h3>" + histogram_svg("bytes", sample.image_bytes, human),
    ]


def _common_sizes(sizes: Sequence[Tuple[int, int]]) -> List[str]:
    """The (height, width) pairs that several records share; a table of 1s would say nothing."""
    counts = collections.Counter(sizes)
    if len(sizes) > 1 and len(counts) == len(sizes):
        heights, widths = [h for h, _ in sizes], [w for _, w in sizes]
        return [f'<p data-sizes-differ="{len(sizes)}">All {len(sizes)} sizes differ: height '
                f'{_span(heights)} px, width {_span(widths)} px (their spread is in the histograms below).</p>']
    shared = [(hw, c) for hw, c in counts.most_common() if c > 1 or len(sizes) == 1]
    s = [table(["height × width", "records"], [[f"{h} × {w}", c] for (h, w), c in shared[:_COMMON_SIZES_SHOWN]],
               numeric=(1,), attrs=" id=common-sizes")]
    if len(shared) > _COMMON_SIZES_SHOWN:
        s.append(f"<p>The {_COMMON_SIZES_SHOWN} most common of {len(shared)} shared sizes shown.</p>")
    once = len(counts) - len(shared)
    if once:
        s.append(f'<p data-sizes-once="{once}">Sizes that only one record read has: {once} (not listed).</p>')
    return s


def _span(values: Sequence[int]) -> str:
    low, high = min(values), max(values)
    return f"{low}" if low == high else f"{low}–{high}"


def _shards(m: Manifest) -> List[str]:
    s = ['<h2 id="shards">Shard sizes</h2><p class=src>From manifest.json (file bytes, records).</p>']
    for sp in m.splits:
        sizes = [sh.num_bytes for sh in sp.shards]
        if not sizes:
            continue
        s.append(f"<h3>{_e(sp.name)}: {len(sizes)} shards, {human(min(sizes))} – {human(max(sizes))}</h3>")
        if len(sizes) <= _SHARD_BARS_MAX:
            s.append(bars_svg([(f"{sh.index:05d} ({sh.count} rec)", sh.num_bytes,
                                {"split": sp.name, "shard": sh.index, "count": sh.count}) for sh in sp.shards],
                              value_text=human))
        else:
            s.append(histogram_svg(f"shards-{sp.name}", sizes, human))
    return s


def _rejected(m: Manifest, extras: Extras) -> List[str]:
    s = [f'<h2 id="rejected">Rejected inputs</h2><p class=src>From {_e(m.errors_file)}, grouped by stage and '
         'reason (quoted names in a reason are shown as \'…\' so they group).</p>']
    if extras.rejected is None:
        return s + [f"<p class=warn>{_e(m.errors_file)} is missing.</p>"]
    s.extend(_reason_groups(m, "Rejected", extras.rejected, "rejected", m.num_rejected))
    s.extend(_reason_groups(m, "Skipped", extras.skipped, "skipped", m.num_skipped))
    if extras.opted_out or m.num_opted_out:  # only then: other datasets' pages keep their bytes
        s.extend(_reason_groups(m, "Opted out (URLs whose sites said no; not downloaded)", extras.opted_out,
                                "opted_out", m.num_opted_out))
    if extras.hosts:
        s.append(f'<h3 id="hosts">Hosts with the most failed or opted-out URLs (top {len(extras.hosts)})</h3>')
        s.append(table(["host", "URLs", "by reason"], [
            [f"<code>{_e(host)}</code>", total, _e(", ".join(f"{kind} {count}" for kind, count in kinds))]
            for host, total, kinds in extras.hosts], numeric=(1,), attrs=' class=hosts data-kind="hosts"'))
    if extras.bad_error_lines:
        s.append(f"<p class=warn>{extras.bad_error_lines} lines of {_e(m.errors_file)} are not JSON rows.</p>")
    return s


def _reason_groups(m: Manifest, title: str, groups: Sequence[ReasonGroup], kind: str, counted: int) -> List[str]:
    """One kind of errors.jsonl rows, grouped; `counted` is the manifest's count of that kind."""
    total = sum(g.count for g in groups)
    s = [f"<h3>{title}: {total}</h3>"]
    if total != counted:
        s.append(f"<p class=warn>manifest.json counts {counted} {kind}; {_e(m.errors_file)} has {total} rows.</p>")
    if groups:
        s.append(table(["stage", "reason", "count", "examples (key · split · reason)"], [
            [_e(g.stage), _e(g.reason), g.count,
             "<br>".join(f"<code>{_e(k)}</code> · {_e(sp or '-')} · {_e(r)}" for k, sp, r in g.examples)]
            for g in groups], numeric=(2,), attrs=f' class=reasons data-kind="{kind}"'))
    return s


def _duplicates(extras: Extras) -> List[str]:
    s = [f'<h2 id="duplicates">Duplicate content</h2><p class=src>From {DUPLICATES}.</p>']
    if extras.duplicates is None:
        return s + [f"<p data-duplicates=absent>No {DUPLICATES} in the dataset folder: this build reported no "
                    "duplicate content (or did not check for it).</p>"]
    present = [row for row in extras.duplicates if _already_present(row)]
    if present:
        s.append(f'<p data-already-present="{len(present)}">{len(present)} already in the dataset: inputs of this '
                 'append whose keys the dataset held with the same content, not written again (not duplicates; '
                 f'their rows in {DUPLICATES} name one key twice).</p>')
    dups = _true_duplicates(extras.duplicates)
    if not dups:
        return s + [f"<p data-duplicates=0 data-leaks=0>No duplicate content: the build compared the bytes of "
                    f"every input and found no two alike ({DUPLICATES} holds no groups"
                    f"{' of two keys' if present else ''}).</p>"] + _bad_duplicate_lines(extras)
    cross = [row for row in dups if len({str(mb.get("split", "")) for mb in _members(row)}) > 1]
    s.append(f'<p data-duplicates="{len(dups)}" data-leaks="{len(cross)}">{len(dups)} groups of identical '
             f'content, {sum(len(r["members"]) for r in dups)} inputs; <b>{len(cross)} groups span splits</b> '
             '(the same image in two splits: leakage), highlighted.</p>')
    leaking = {id(row) for row in cross}
    s.append('<table class=dups><tr><th>content</th><th class=n>inputs</th><th>members (key · split)</th></tr>')
    shown = sorted(dups, key=lambda r: (id(r) not in leaking, str(r.get("content", ""))))
    s.extend(_duplicate_row(row, id(row) in leaking) for row in shown[:_DUPLICATE_GROUPS_SHOWN])
    s.append("</table>")
    if len(dups) > _DUPLICATE_GROUPS_SHOWN:
        s.append(f"<p>First {_DUPLICATE_GROUPS_SHOWN} groups shown (cross-split ones first).</p>")
    return s + _bad_duplicate_lines(extras)


def _near_shown(extras: Extras) -> List[Mapping[str, Any]]:
    """The near-duplicate groups on the page: cross-split ones first, then label disagreements."""
    rows = sorted(extras.near, key=lambda r: (not r.get("leak"), not r.get("conflict")))
    return rows[:_DUPLICATE_GROUPS_SHOWN]


def near_keys(extras: Extras) -> set:
    """The keys whose thumbnails the near-duplicates section shows: members of cross-split groups."""
    return {str(mb.get("key", "")) for row in _near_shown(extras) if row.get("leak") for mb in _members(row)}


def _near(extras: Extras, thumbs: Mapping[str, Thumb]) -> List[str]:
    s = [f'<h2 id="near">Near-duplicates</h2><p class=src>From {DUPLICATES}, rows of kind "near": images whose '
         'perceptual hashes are a few bits apart (resized, recompressed or slightly cropped copies).</p>']
    if extras.duplicates is None:
        return s + [f"<p data-near=absent>No {DUPLICATES} in the dataset folder.</p>"]
    rows = extras.near
    leaks = [r for r in rows if r.get("leak")]
    conflicts = [r for r in rows if r.get("conflict")]
    s.append(f'<p data-near="{len(rows)}" data-near-leaks="{len(leaks)}">{len(rows)} groups of near-duplicates; '
             f'<b>{len(leaks)} cross splits</b> (an edited copy of a training image in another split: an '
             f'evaluation leak), shown side by side; {len(conflicts)} carry more than one label.</p>')
    if not rows:
        return s
    s.append("<table class=near><tr><th class=n>bits apart</th><th>labels</th><th>members</th></tr>")
    for row in _near_shown(extras):
        if row.get("leak"):
            figures = []
            for mb in _members(row):
                key, thumb = str(mb.get("key", "")), thumbs.get(str(mb.get("key", "")))
                pic = (f'<img src="{thumb.data_uri}" width={thumb.size[0]} height={thumb.size[1]} alt="">'
                       if thumb is not None and thumb.data_uri else "<span class=warn>no thumbnail</span>")
                figures.append(f'<figure>{pic}<figcaption title="{_e(key)}">{_e(mb.get("split", ""))} · '
                               f'{_e(mb.get("label", ""))}<br>{_e(key)}</figcaption></figure>')
            members = f'<div class=sheet>{"".join(figures)}</div>'
        else:
            members = "<br>".join(f"<code>{_e(mb.get('key', ''))}</code> · {_e(mb.get('split', ''))}"
                                  for mb in _members(row))
        labels = _e(", ".join(str(x) for x in row.get("labels", [])))
        s.append(f'<tr{" class=leak data-leak=1" if row.get("leak") else ""}>'
                 f'<td class=n>{_e(str(row.get("distance", "")))}</td>'
                 f'<td{" class=warn" if row.get("conflict") else ""}>{labels}</td><td>{members}</td></tr>')
    s.append("</table>")
    if len(rows) > _DUPLICATE_GROUPS_SHOWN:
        s.append(f"<p>First {_DUPLICATE_GROUPS_SHOWN} of {len(rows)} groups shown (cross-split ones first).</p>")
    return s


def _already_present(row: Mapping[str, Any]) -> bool:
    """An append's row of a key the dataset already held with this content: its members share one key."""
    members = _members(row)
    return len(members) > 1 and len({str(mb.get("key", "")) for mb in members}) == 1


def _true_duplicates(rows: List[Mapping[str, Any]]) -> List[Mapping[str, Any]]:
    """The rows of identical files under two keys or more (an append's rows of present keys left out)."""
    return [row for row in rows if not _already_present(row)]


def _bad_duplicate_lines(extras: Extras) -> List[str]:
    if not extras.bad_duplicate_lines:
        return []
    return [f"<p class=warn>{extras.bad_duplicate_lines} lines of {DUPLICATES} are not rows.</p>"]


def _duplicate_row(row: Mapping[str, Any], leak: bool) -> str:
    members = "<br>".join(f"<code>{_e(mb.get('key', ''))}</code> · {_e(mb.get('split', ''))}"
                          for mb in _members(row))
    return (f'<tr{" class=leak data-leak=1" if leak else ""}>'
            f'<td><code>{_e(str(row.get("content", ""))[:16])}</code></td>'
            f'<td class=n>{len(row["members"])}</td><td>{members}</td></tr>')


def _conflicts(m: Manifest, extras: Extras) -> List[str]:
    """The duplicate groups whose members carry different labels: one image, two classes."""
    s = [f'<h2 id="conflicts">Label conflicts</h2><p class=src>From {DUPLICATES}: groups of identical '
         'content whose members have different labels.</p>']
    if extras.duplicates is None:
        return s + [f"<p data-conflicts=absent>No {DUPLICATES} in the dataset folder: label conflicts were not "
                    "looked for.</p>"]
    if extras.duplicates and not any("label" in mb for row in extras.duplicates for mb in _members(row)):
        return s + [f"<p data-conflicts=unknown>This {DUPLICATES} records no labels (written before label "
                    "conflicts were counted); rebuild to see them.</p>"]
    conflicts = [row for row in _true_duplicates(extras.duplicates)
                 if len({str(mb.get("label", "")) for mb in _members(row)}) > 1]
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
    shown = sorted(conflicts, key=lambda r: str(r.get("content", "")))[:_DUPLICATE_GROUPS_SHOWN]
    s.extend(_conflict_row(row) for row in shown)
    s.append("</table>")
    if len(conflicts) > _DUPLICATE_GROUPS_SHOWN:
        s.append(f"<p>First {_DUPLICATE_GROUPS_SHOWN} of {len(conflicts)} groups shown.</p>")
    return s


def _conflict_row(row: Mapping[str, Any]) -> str:
    labels = sorted({str(mb.get("label", "")) for mb in _members(row)})
    members = "<br>".join(f"<code>{_e(mb.get('key', ''))}</code> · {_e(mb.get('label', ''))} · "
                          f"{_e(mb.get('split', ''))}" for mb in _members(row))
    return (f'<tr data-conflict="{_e(str(row.get("content", "")))}">'
            f'<td><code>{_e(str(row.get("content", ""))[:16])}</code></td>'
            f'<td>{_e(", ".join(labels))}</td><td class=n>{len(row["members"])}</td><td>{members}</td></tr>')


def _build(m: Manifest) -> List[str]:
    top = [("name", m.name), ("schema", m.schema), ("seed", m.seed), ("label_offset", m.label_offset),
           ("integer_labels", m.integer_labels), ("created", m.created)]
    shown = dict(top)
    # The build settings repeat some top-level fields (label_offset; name, seed, schema in version 1):
    # list each once, and a repeat only when it disagrees, under its full name.
    params = [(k if k not in shown else f"parameters.{k}", v) for k, v in _flatten(m.parameters)
              if k not in shown or v != shown[k]]
    return ['<h2 id="build">Build</h2><p class=src>From manifest.json.</p>',
            table(["setting", "value"], [[_e(k), f"<code>{_e(json.dumps(v))}</code>"]
                                         for k, v in top + params], attrs=" id=parameters"),
            "<h3>Versions</h3>",
            table(["package", "version"], [[_e(k), _e(v)] for k, v in sorted(m.versions.items())],
                  attrs=" id=versions")]


def _members(row: Mapping[str, Any]) -> List[Mapping[str, Any]]:
    return [mb for mb in row["members"] if isinstance(mb, Mapping)]


def _titled(manifest: Manifest, label: int, sep: str) -> str:
    """`id<sep>name`, or the id alone when the name is that id (integer classes: "3", not "3 3")."""
    name = _label_name(manifest, label)
    return name if name == str(label) else f"{label}{sep}{name}"


def _label_name(manifest: Manifest, label: int) -> str:
    i = label - manifest.label_offset
    return manifest.label_names[i] if 0 <= i < len(manifest.label_names) else f"#{label}"


def _flatten(d: Mapping[str, Any], prefix: str = "") -> List[Tuple[str, Any]]:
    """(dotted key, value) of every leaf of a nested mapping, keys sorted."""
    out = []
    for k in sorted(d):
        v = d[k]
        if isinstance(v, Mapping) and v:
            out.extend(_flatten(v, f"{prefix}{k}."))
        else:
            out.append((f"{prefix}{k}", v))
    return out
