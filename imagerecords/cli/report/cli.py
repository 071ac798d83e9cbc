"""The `imagerecords report` command: its arguments, their checks, and writing the page to a file."""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
from typing import Callable, Optional, Sequence

from imagerecords.pipeline import errors
from imagerecords.format.manifest import Manifest, Split
from imagerecords.format.paths import has_scheme
from imagerecords.cli.report.extras import read_extras
from imagerecords.cli.report.render import near_keys, render
from imagerecords.cli.report.sample import label_ids, sample_split, thumbs_by_key

DEFAULT_PER_CLASS = 8
DEFAULT_MAX_CLASSES = 100
DEFAULT_SAMPLE = 1000

# Reads a dataset folder's manifest, raising errors.InputError (or UnfinishedBuild) with the one-line
# message the command prints; the command line passes its own, so this package imports nothing above it.
LoadManifest = Callable[[str], Manifest]


def default_html(output: str, manifest: Manifest) -> str:
    """`./<name>-<8 hex>-report.html`: the current folder, never the dataset folder (see write_report).

    The hex digits come from the dataset's location, so datasets of the same name (every build of a
    folder tree is "images" by default) get different files, and the same dataset always the same one.
    """
    return f"{manifest.name}-{hashlib.sha256(_location(output).encode()).hexdigest()[:8]}-report.html"


def _location(output: str) -> str:
    """The dataset folder as one string per dataset: its resolved absolute path, or its URI."""
    return output.rstrip("/") if has_scheme(output) else os.path.realpath(output)


# The last line of every page names the dataset it shows, so a default file of another dataset is
# never replaced silently; '-' is escaped so the name cannot end the HTML comment.
_MARK = "<!-- imagerecords report of: {} -->\n"


def _marked(page: str, output: str) -> str:
    return page.rstrip("\n") + "\n" + _MARK.format(json.dumps(_location(output)).replace("-", "\\u002d"))


def _shows(html_path: str) -> Optional[str]:
    """The dataset location a report file we wrote names; None for a file without our mark."""
    try:
        with open(html_path, "rb") as f:
            f.seek(max(os.path.getsize(html_path) - 8192, 0))
            tail = f.read().decode("utf-8", "replace").rstrip("\n").rsplit("\n", 1)[-1]
    except OSError:
        return None
    head, _, rest = _MARK.partition("{}")
    if not (tail.startswith(head) and tail.endswith(rest.rstrip("\n"))):
        return None
    try:
        return json.loads(tail[len(head):len(tail) - len(rest.rstrip("\n"))])
    except ValueError:
        return None


def write_report(output: str, html_path: Optional[str] = None, per_class: int = DEFAULT_PER_CLASS,
                 max_classes: int = DEFAULT_MAX_CLASSES, split: Optional[str] = None,
                 sample: int = DEFAULT_SAMPLE, *, load_manifest: LoadManifest) -> str:
    """Writes the report page of the dataset in `output` and returns its path.

    The page does not go into the dataset folder unless asked: a published folder is the unit
    readers, `verify` and the next `--overwrite` build reason about, and it may be read-only or
    remote; so the default is `./<name>-<8 hex>-report.html` (see default_html), and a default
    file that holds another dataset's report is refused rather than replaced.

    Args:
      output: the dataset folder (local, or gs://... with the builder's gcp extra).
      html_path: where to write the page; default `./<name>-<8 hex>-report.html`.
      per_class: thumbnails per class.
      max_classes: classes on the contact sheet (the lowest label ids).
      split: the split to take thumbnails and size distributions from; default the largest.
      sample: records whose sizes make the size distributions (the first ones in shard order).
      load_manifest: reads `output`'s manifest (the command line's `checkup.load`).

    Returns:
      The path written.

    Raises:
      errors.InputError: no readable manifest, or an unknown split.
      errors.UsageError: a bad argument or an --html path that cannot be written.
      errors.BuildError: Pillow is not installed.
    """
    _check_arguments(per_class, max_classes, sample)
    manifest = load_manifest(output)
    if html_path is None:
        html_path = default_html(output, manifest)
        if os.path.lexists(html_path) and _shows(html_path) != _location(output):
            other = _shows(html_path)
            holds = f"the report of {other}" if other else "a file this command did not write"
            raise errors.UsageError(f"{html_path} holds {holds}, not the report of {_location(output)}; "
                                    "pass --html PATH to write this one elsewhere, or remove that file")
    _check_html_path(html_path)
    chosen = _choose_split(output, manifest, split)
    classes = label_ids(manifest)[:max_classes]
    taken = sample_split(output, manifest, chosen, classes, per_class, sample) if chosen else None
    extras = read_extras(output, manifest)
    shown = near_keys(extras)
    page = render(output, manifest, taken, classes, extras, per_class,
                  thumbs_by_key(output, manifest, shown) if shown else None)
    _write_atomically(html_path, _marked(page, output))
    return html_path


def _check_arguments(per_class: int, max_classes: int, sample: int) -> None:
    for flag, value in (("--per_class", per_class), ("--max_classes", max_classes), ("--sample", sample)):
        if value < 0:
            raise errors.UsageError(f"{flag} must be >= 0, got {value}")
    if importlib.util.find_spec("PIL") is None:
        raise errors.BuildError("imagerecords report needs Pillow to make thumbnails: pip install pillow "
                                "(or 'imagerecords[build]')")


def _check_html_path(html_path: str) -> None:
    if has_scheme(html_path):
        raise errors.UsageError(f"--html {html_path}: the report is written to a local file")
    parent = os.path.dirname(os.path.abspath(html_path))
    if not os.path.isdir(parent):
        raise errors.UsageError(f"--html {html_path}: folder {parent} does not exist")


def _choose_split(output: str, manifest: Manifest, split: Optional[str]) -> Optional[Split]:
    """The split named, or the largest non-empty one (None when every split is empty)."""
    if split is not None:
        try:
            return manifest.split(split)
        except KeyError as e:
            raise errors.InputError(f"{output}: {e.args[0]}") from None
    nonempty = [s for s in manifest.splits if s.num_examples]
    # max() keeps the first of equals, and splits are sorted by name: deterministic.
    return max(nonempty, key=lambda s: s.num_examples) if nonempty else None


def _write_atomically(html_path: str, page: str) -> None:
    tmp = f"{html_path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(page)
        os.replace(tmp, html_path)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise errors.UsageError(f"--html {html_path}: cannot write ({e.strerror or e})") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="imagerecords report",
                                description="Write one self-contained HTML page showing a dataset: sample "
                                            "images per class, label histograms, sizes, shards, rejects.")
    p.add_argument("output", help="the dataset folder (local or gs://...)")
    p.add_argument("--html", default=None,
                   help="file to write (default: ./<name>-<8 hex of the dataset's path>-report.html, one per "
                        "dataset; not the dataset folder, which stays as published)")
    p.add_argument("--per_class", type=int, default=DEFAULT_PER_CLASS,
                   help=f"thumbnails per class (default: {DEFAULT_PER_CLASS})")
    p.add_argument("--max_classes", type=int, default=DEFAULT_MAX_CLASSES,
                   help=f"classes on the contact sheet, lowest ids first (default: {DEFAULT_MAX_CLASSES})")
    p.add_argument("--split", default=None, help="split to sample images from (default: the largest)")
    p.add_argument("--sample", type=int, default=DEFAULT_SAMPLE,
                   help=f"records whose sizes make the size histograms (default: {DEFAULT_SAMPLE})")
    return p


def main(argv: Sequence[str], load_manifest: LoadManifest) -> int:
    """`imagerecords report OUT [--html PATH] [--per_class N] [--max_classes M] [--split S] [--sample K]`."""
    args = _parser().parse_args(list(argv))
    path = write_report(args.output, args.html, args.per_class, args.max_classes, args.split, args.sample,
                        load_manifest=load_manifest)
    print(f"imagerecords report: wrote {path}")
    return 0
