"""Image references and the pure functions that list, label, split and order them."""

from __future__ import annotations

import bisect
import csv
import dataclasses
import functools
import hashlib
import itertools
import json
import posixpath
import re
import sys
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from imagerecords.format import codecs
from imagerecords.format import features as features_lib
from imagerecords.format.paths import has_scheme, join
from imagerecords.pipeline import urls


@dataclasses.dataclass(frozen=True, slots=True)  # slots: less memory per ref, and a build holds one per image
class ImageRef:
    """One listed image; what travels through the shuffle instead of the image bytes.

    Attributes:
      key: stable unique id (the path relative to the input root, or the manifest's key column).
      uri: where the bytes are (local path or FileSystems URI).
      label: class name or integer label as text; None until known.
      split: split name.
      size: file size in bytes at listing time (-1 when unknown).
      label_id: label id with the offset applied; set by AssignLabels.
      extras: the row's values of the declared features, as canonical JSON ({name: value}, keys
        sorted; paths of image features resolved), checked when listed; '' when none are declared.
      row: the row number when the ref is a row of an arrays input (set by the source that listed
        it); -1 for a file or URL. The input's kind travels here, never in the uri, which is the
        user's path (a file may be named `x#row=1.jpg`).
    """

    key: str
    uri: str
    label: Optional[str]
    split: str
    size: int = -1
    label_id: int = -1
    extras: str = ""
    row: int = -1


# Where in the build an input was turned away (the `stage` of an errors.jsonl row). 'opted_out': a URL
# its site opted out of (robots.txt, X-Robots-Tag, tdm-reservation); counted apart, in no reject budget.
STAGES = ("list", "read", "download", "opted_out", "decode", "label", "duplicate", "write")
OPTED_OUT = "opted_out"


@dataclasses.dataclass(frozen=True)
class Rejected:
    """An input that did not become a record, and why (one row of errors.jsonl).

    Attributes:
      uri: where the input is (or the raw manifest line when it has no usable path).
      reason: deterministic text: no object reprs, addresses or timings, so two builds of the same
        input write byte-identical errors.jsonl.
      key: the input's key, when known.
      split: its split, when known.
      stage: one of STAGES.
      error: the exception type behind the reason ('' when no exception was raised).
      skipped: True for entries that are not images of a class at all (a README directly under
        the input root): listed for the record, counted apart and not against the reject budget.
    """

    uri: str
    reason: str
    key: str = ""
    split: str = ""
    stage: str = ""
    error: str = ""
    skipped: bool = False

    def __post_init__(self):
        # A URL's password never reaches errors.jsonl, the report or a log: every row is masked here.
        for name in ("uri", "reason", "key"):
            object.__setattr__(self, name, urls.masked_text(getattr(self, name)))
        # A lone surrogate (a JSON \ud800 escape, a file name that is not UTF-8) is kept as its escape:
        # the row must be writable as UTF-8 whatever the input held.
        for name in ("uri", "reason", "key", "split"):
            text = getattr(self, name)
            if features_lib.surrogate_problem(text):
                object.__setattr__(self, name, text.encode("utf-8", "backslashreplace").decode("utf-8"))

    @property
    def opted_out(self) -> bool:
        return self.stage == OPTED_OUT

    @property
    def counted(self) -> bool:
        """Whether the row counts against a reject budget (num_rejected): not skipped, not opted out."""
        return not self.skipped and not self.opted_out

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, ensure_ascii=False)


class GroupFlags:
    """The flags a duplicates.jsonl row carries, from its `members` ((key, split, uri, label name),
    ...) (exact and near groups)."""

    # Cached: sorting, the report's counts and each row ask for these (an append writes a row per old key).
    @functools.cached_property
    def splits(self) -> Tuple[str, ...]:
        return tuple(sorted({member[1] for member in self.members}))

    @functools.cached_property
    def labels(self) -> Tuple[str, ...]:
        return tuple(sorted({member[3] for member in self.members}))

    @property
    def leaks(self) -> bool:
        """True when the group is in more than one split (train/validation leakage)."""
        return len(self.splits) > 1

    @property
    def conflicts(self) -> bool:
        """True when the group carries more than one label (a label conflict)."""
        return len(self.labels) > 1


@dataclasses.dataclass(frozen=True)
class DuplicateGroup(GroupFlags):
    """Inputs under different keys whose files hold identical bytes (one row of duplicates.jsonl).

    Attributes:
      content: hex digest of the shared bytes (the first 16 bytes of SHA-256).
      members: ((key, split, uri, label name), ...) sorted.
    """

    content: str
    members: Tuple[Tuple[str, str, str, str], ...]

    @property
    def already_present(self) -> bool:
        """True for an append's row of a key the dataset already holds with this content (its stored
        record and its listing now): one key, so no duplicate, and not written again."""
        return len({member[0] for member in self.members}) == 1

    def to_json(self) -> str:
        # Keys written in sorted order (the bytes sort_keys gave), without sorting every row again.
        return json.dumps({"conflict": self.conflicts, "content": self.content, "labels": list(self.labels),
                           "leak": self.leaks, "members": [{"key": k, "label": label, "split": s, "uri": u}
                                                           for k, s, u, label in self.members],
                           "splits": list(self.splits)}, ensure_ascii=False)


def duplicate_group(digest: bytes, members: Iterable[Tuple[str, str, str, str]]) -> Optional[DuplicateGroup]:
    """The group of (key, split, uri, label name) sharing one content digest, or None when only one
    key has it."""
    unique = tuple(sorted(set(members)))
    return DuplicateGroup(digest.hex(), unique) if len(unique) > 1 else None


def is_manifest(path: str) -> bool:
    """Whether --input names a manifest (.csv, .jsonl, .ndjson) rather than a class-folder tree."""
    return path.lower().endswith((".csv", ".jsonl", ".ndjson"))


def resolve(base: str, relative: str) -> str:
    """Resolves a manifest path against the manifest's folder; absolute paths and URIs win."""
    if has_scheme(relative) or relative.startswith("/"):
        return relative
    joined = join(base, relative)
    return joined if has_scheme(base) else posixpath.normpath(joined)


def dirname(path: str) -> str:
    if has_scheme(path):
        return path.rsplit("/", 1)[0]
    return posixpath.dirname(posixpath.abspath(path))


def hash64(salt: str, key: str) -> int:
    """Returns a 64-bit salted hash of `key`; stable across Python versions and machines."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8, person=_person(salt)).digest(), "big")


@functools.lru_cache(maxsize=64)
def _person(salt: str) -> bytes:
    # Cached: a build uses two or three salts, and hashing the salt per key would dominate hash64.
    return hashlib.sha256(salt.encode("utf-8")).digest()[:16]


def shuffle_salt(seed: int) -> str:
    return f"shuffle:{seed}"


def split_salt(split_seed: int) -> str:
    return f"split:{split_seed}"


def shuffle_hash(seed: int, key: str) -> int:
    """The position of `key` in the global order: ascending hash, key as tie-break."""
    return hash64(shuffle_salt(seed), key)


def split_bounds(splits: Sequence[Tuple[str, float]]) -> List[float]:
    """The running sums of the split fractions, in order: split k takes hashes in [bound k-1, bound k)."""
    return list(itertools.accumulate(fraction for _, fraction in splits))


def assign_split(splits: Sequence[Tuple[str, float]], split_seed: int, key: str) -> str:
    """Returns the split of `key` for fractions `splits`: the first whose running sum exceeds the
    key's hash in [0, 1), else the last. Depends on nothing but the key and seed, so adding images
    never moves an existing image to another split."""
    u = hash64(split_salt(split_seed), key) / 2.0**64
    return splits[min(bisect.bisect_right(split_bounds(splits), u), len(splits) - 1)][0]


# The reason of a file directly under a class-folder root (its row is skipped, not rejected).
ROOT_FILE_REASON = "not inside a class folder: files directly under the input root are not images of a class; skipped"


def ref_from_folder_path(root: str, path: str, size: int) -> Tuple[Optional[ImageRef], Optional[Rejected]]:
    """Makes the ref of a file found under a class-folder root (`root/<label>/**/<file>`).

    Returns:
      (ref, None), or (None, rejected) for a file directly under the root: it has no class folder,
      so its row is `skipped` (listed for the record, not counted against the reject budget).
    """
    relative = path[len(root):].lstrip("/") if path.startswith(root) else path
    parts = relative.split("/")
    if len(parts) < 2:
        return None, Rejected(path, ROOT_FILE_REASON, key=relative, stage="list", skipped=True)
    problem = label_problem(parts[0], "class folder name")
    if problem is not None:
        return None, Rejected(path, problem, key=relative, stage="label")
    problem = features_lib.surrogate_problem(relative)
    if problem is not None:  # a file name that is not UTF-8: its key could not be stored
        return None, Rejected(path, f"key {relative!r} {problem}", key=relative, stage="list")
    return ImageRef(key=relative, uri=path, label=sys.intern(parts[0]), split="", size=size), None


def is_hidden(path: str, root: str) -> bool:
    """True for files or folders whose name starts with '.', such as .DS_Store; they are not listed."""
    relative = path[len(root):] if path.startswith(root) else path
    return any(part.startswith(".") for part in relative.split("/") if part)


@dataclasses.dataclass(frozen=True)
class ManifestColumns:
    path: str = "path"
    label: str = "label"
    split: str = "split"
    key: str = "key"
    size: str = "size"
    features: Tuple[features_lib.Feature, ...] = ()

    def used(self) -> Tuple[str, ...]:
        """The columns a build reads ('uri' too: the fallback of the default path column)."""
        return (self.path, self.label, self.split, self.key, self.size, *(f.source for f in self.features),
                *(("uri",) if self.path == "path" else ()))


DEEP_JSON = "a JSON value nested deeper than the parser's limit"


def row_path(row: Mapping[str, object], columns: ManifestColumns) -> object:
    """A manifest row's image path: its path column, or 'uri' when the default 'path' is empty."""
    path = row.get(columns.path)
    if path in (None, "") and columns.path == "path":
        path = row.get("uri")
    return path


def parse_manifest_row(
    row: Mapping[str, object], base: str, columns: ManifestColumns
) -> Tuple[Optional[ImageRef], Optional[Rejected]]:
    """Makes the ref of one manifest row (CSV or JSONL, already a mapping)."""
    path = row_path(row, columns)
    raw = json.dumps(dict(row), sort_keys=True, ensure_ascii=False, default=str)
    if path in (None, ""):
        return None, Rejected(raw, f"manifest row has no {columns.path!r} value", stage="list")
    label = row.get(columns.label)
    if label in (None, ""):
        return None, Rejected(str(path), f"manifest row has no {columns.label!r} value", stage="list")
    path = str(path)
    key = row.get(columns.key)
    key = str(key) if key not in (None, "") else path
    split = row.get(columns.split)
    for what, text in (("path", path), ("key", key)):
        if _has_credentials(text):
            return None, Rejected(path, _credentials_reason(what), key, str(split or ""), stage="list",
                                  error="CredentialsInUrl")
    for what, text in (("path", path), ("key", key), ("split", str(split or ""))):
        problem = features_lib.surrogate_problem(text)
        if problem is not None:
            return None, Rejected(path, f"{what} {text!r} {problem}", key, str(split or ""), stage="list")
    if isinstance(label, (list, dict)):
        kind = "list" if isinstance(label, list) else "JSON object"
        text = json.dumps(label, ensure_ascii=False, default=str)
        hint = ("; for several classes per image, put them in another column and declare it a class list "
                "(--feature tags=class_list)" if kind == "list" else "")
        return None, Rejected(path, f"label {text} is a {kind}, not a class label: give one class name in "
                                    f"{columns.label!r}{hint}",
                              key, str(split or ""), stage="label")
    problem = label_problem(str(label))
    if problem is not None:
        return None, Rejected(path, problem, key, str(split or ""), stage="label")
    size = row.get(columns.size)
    if size in (None, ""):
        size = -1
    else:
        try:
            size = int(size)
        except (TypeError, ValueError):
            size = -2
        if size < 0:
            return None, Rejected(str(path), f"manifest row's {columns.size!r} is not a size in bytes: {row.get(columns.size)!r}",
                                  key, str(split or ""), stage="list", error="ValueError")
    extras = ""
    if columns.features:
        extras, problem = feature_values(row, base, columns.features)
        if problem is not None:
            return None, Rejected(path, problem, key, str(split or ""), stage="list", error="ValueProblem")
    # Labels and splits are few distinct strings: interned, refs share one copy and pickle sends each once per batch.
    return (ImageRef(key=key, uri=resolve(base, path), label=sys.intern(str(label)), split=sys.intern(str(split or "")),
                     size=size, extras=extras), None)


def _has_credentials(text: str) -> bool:
    return urls.is_url(text) and urls.has_userinfo(text)


def _credentials_reason(what: str) -> str:
    return (f"the {what} is a URL with credentials (user:password@): they are never sent or stored; give them in "
            "the --http_headers file as an Authorization header")


def feature_values(row: Mapping[str, object], base: str,
                   features: Sequence[features_lib.Feature]) -> Tuple[str, Optional[str]]:
    """The row's declared feature values as ImageRef.extras, or ('', why the row cannot be used)."""
    values: Dict[str, object] = {}
    for feature in features:
        try:
            value = codecs.check(feature, row.get(feature.source))
        except features_lib.ValueProblem as e:
            return "", str(e)
        if feature.dtype == "image":
            if _has_credentials(value):
                return "", _credentials_reason(f"{feature.name!r} image")
            value = resolve(base, value)
        elif feature.numeric:
            value = value.tolist()
        values[feature.name] = value
    return json.dumps(values, sort_keys=True, ensure_ascii=False, separators=(",", ":")), None


def csv_row_parser(header_line: str):
    """Returns a function that parses one CSV data line into a dict keyed by the header's columns."""
    fields = next(csv.reader([header_line]))

    def parse(line: str) -> Dict[str, str]:
        try:
            values = next(csv.reader([line]), [])
        except csv.Error as e:
            if "field limit" in str(e):
                raise ValueError(f"a CSV field is over the csv module's limit of {csv.field_size_limit()} characters; "
                                 "shorten it or store it in a file the row names") from None
            raise ValueError(f"not a CSV line: {e}") from None
        if len(values) != len(fields):
            raise ValueError(f"expected {len(fields)} CSV columns, found {len(values)}")
        return dict(zip(fields, values))

    return parse


def parse_jsonl_line(line: str) -> Dict[str, object]:
    try:
        value = json.loads(line)
    except RecursionError:
        raise ValueError(DEEP_JSON) from None
    if not isinstance(value, dict):
        raise ValueError("a JSONL manifest line must be a JSON object")
    return value


# Labels ---------------------------------------------------------------------------------------

# C0, DEL and C1 controls, and the two line separators str.splitlines also breaks on.
# A split name is part of every shard file name of the split (and TFDS's filepathTemplate).
SPLIT_NAME_RE = re.compile(r"[A-Za-z0-9_]+")
# With the dataset name (as long), the shard numbering and the longest side-file suffix, a shard's
# file names stay well under the 255 bytes of a file name: one row's 300-character split failed
# the whole build with "File name too long".
MAX_NAME_LENGTH = 64


def split_name_problem(split: str) -> Optional[str]:
    """Why `split` cannot name a split, or None."""
    if len(split) > MAX_NAME_LENGTH:
        return (f"split name {split[:20]!r}... is {len(split)} characters, over {MAX_NAME_LENGTH} (it is part of "
                "every shard file name of the split)")
    if SPLIT_NAME_RE.fullmatch(split):
        return None
    return f"split name {split!r} has characters other than letters, digits, '_'"


_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def label_problem(label: str, what: str = "label") -> Optional[str]:
    """Returns why `label` cannot be a class name (a control character in it), or None when it can.

    label.labels.txt holds one class name per line, so the line number is the id: a name with a
    line break in it would shift every name after it, and other controls break the readers that
    split or strip lines.
    """
    found = _CONTROL_RE.search(label)
    if found is None:
        problem = features_lib.surrogate_problem(label)
        return None if problem is None else f"{what} {label!r} {problem}"
    return (f"{what} {label!r} holds control character U+{ord(found.group()):04X}: class names go one per line "
            "into label.labels.txt, which it would break or shift; rename the class")


def is_int_label(label: str) -> bool:
    return bool(re.fullmatch(r"\d+", label.strip()))


def is_negative_int_label(label: str) -> bool:
    return bool(re.fullmatch(r"-\d+", label.strip()))


# Integer labels are ids as given, and the label map names every id from 0 to the largest: one
# label of 10**12 would make that many names. Ids stop at a million classes (GLDv2 has 203,094).
MAX_INT_LABELS = 1_000_000


def int_label(label: str) -> Optional[int]:
    """The id of an integer label within MAX_INT_LABELS, or None (not an integer, or past the cap)."""
    if not is_int_label(label):
        return None
    digits = label.strip().lstrip("0")
    if len(digits) > len(str(MAX_INT_LABELS)):  # never int() of a 5,000-digit label
        return None
    value = int(digits or "0")
    return value if value < MAX_INT_LABELS else None


def int_label_problem(label: str) -> Optional[str]:
    """Why an integer label cannot be a class id (negative, or past MAX_INT_LABELS), or None."""
    text = label.strip()
    shown = text if len(text) <= 20 else text[:17] + "..."
    if is_negative_int_label(label):
        return (f"label {shown} is a negative class id: integer labels are ids from 0; fix or drop the row, or "
                "give class names (label_type 'name') to treat every label as a name")
    if not is_int_label(label) or int_label(label) is not None:
        return None
    return (f"label {shown} is past the largest integer class id {MAX_INT_LABELS - 1}: integer labels name ids "
            f"0..the largest one, so they are capped at {MAX_INT_LABELS:,} classes; give class names "
            "(--label_type name) instead")


def unknown_label_reason(labels: "LabelMap", label: str) -> str:
    """Why `label` has no id in `labels` (an errors.jsonl reason)."""
    return (labels.integer and int_label_problem(label)) or f"label {label!r} is not in the label map"


@dataclasses.dataclass(frozen=True)
class LabelMap:
    """Label names and ids (offset applied).

    Attributes:
      names: class name of id `i + offset` at position i.
      offset: added to every index to give the stored label id.
      integer: True when labels were integers in the input (stored as given, plus the offset).
    """

    names: Tuple[str, ...]
    offset: int = 0
    integer: bool = False
    lists: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()  # (class_list feature, its names) by feature name

    def label_id(self, label: str) -> Optional[int]:
        """Returns the stored id of `label`, or None when the map does not know it."""
        if self.integer:
            found = self._index().get(label)  # the canonical spelling of an id: no regex per ref
            if found is not None:
                return found + self.offset
            value = int_label(label)
            return value + self.offset if value is not None and value < len(self.names) else None
        index = self._index().get(label)
        return None if index is None else index + self.offset

    def _index(self) -> Dict[str, int]:
        cached = self.__dict__.get("_cached_index")
        if cached is None:
            cached = {name: i for i, name in enumerate(self.names)}
            object.__setattr__(self, "_cached_index", cached)
        return cached

    def list_vocabulary(self, feature: str) -> Dict[str, int]:
        """name -> id of class_list `feature`."""
        cached = self.__dict__.setdefault("_cached_lists", {})
        if feature not in cached:
            cached[feature] = features_lib.vocabulary_of(dict(self.lists).get(feature, ()))
        return cached[feature]

    def to_json(self) -> Dict[str, object]:
        out: Dict[str, object] = {"names": list(self.names), "offset": self.offset, "integer": self.integer}
        if self.lists:
            out["lists"] = {name: list(names) for name, names in self.lists}
        return out


def list_names(extras: str, features: Sequence[features_lib.Feature]) -> List[Tuple[str, str]]:
    """(feature, class name) of every name a ref's class_list values hold (ids are not names)."""
    wanted = [f.name for f in features if f.dtype == "class_list" and not f.names]
    if not wanted or not extras:
        return []
    values = json.loads(extras)
    return [(name, v) for name in wanted for v in values.get(name, ()) if isinstance(v, str)]


def with_lists(labels: "LabelMap", features: Sequence[features_lib.Feature],
               pairs: Sequence[Tuple[str, str]]) -> "LabelMap":
    """The label map with the vocabulary of every class_list feature: its declared names, or the
    sorted names the rows hold."""
    declared = [f for f in features if f.dtype == "class_list"]
    if not declared:
        return labels
    seen: Dict[str, set] = {}
    for feature, name in pairs:
        seen.setdefault(feature, set()).add(name)
    lists = tuple((f.name, f.names or tuple(sorted(seen.get(f.name, ())))) for f in sorted(declared, key=lambda f: f.name))
    return dataclasses.replace(labels, lists=lists)


def vocabulary(labels: Sequence[str], label_type: str, offset: int) -> LabelMap:
    """Builds the label map from the distinct labels seen: sorted names, or integers as given."""
    distinct = sorted(set(labels))
    # A negative id among integers (a -1 'unknown') is a rejected row, never a switch to class names
    # that would shift every id.
    integer = label_type == "int" or (label_type == "auto" and bool(distinct) and all(
        is_int_label(d) or is_negative_int_label(d) for d in distinct))
    if integer:
        top = max((v for v in map(int_label, distinct) if v is not None), default=-1)
        return LabelMap(tuple(str(i) for i in range(top + 1)), offset, integer=True)
    return LabelMap(tuple(distinct), offset, integer=False)


def read_label_map(text: str, filename: str, offset: int) -> LabelMap:
    """Parses a label-map file: .json {name: id} with ids 0..n-1, or text with one name per line.

    Raises:
      ValueError: naming the file when ids are not exactly 0..n-1 or names repeat.
    """
    if filename.endswith(".json"):
        mapping = json.loads(text)
        if not isinstance(mapping, dict):
            raise ValueError(f"{filename}: a JSON label map must be an object {{name: id}}")
        ids = sorted(mapping.values())
        if ids != list(range(len(ids))):
            raise ValueError(f"{filename}: label ids must be exactly 0..{len(ids) - 1}")
        names = [None] * len(ids)
        for name, i in mapping.items():
            names[i] = name
    else:
        names = [line.strip() for line in text.splitlines() if line.strip()]
    for name in names:
        problem = label_problem(name, "label name")
        if problem is not None:
            raise ValueError(f"{filename}: {problem}")
    if len(set(names)) != len(names):
        raise ValueError(f"{filename}: a label name repeats")
    if not names:
        raise ValueError(f"{filename}: the label map is empty")
    return LabelMap(tuple(names), offset, integer=False)
