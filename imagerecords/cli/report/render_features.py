"""The report's views of declared features: the values section, and the boxes and layers of a thumbnail."""

from __future__ import annotations

from typing import List, Optional, Sequence

from imagerecords.cli.report.markup import bars_svg, escape as _e, histogram_svg
from imagerecords.cli.report.sample import Box, Sample, Thumb
from imagerecords.cli.report.values import FeatureValues, is_scalar, value_histogram

BOX_COLOURS = ("#ff2d2d", "#ffd21f", "#21d4ff", "#5dff3b", "#ff3bf0", "#ffffff")


def values_section(sample: Optional[Sample]) -> List[str]:
    """What the first records read hold of each declared feature: a histogram of a scalar, bars of a
    class list's classes, a string's first values, a tensor's value range."""
    s = ['<h2 id="values">Feature values</h2>']
    if sample is None or not sample.values:
        return s + ["<p>No declared features to read.</p>" if sample is not None else "<p>No records read.</p>"]
    s.append(f'<p class=src>From the first {sample.sampled} records of split <b>{_e(sample.split)}</b> in shard '
             'order (the records the image sizes come from; --sample sets how many).</p>')
    for name in sorted(sample.values):
        s.extend(_feature_values(sample.values[name], name in sample.boxes))
    return s


def _feature_values(fv: FeatureValues, drawn: bool) -> List[str]:
    f = fv.feature
    kind = f.dtype if not f.numeric else f"{f.dtype} {_shape_text(f.shape)}"
    s = [f'<section class=feature data-feature="{_e(f.name)}" data-records="{fv.records}">'
         f'<h3><code>{_e(f.name)}</code> <small>({_e(kind)}; {fv.records} records)</small></h3>']
    if fv.missing:
        s.append(f'<p class=warn data-missing="{fv.missing}">{fv.missing} records read lack it.</p>')
    if fv.problems:
        s.append(f'<p class=warn data-undecodable="{fv.problems}">{fv.problems} values do not read as declared: '
                 f'{_e(fv.first_problem)}.</p>')
    if f.dtype == "class_list":
        s.extend(_class_bars(fv))
    elif f.dtype == "string":
        s.extend(_strings(fv))
    elif f.dtype == "image":
        s.append("<p>Shown beside each image on the contact sheet (integer values under 32 in false colours, "
                 "other greyscale min–max scaled).</p>")
    elif is_scalar(f):
        s.append(_scalar_histogram(fv))
    else:
        s.append(_tensor_range(fv, drawn))
    s.append("</section>")
    return s


def _shape_text(shape: Sequence[Optional[int]]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _scalar_histogram(fv: FeatureValues) -> str:
    name, values = fv.feature.name, fv.scalars
    if fv.feature.dtype in ("uint8", "int32", "int64", "bool"):
        return histogram_svg(f"feature-{name}", [int(v) for v in values])
    rows = [(_num(lo) if lo == hi else f"{_num(lo)} – {_num(hi)}", n,
             {"hist": f"feature-{name}", "low": _num(lo), "high": _num(hi)}) for lo, hi, n in value_histogram(values)]
    return bars_svg(rows) if rows else "<p>(no finite values read)</p>"


def _num(x: float) -> str:
    return f"{x:.4g}"


def _class_bars(fv: FeatureValues) -> List[str]:
    names = fv.feature.names
    ids = sorted(set(range(len(names))) | set(fv.classes))
    total = sum(fv.classes.values())
    rows = [(names[i] if 0 <= i < len(names) else f"#{i}", fv.classes.get(i, 0),
             {"feature": fv.feature.name, "class": names[i] if 0 <= i < len(names) else f"#{i}", "id": i}) for i in ids]
    return [f'<p data-occurrences="{total}">{total} class names in {fv.records} records (a record may hold '
            'several, or none). Red: a class of the vocabulary no record read holds.</p>',
            bars_svg(rows) if rows else "<p>(no classes)</p>"]


def _strings(fv: FeatureValues) -> List[str]:
    items = "".join(f"<li><code>{_e(text)}</code></li>" for text in fv.examples)
    return [f'<p data-distinct="{len(fv.distinct)}">{len(fv.distinct)} distinct values; the first '
            f'{len(fv.examples)}:</p><ul class=strings data-strings="{_e(fv.feature.name)}">{items}</ul>']


def _tensor_range(fv: FeatureValues, drawn: bool) -> str:
    if fv.low is None:
        span = "no finite values"
    else:
        span = f'values <span data-low="{_num(fv.low)}" data-high="{_num(fv.high)}">{_num(fv.low)} – {_num(fv.high)}</span>'
    text = f"{fv.count} values in all, {span}"
    if fv.non_finite:
        text += f", {fv.non_finite} NaN or infinite"
    if drawn:
        convention = "fractions of the image (0..1)" if fv.normalized else "pixels (values beyond 0..1)"
        text += (f'. Drawn as boxes on the contact sheet: (ymin, xmin, ymax, xmax) in '
                 f'<b data-convention="{"normalized" if fv.normalized else "pixels"}">{convention}</b>')
    return f"<p data-values=\"{fv.count}\">{text}.</p>"


def boxes_svg(thumb: Thumb, sample: Sample) -> str:
    """The thumbnail's boxes as an SVG the size of the thumbnail, one <svg class=boxes> per box feature."""
    out = []
    for i, name in enumerate(sample.boxes):
        boxes = thumb.boxes.get(name, [])
        fv = sample.values[name]
        colour = BOX_COLOURS[i % len(BOX_COLOURS)]
        rects = "".join(_rect(box, thumb, fv.normalized, colour) for box in boxes)
        out.append(f'<svg class=boxes width="{thumb.size[0]}" height="{thumb.size[1]}" data-boxes="{_e(name)}" '
                   f'data-count="{len(boxes)}">{rects}</svg>')
    return "".join(out)


def _rect(box: Box, thumb: Thumb, normalized: bool, colour: str) -> str:
    """One box: (ymin, xmin, ymax, xmax) as fractions, or as pixels of the stored image, on the thumbnail."""
    tw, th = thumb.size
    sx, sy = (tw, th) if normalized else (tw / max(1, thumb.width), th / max(1, thumb.height))
    ymin, xmin, ymax, xmax = box
    x, y = min(xmin, xmax) * sx, min(ymin, ymax) * sy
    w, h = abs(xmax - xmin) * sx, abs(ymax - ymin) * sy
    return (f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="none" stroke="{colour}" '
            f'stroke-width="1.5"><title>{", ".join(_num(c) for c in box)}</title></rect>')


def layers_html(thumb: Thumb) -> str:
    """The record's image features beside its thumbnail."""
    out = []
    for layer in thumb.layers:
        if layer.data_uri is None:
            out.append(f'<span class="layer warn" data-layer="{_e(layer.name)}" title="{_e(layer.error)}">'
                       f'{_e(layer.name)}: {_e(layer.error)}</span>')
        else:
            out.append(f'<img class=layer src="{layer.data_uri}" width="{layer.size[0]}" height="{layer.size[1]}" '
                       f'alt="{_e(layer.name)}" title="{_e(layer.name)}" data-layer="{_e(layer.name)}">')
    return "".join(out)
