"""The source interface: what a build asks of its input, whatever kind it is.

A build's input is one string (a folder, a manifest, an .npz, or what a registered source claims).
`of(path)` picks the Source that claims it, once; the checks, the local engine, the Beam graph and
the shard writer then only call its methods, so a new input kind is one module holding a Source
subclass and one `register` call, and no file here changes (tests/test_sources.py does that from a test).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple, Union

from imagerecords.pipeline import storage
from imagerecords.pipeline.refs import ImageRef, Rejected
from imagerecords.pipeline.read import input_files

Listed = Union[ImageRef, Rejected]


@dataclasses.dataclass(frozen=True)
class InputInfo:
    """What the checks learned about the input (so that nobody reads it again to learn it).

    Attributes:
      kind: the source's kind: 'folder', 'csv', 'jsonl', 'arrays', or a registered source's.
      columns: a manifest's column names (CSV header, or the keys of the first JSONL_COLUMN_ROWS
        JSONL rows); () for a folder.
      header: a CSV manifest's header line as written (BOM and line break removed), else None;
        ReadManifest parses every data line with it.
      first_row: a manifest's first data row, its text values by column ((column, value), ...).
      sizes_known: whether the listing learns each input's size (a stat, a size column); without
        them (URL rows, --skip_stat) the shards are planned by count (planning.UNSIZED_IMAGE_BYTES).
    """

    kind: str
    columns: Tuple[str, ...] = ()
    header: Optional[str] = None
    first_row: Tuple[Tuple[str, str], ...] = ()
    sizes_known: bool = True


class Source:
    """One kind of input. Subclasses override `claims`, `check` and `list_part`; the rest has
    defaults that fit a source whose refs name files (any path storage.open_read takes).

    Instances travel to worker processes and Beam workers (pickled), so they hold no open handle.
    """

    kind = "source"
    unit = "images"  # what the progress line counts

    def claims(self, path: str) -> bool:
        """Whether this source reads `path` (asked in registration order, newest first)."""
        raise NotImplementedError

    def check(self, config, *, ignore_split_column: bool = False) -> InputInfo:
        """Checks that the input exists and has the shape this source reads, reading as little as
        possible; raises errors.InputError naming the input and the problem."""
        return InputInfo(self.kind)

    def bind(self, config) -> "Source":
        """This source set up for one build (settings its reader needs); made in the launcher, then
        pickled to the workers. Default: itself."""
        return self

    def local(self, path: str) -> bool:
        """Whether the local engine can list and read this input (else the build runs on Beam)."""
        return storage.is_local(path)

    def parts(self, config, info: InputInfo, workers: int) -> Sequence[Any]:
        """The listing's tasks, each handed to list_part (picklable; in this order, their refs
        come in the order a serial listing gives). `workers`: processes sharing them (0: none)."""
        return [None]

    def list_part(self, config, info: InputInfo, part: Any) -> Iterable[Listed]:
        """One task's inputs: an ImageRef each, or a Rejected row saying why one cannot be used."""
        raise NotImplementedError

    def beam_listing(self, config, info: InputInfo, transforms):
        """The Beam transform listing this input (a PTransform from the pipeline's root whose main
        output is refs and whose REJECTED output is rows); None: the generic one runs parts and
        list_part on Beam's workers (transforms.ListSource). `transforms` is the module
        imagerecords.transforms, handed over by the Beam graph: the sources import no Beam code."""
        return None

    def reader(self, options) -> Callable[[str], bytes]:
        """Reads one ref's uri whole, under `options.max_file_bytes` (codec.ImageOptions); raises
        input_files.Refused or OSError for an input it cannot read (the ref becomes a row)."""
        return input_files.limited_reader(options)

    def identity(self, path: str) -> str:
        """What the resume fingerprint records of the input beyond each ref's line ("" for nothing)."""
        return ""

    def label_type(self, config) -> str:
        """The label type the vocabulary is made with (config.labels.label_type unless the input says)."""
        return config.labels.label_type

    def folder(self, path: str) -> Optional[str]:
        """The folder this input lists whole, which the output must stay out of; None for none."""
        return None

    def prepare(self, config) -> None:
        """Runs in the launcher before worker processes start (what they should share)."""

    def downloads(self, config, info: InputInfo) -> bool:
        """Whether reading its inputs waits on the network (URL rows): a shard writer then reads as
        many at once as it has image threads (config.threads), not only as many as keep its CPU busy."""
        return False

    def shared_by(self, downloaders: int) -> "Source":
        """This source when `downloaders` read it at once on a Beam runner, each with its share of a
        per-host limit (read/politeness.share). Default: itself (it downloads nothing)."""
        return self


_REGISTERED: List[Source] = []


def register(source: Source) -> Source:
    """Adds a source; it is asked before every source registered earlier and the built-in ones."""
    if not isinstance(source, Source):
        raise TypeError(f"register takes a Source instance, got {source!r:.80}")
    _REGISTERED.insert(0, source)
    return source


def unregister(source: Source) -> None:
    """Removes a source added by register (a test's, when it ends)."""
    _REGISTERED.remove(source)


def registered() -> List[Source]:
    return list(_REGISTERED)


def first_line(message: object) -> str:
    """An exception's first line, for a one-line InputError."""
    text = str(message).strip()
    return text.splitlines()[0] if text else type(message).__name__
