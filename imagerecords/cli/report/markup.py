"""HTML building blocks of the report page: escaping, byte sizes, tables and inline SVG bar charts."""

from __future__ import annotations

import html
from typing import Any, Mapping, Optional, Sequence, Tuple

from imagerecords.cli.report.sample import histogram


def escape(value: Any) -> str:
    """`value` as text safe inside an element or a quoted attribute."""
    return html.escape(str(value), quote=True)


def human(n: float) -> str:
    """A byte count in decimal units: '812 B', '1.5 MB'."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], numeric: Sequence[int] = (), attrs: str = "") -> str:
    """A <table> with one header row; `rows` hold HTML already escaped; `numeric` columns align right."""
    head = "".join(f'<th{" class=n" if i in numeric else ""}>{escape(h)}</th>' for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f'<td{" class=n" if i in numeric else ""}>{c}</td>' for i, c in enumerate(row))
                   + "</tr>" for row in rows)
    return f"<table{attrs}><tr>{head}</tr>{body}</table>"


BAR_WIDTH = 420  # px, the bar of the largest value (of `top` when given)


def bars_svg(rows: Sequence[Tuple[str, int, Mapping[str, Any]]], value_text=str, label_width: int = 180,
             top: Optional[int] = None) -> str:
    """A horizontal bar chart as inline SVG: one row per (label, value, data attributes).

    Each row is a <g> carrying its data attributes and data-value, with the value as its <text>,
    so the numbers can be read back from the page. `top` is the value drawn full width (default
    the largest of `rows`): charts given the same `top` can be compared bar for bar.
    """
    row_h, bar_w, text_w = 16, BAR_WIDTH, 110
    top = (top if top is not None else max((v for _, v, _ in rows), default=0)) or 1
    parts = [f'<svg width="{label_width + bar_w + text_w}" height="{row_h * len(rows) + 4}" role="img">']
    for i, (label, value, attrs) in enumerate(rows):
        y = i * row_h + 2
        w = 0 if value <= 0 else max(1, round(bar_w * value / top))
        extra = "".join(f' data-{k}="{escape(v)}"' for k, v in attrs.items())
        parts.append(
            f'<g data-value="{value}"{extra}><title>{escape(label)}: {escape(value_text(value))}</title>'
            f'<text x="{label_width - 6}" y="{y + 11}" text-anchor="end">{escape(label[:40])}</text>'
            f'<rect class="{"bar" if value > 0 else "zero"}" x="{label_width}" y="{y}" width="{w if value > 0 else 2}" '
            f'height="{row_h - 4}"/>'
            f'<text class="value" x="{label_width + w + 6}" y="{y + 11}">{escape(value_text(value))}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


def histogram_svg(name: str, values: Sequence[int], fmt=str) -> str:
    """The histogram of `values` as a bar chart whose rows carry data-hist=`name`, data-low and data-high."""
    rows = [(fmt(lo) if lo == hi else f"{fmt(lo)} – {fmt(hi)}", n, {"hist": name, "low": lo, "high": hi})
            for lo, hi, n in histogram(values)]
    return bars_svg(rows) if rows else "<p>(no records read)</p>"
