"""The publish protocol: staging, the build's results, and the commit (the lock: output_lock.py;
the check of staged files: staged_check.py).

    OUT/.imagerecords.lock                  one build at a time (created only if absent)
    OUT/.imagerecords-staging/<build id>/   each build's shards and results (a late writer of another
                                            build can never reach them); no shard glob reaches in
        <shard files>, index/, errors.jsonl, results.json (the engine's last write), commit.json
        (the commit under way)
    OUT/v-<build id>/                       a published build's shards and index files, never
                                            rewritten; manifest.json names the current one
    OUT/<version name>/                     the same, for a build given --version_name

Commit, once every shard is staged and the reject budget passed: record the commit in staging →
check every staged shard against what its writer reported (locally its size and sha256, read back;
on gs:// its size and crc32c from the staging listing's object metadata, nothing read) → move the shards into
the build's own version folder (no file a published manifest points at is touched) → errors.jsonl,
duplicates.jsonl, TFDS's metadata → manifest.json last (the switch) → remove the versions beyond
the retention (`--keep_versions`) → remove staging. A reader that loaded the previous manifest
keeps reading the previous version's files until a later build removes them, and then fails
naming them; never a mix. Each step can be redone, so a commit cut short is finished by
`imagerecords finish OUT` (or replaced by a `--overwrite` rebuild).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import os
import shutil
import time
from importlib import metadata as importlib_metadata
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from imagerecords import __version__
from imagerecords.pipeline import phases, staging, storage
from imagerecords.pipeline.errors import BudgetExceeded, OutputError, UnfinishedBuild
from imagerecords.pipeline.publish import staged_check
from imagerecords.pipeline.write import dataset_files
from imagerecords.format import side_files
from imagerecords.format import manifest as manifest_lib
from imagerecords.format.manifest import (COLUMNS_FROM, DUPLICATES, ERRORS, FLAT_LAYOUT, MANIFEST, VERSION_PREFIX,
                                          SHARDS_SUFFIX, Manifest, dumps)
from imagerecords.format.record_format import is_shard_name
from imagerecords.format.paths import inside_problem
from imagerecords.pipeline.config import PublishOptions, version_name_problem
from imagerecords.pipeline.naming import setting
from imagerecords.pipeline.publish import appending
from imagerecords.pipeline.publish import hosts

log = logging.getLogger(__name__)

RESULTS = "results.json"
COMMIT = "commit.json"


def versions() -> Dict[str, str]:
    """Versions recorded in the manifest: a build is reproducible for equal versions."""
    out = {"imagerecords": __version__}
    for label, dists in (("apache-beam", ["apache-beam"]), ("tensorflow", ["tensorflow", "tensorflow-cpu"]),
                         ("pillow", ["pillow"]), ("numpy", ["numpy"]), ("deflate", ["deflate"])):
        for dist in dists:
            try:
                out[label] = importlib_metadata.version(dist)
                break
            except importlib_metadata.PackageNotFoundError:
                continue
    return out


# A pipeline's staging area untouched this long is a killed job's: a live one stages a shard every few
# minutes. A pipeline's commit removes such areas; newer ones may be other pipelines' writing now.
ABANDONED_STAGING_S = 6 * 3600


def _remove_abandoned_staging(output: str) -> None:
    """Removes the local staging areas no file of which changed in ABANDONED_STAGING_S (gs:// areas
    stay: their times are a request each; the next command build or `finish` clears them)."""
    if not storage.is_local(output):
        return

    for build in staging.staged_builds(output):
        try:
            folder = staging.staging_dir(output, build)
        except ValueError:
            continue  # not a build id (a folder someone else made there): not ours to remove
        newest = max((os.lstat(os.path.join(d, n)).st_mtime for d, _, names in os.walk(folder) for n in names),
                     default=os.lstat(folder).st_mtime)
        if time.time() - newest > ABANDONED_STAGING_S:
            log.warning("removing %s: a build's staging area untouched for %.0f hours (a killed job's)", folder,
                        (time.time() - newest) / 3600)
            shutil.rmtree(folder, ignore_errors=True)


# The build's results (written by the graph, read by the launcher or `finish`) --------------------


@dataclasses.dataclass(frozen=True)
class BuildResults:
    """What the pipeline hands to the commit: written as staging/results.json by its last step.

    Attributes:
      build_id: the build that wrote it.
      name, schema, seed, parameters, versions: what the manifest records of the build.
      max_reject_fraction: the budget of rejected inputs the commit enforces (download failures aside).
      max_download_failures: the budget of URLs that could not be downloaded (an append's: of the
        whole dataset).
      labels: the LabelMap as JSON ({names, offset, integer}).
      shards: every staged shard (dataset_files.ShardResult).
      num_rejected: errors.jsonl rows that count against a budget.
      num_download_failures: those of them whose URL could not be downloaded (stage 'download').
      num_skipped: errors.jsonl rows marked skipped (not images of a class).
      num_opted_out: errors.jsonl rows of stage opted_out (URLs whose site opted out): in no budget.
      failed_hosts: the hosts with the most URLs that failed or were opted out, by reason
        (hosts.HostRow); shown by the summary, not written into the manifest.
      near_groups: (near-duplicate groups in duplicates.jsonl, those of them across splits);
        shown by the summary, not written into the manifest.
      num_duplicate_groups: rows of duplicates.jsonl of files under two keys or more (-1: not looked for).
      num_leaking_groups: those spanning more than one split.
      num_label_conflicts: those whose members carry different labels.
      num_already_present: with --append, the listed inputs whose keys the dataset holds with the
        same content (duplicates.jsonl rows of one key): not written again.
      base: with --append, the manifest (JSON) of the published dataset this build adds to: the
        published manifest lists its shards, then this build's.
      version_name: the version folder asked for (--version_name); None: v-<build id>.
    """

    build_id: str
    name: str
    schema: str
    seed: int
    parameters: Mapping[str, Any]
    versions: Mapping[str, str]
    max_reject_fraction: float
    labels: Mapping[str, Any]
    shards: Sequence[dataset_files.ShardResult]
    num_rejected: int
    num_skipped: int
    num_duplicate_groups: int = -1
    num_leaking_groups: int = 0
    num_label_conflicts: int = 0
    num_already_present: int = 0
    base: Optional[Mapping[str, Any]] = None
    version_name: Optional[str] = None
    max_download_failures: float = PublishOptions.max_download_failures
    num_download_failures: int = 0
    num_opted_out: int = 0
    failed_hosts: Tuple[Tuple[str, int, Tuple[Tuple[str, int], ...]], ...] = ()
    near_groups: Tuple[int, int] = (0, 0)

    def to_json(self) -> Dict[str, Any]:
        d = dataclasses.asdict(self)
        d["shards"] = [s.to_json() for s in self.shards]
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "BuildResults":
        d = dict(d)
        d["shards"] = tuple(dataset_files.ShardResult.from_json(s) for s in d["shards"])
        if "failed_hosts" in d:
            d["failed_hosts"] = hosts.from_json(d["failed_hosts"])
        if "near_groups" in d:
            d["near_groups"] = tuple(d["near_groups"])
        return cls(**d)

    @property
    def num_written(self) -> int:
        return sum(s.count for s in self.shards)

    def verdict(self, output: str) -> None:
        """Raises BudgetExceeded when more inputs were rejected than the budgets allow: download
        failures against max_download_failures or max_reject_fraction, whichever is larger (an
        append's against the whole dataset), the other rejects against max_reject_fraction. The one
        place these rules live."""
        total = self.num_written + self.num_rejected
        if total == 0 and self.base is not None:
            raise BudgetExceeded(f"nothing to append: every input is already in {output}; the dataset is unchanged")
        if total == 0 and self.num_opted_out:
            raise BudgetExceeded(f"every one of the {self.num_opted_out} URLs was opted out by its site (robots.txt, "
                                 f"X-Robots-Tag, tdm-reservation; see {ERRORS}); nothing was published to {output}")
        if total == 0:
            raise BudgetExceeded(f"no image was found in the input ({self.num_skipped} entries skipped); "
                                 f"nothing was published to {output}; fix {setting('input')} and rerun the build with "
                                 f"{setting('overwrite')}")
        others = self.num_rejected - self.num_download_failures
        if others > self.max_reject_fraction * total:
            self._over(output, f"{others} of {total} inputs rejected", others / total, "max_reject_fraction",
                       self.max_reject_fraction, "fix or remove those inputs")
        # A retry by --append fetches only the URLs that failed: against those alone, a few still dead would
        # always be over; against the dataset they are what they are, a few of its links.
        whole = total + (Manifest.from_json(self.base, "base manifest").num_examples if self.base is not None else 0)
        # A dead link is a reject too: a build that allows more rejects allows it as many dead links.
        limit = max(self.max_download_failures, self.max_reject_fraction)
        if self.num_download_failures > limit * whole:
            counted = f" (with the dataset's {whole - total} records)" if self.base is not None else ""
            self._over(output, f"{self.num_download_failures} of {whole} inputs{counted} could not be downloaded",
                       self.num_download_failures / whole, "max_download_failures", limit, "fix or remove those URLs")

    def _over(self, output: str, what: str, fraction: float, budget: str, limit: float, remedy: str) -> None:
        # An append's rerun is another --append (the dataset stays as published); --overwrite would replace it.
        rerun = setting("append") if self.base is not None else setting("overwrite")
        raise BudgetExceeded(
            f"{what} ({100 * fraction:.2f}%), over the budget of {100 * limit:g}% ({setting(budget)}); reasons are in "
            f"{storage.join(staging.staging_dir(output, self.build_id), ERRORS)}; the dataset was not published; {remedy} "
            f"(or raise {setting(budget)}) and rerun the build with {rerun}")

    def manifest(self, created: Optional[str] = None) -> Manifest:
        """The manifest that publishes this build: its shards named inside its version folder."""
        return self.publication(created)[0]

    def publication(self, created: Optional[str] = None) -> Tuple[Manifest, Dict[str, str]]:
        """The manifest that publishes this build, and {file it lists: the file it comes from} where
        the two differ (an append's: appending.merged_manifest)."""
        folder = self.version_name or staging.version_folder(self.build_id)
        shards = [dataclasses.replace(r, shard=dataclasses.replace(
            r.shard, filename=f"{folder}/{r.shard.filename}",
            index_file=f"{folder}/{r.shard.index_file}" if r.shard.index_file else None)) for r in self.shards]
        own = dataclasses.replace(dataset_files.build_manifest(
            name=self.name, schema=self.schema, label_map=self.labels, seed=self.seed, parameters=self.parameters,
            shards=shards, num_rejected=self.num_rejected, num_skipped=self.num_skipped, versions=self.versions,
            created=created or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            num_duplicate_groups=self.num_duplicate_groups, num_leaking_groups=self.num_leaking_groups,
            num_label_conflicts=self.num_label_conflicts, num_already_present=self.num_already_present,
            num_opted_out=self.num_opted_out),
            version=folder)
        if self.base is None:
            return own, {}

        manifest, sources = appending.merged_manifest(self.base, own, self.build_id)
        return manifest, {k: v for k, v in sources.items() if k != v}


def _results_path(output: str, build_id: str) -> str:
    return storage.join(staging.staging_dir(output, build_id), RESULTS)


def results_staged(output: str, build_id: Optional[str] = None) -> bool:
    """Whether a build's engine finished into its staging area (its results.json is there); with
    build_id None, whether any staged build did."""
    ids = [build_id] if build_id else staging.staged_builds(output)
    return any(storage.exists(_results_path(output, i)) for i in ids)


def read_results(output: str, build_id: Optional[str] = None) -> Optional[BuildResults]:
    """The results of `build_id`, or (None) of the newest staged build that has them."""
    for i in [build_id] if build_id else reversed(staging.staged_builds(output)):
        path = _results_path(output, i)
        if storage.exists(path):
            try:
                results = BuildResults.from_json(json.loads(storage.read_bytes(path)))
                if results.build_id != i:  # its id names the folders the commit moves between
                    raise ValueError(f"it holds the results of build {results.build_id!r}, not of {i!r}")
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise _untrusted(output, path, e) from None
            return results
    return None


def _untrusted(output: str, path: str, e: BaseException) -> OutputError:
    """The one line for a staged file (results, commit record) that cannot be read or names paths
    outside the output."""
    reason = f"missing field {e.args[0]!r}" if isinstance(e, KeyError) else str(e)
    return OutputError(f"refusing to publish {output}: {path} is unreadable ({reason}); nothing was published; "
                       "rerun `imagerecords build ... --overwrite`")


def holds_only_reasons(output: str) -> bool:
    """Whether `output`'s staging area holds nothing but what a build over its budget leaves there
    (errors.jsonl, and duplicates.jsonl when it looked)."""
    root = staging.staging_root(output)
    prefix = root.rstrip("/").rstrip(os.sep) + ("/" if not storage.is_local(root) else os.sep)
    left = {path[len(prefix):].replace(os.sep, "/").split("/", 1)[-1] for path in storage.list_tree(root)}
    return ERRORS in left and left <= {ERRORS, DUPLICATES}


def verdict(output: str, results: BuildResults) -> None:
    """The budget verdict on a staged build (BuildResults.verdict); a failed one leaves only the
    reasons: errors.jsonl stays, the shards go, and an append with nothing new leaves no staging
    area for `verify` to call leftover and `finish` to call unfinished."""
    try:
        results.verdict(output)
    except BudgetExceeded:
        if results.base is not None and results.num_written + results.num_rejected == 0:
            staging.remove_staging(output, results.build_id)
            if storage.is_local(output):
                with contextlib.suppress(OSError):
                    os.rmdir(staging.staging_root(output))  # only if no other build staged there
        else:
            discard_staged_shards(output, results)
        raise


def discard_staged_shards(output: str, results: BuildResults) -> None:
    """Removes a failed build's staged shards and results; its errors.jsonl stays for the reasons."""
    staged_dir = staging.staging_dir(output, results.build_id)
    names = [n for r in results.shards for n in (r.filename, r.index_file, r.filename + staging.STAGED_RECORD,
                                                 *side_files.side_names(r.filename)) if n]
    storage.delete_quietly([storage.join(staged_dir, n) for n in names + [RESULTS]])


# The commit ------------------------------------------------------------------------------------


def _versions_in(output: str) -> List[str]:
    """The version folders in `output`, oldest first (their names start with the build's UTC time)."""
    if storage.is_local(output):
        try:
            return sorted(e.name for e in os.scandir(output) if e.is_dir() and e.name.startswith(VERSION_PREFIX))
        except FileNotFoundError:
            return []
    # Folders only (a delimited listing on gs://): the cost does not grow with the shards inside.
    return [name for name in storage.list_folder(output)[1] if name.startswith(VERSION_PREFIX)]


def published(output: str) -> Optional[Manifest]:
    """The manifest `output` publishes now, or None (none, or unreadable: a warning says so)."""
    path = storage.join(output, MANIFEST)
    if not storage.exists(path):
        return None
    try:
        return Manifest.loads(manifest_lib.read_bytes(path, storage.read_bytes, storage.size), path)
    except ValueError as e:
        log.warning("ignoring the unreadable previous manifest: %s", e)
        return None


def _kept_versions(published: Optional[Manifest], keep: int) -> Tuple[str, ...]:
    """The `keep` versions published most recently before this commit, newest first: the one the
    folder's manifest names, then those it kept (the order of publication, not of names or clocks)."""
    if keep < 1 or published is None:
        return ()
    chain = [published.version or FLAT_LAYOUT] + [v for v in published.previous_versions if v != published.version]
    return tuple(chain[:keep])


def _flat_files(output: str, name: str, published: Optional[Manifest]) -> List[str]:
    """Shard and index files lying directly in `output`: a dataset written before versions had
    folders (or a killed build of that time)."""
    names = set(published.shard_files()) if published is not None and not published.version else set()
    for entry in storage.list_names(output):
        if entry.startswith(f"{name}-") and is_shard_name(entry):
            names.add(entry)
        elif entry.startswith(f".{name}-") and entry.endswith(".tmp"):
            names.add(entry)
    return sorted(names)


def _make_parent(path: str) -> None:
    """Creates the local folder `path` goes in: a local rename, unlike a create, does not make it;
    object stores have no folders to make."""
    if storage.is_local(path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)


def _remove_empty_folders(output: str, names: Sequence[str]) -> None:
    """Removes the local sub-folders of `names` (such as index/) that are now empty."""
    if not storage.is_local(output):
        return
    for folder in sorted({os.path.dirname(n) for n in names if os.path.dirname(n)}, reverse=True):
        try:
            os.rmdir(os.path.join(output, folder))
        except OSError:  # not empty, or gone
            pass


def _reported_map(value: Any, what: str) -> Dict[str, str]:
    """The commit record's map of `what` (crc32c or identity) by file name, checked."""
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValueError(f"its {what} entry is not a map of file names to texts")
    return dict(value)


def _folders(manifest: Manifest) -> Tuple[str, ...]:
    """The version folders whose shards `manifest` lists (FLAT_LAYOUT for files directly in the folder)."""
    return tuple(sorted({f.split("/", 1)[0] if "/" in f else FLAT_LAYOUT for f in manifest.shard_files()
                         if not f.startswith("index/")})) or ((manifest.version,) if manifest.version else ())


def _listed_folders(manifest: Manifest, published: Optional[Manifest]) -> Dict[str, Tuple[str, ...]]:
    """{version: folders it lists} for the new version and those it keeps; {} when each lists only
    its own folder (every build without --append: its manifest keeps its bytes)."""
    listed = {manifest.version: _folders(manifest)}
    for version in manifest.previous_versions:
        if published is not None and version == (published.version or FLAT_LAYOUT):
            listed[version] = _folders(published)
        elif published is not None:
            listed[version] = tuple(published.listed_folders.get(version, (version,)))
    if all(folders in ((version,), ()) for version, folders in listed.items()):
        return {}
    return listed


def commit(output: str, results: Optional[BuildResults] = None, keep_versions: int = 2,
           keep_other_staging: bool = False) -> Manifest:
    """Publishes the staged build in `output`; redoes a commit that was cut short.

    Args:
      output: the output folder (its lock must be held by the caller).
      results: the staged build's results, already past the budget verdict; None to finish the
        commit recorded in staging (or, if none was recorded, to commit the newest staged results).
      keep_versions: published versions kept in `output`, this one included (at least 1): a reader
        that loaded an older manifest can read its files until they fall out of this count.
      keep_other_staging: remove only this build's staging (a pipeline's commit: other pipelines
        may be staging into `output` now); else every build's (the lock's holder owns the output).

    Returns:
      The published manifest.

    Raises:
      UnfinishedBuild: when staging holds nothing to commit, or a listed shard is neither staged
        nor in place.
      OutputError: when a staged file differs from what its writer reported.
      BudgetExceeded: when finishing a build whose results are over budget.
    """
    if keep_versions < 1:
        raise ValueError(f"keep_versions must be >= 1, got {keep_versions}")
    before = published(output)  # read once: the retention and the flat files both need it
    record = None if results is not None else _recorded(output)
    if record is None:
        if results is None:
            results = read_results(output)
            if results is None:
                raise UnfinishedBuild(f"nothing to finish in {output}: no complete build is staged in "
                                      f"{staging.staging_root(output)} (its pipeline did not finish); rerun "
                                      "`imagerecords build ... --overwrite`")
            verdict(output, results)
        record = _record(output, results, before, keep_versions)
    manifest, build_id = record.manifest, record.build_id
    _move(output, record)
    flat = _switch(output, manifest, build_id, before)
    _retain(output, manifest, build_id, before, flat, keep_other_staging)
    return manifest


@dataclasses.dataclass(frozen=True)
class _CommitRecord:
    """What a commit publishes, written to staging before its first move so that a cut commit is
    redone from it: the manifest, the build, and what the writers reported of each staged file."""

    manifest: Manifest
    build_id: str
    reported: Dict[str, str]
    identities: Dict[str, str]
    sources: Dict[str, str]


def _recorded(output: str) -> Optional[_CommitRecord]:
    """The commit recorded in staging by a commit that was cut short (the newest), or None."""
    for staged_id in reversed(staging.staged_builds(output)):
        path = storage.join(staging.staging_dir(output, staged_id), COMMIT)
        if storage.exists(path):
            try:
                record = json.loads(storage.read_bytes(path))
                manifest = Manifest.from_json(record["manifest"], COMMIT)
                build_id = record["build_id"]
                reported = _reported_map(record.get("crc32c") or {}, "crc32c")
                identities = _reported_map(record.get("identity") or {}, "identity")
                sources = _reported_map(record.get("sources") or {}, "sources")
                listed = set(manifest.shard_files())
                for final, origin in sources.items():
                    if final not in listed or inside_problem(origin) is not None:
                        raise ValueError(f"its sources entry {final!r}: {origin!r} is not a listed file "
                                         "and a file inside the dataset")
                # The record names the folders the commit moves into: its own build's only.
                if build_id != staged_id or (manifest.version != staging.version_folder(staged_id)
                                             and version_name_problem(manifest.version) is not None):
                    raise ValueError(f"it commits build {build_id!r} into {manifest.version!r}, not build "
                                     f"{staged_id!r} into {staging.version_folder(staged_id)!r} or a named version")
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise _untrusted(output, path, e) from None
            log.info("finishing the commit recorded in %s", path)
            return _CommitRecord(manifest, build_id, reported, identities, sources)
    return None


def _record(output: str, results: BuildResults, published: Optional[Manifest], keep_versions: int) -> _CommitRecord:
    """Step 1: the manifest this commit publishes, recorded in staging (from here on the commit can be redone)."""
    if results.version_name:
        check_version_free(output, results.version_name)
    manifest, sources = results.publication()
    manifest = dataclasses.replace(manifest, previous_versions=_kept_versions(published, keep_versions - 1))
    manifest = dataclasses.replace(manifest, listed_folders=_listed_folders(manifest, published))
    build_id = results.build_id
    # The writers name their files as staged; an append lists them under the whole folder's numbering.
    renamed = {origin: final for final, origin in sources.items()}
    crc32c = staged_check.reported_by_writers(results, manifest.version, "crc32c")
    reported = {renamed.get(k, k): v for k, v in crc32c.items()}
    identities = {renamed.get(k, k): v
                  for k, v in staged_check.reported_by_writers(results, manifest.version, "identity").items()}
    # A split of many shards goes into columns; its histograms into a side file, staged here
    # with the shards (the record below names it, so a redone commit moves it like a shard).
    manifest, columns_files = manifest.with_side_files(_columns_from())
    for filename, content in columns_files:
        side_path = storage.join(staging.staging_dir(output, build_id), filename[len(manifest.version) + 1:])
        storage.write_bytes(side_path, content)
    # From here on the commit can be redone from this record.
    record = {"manifest": manifest.to_json(), "build_id": build_id}
    if reported:
        record["crc32c"] = dict(sorted(reported.items()))
    if identities:
        record["identity"] = dict(sorted(identities.items()))
    if sources:
        record["sources"] = dict(sorted(sources.items()))
    storage.write_bytes(storage.join(staging.staging_dir(output, build_id), COMMIT), dumps(record))
    return _CommitRecord(manifest, build_id, reported, identities, sources)


def _move(output: str, record: _CommitRecord) -> None:
    """Step 2: every staged file checked against what its writer reported, then moved into the
    version folder (an append's earlier files linked in); no published manifest names it yet."""
    manifest, build_id, sources = record.manifest, record.build_id, record.sources
    reported, identities = record.reported, record.identities
    staged_dir = staging.staging_dir(output, build_id)
    folder = manifest.version
    # One listing of staging, not one existence request per shard (each is a round trip on gs://);
    # on gs:// it carries every object's size and crc32c, which the check below compares.
    on_gcs = staged_dir.startswith("gs://")
    metadata = storage.gcs_objects(staged_dir) if on_gcs else {}
    prefix = staged_dir.rstrip("/").rstrip(os.sep) + ("/" if not storage.is_local(staged_dir) else os.sep)
    in_staging = {path[len(prefix):].replace(os.sep, "/")
                  for path in (metadata if on_gcs else storage.list_tree(staged_dir))}
    own = folder + "/"
    listings: Dict[str, set] = {}

    def present(filename: str) -> bool:
        # One listing per version folder, not one existence request per file (a round trip each on gs://).
        top = filename.split("/", 1)[0]
        if top not in listings:
            root = storage.join(output, top)
            cut = len(root.rstrip("/").rstrip(os.sep)) + 1
            listings[top] = {f"{top}/{p[cut:].replace(os.sep, '/')}" for p in storage.list_tree(root)}
        return filename in listings[top]

    # An append's folder is whole: the earlier versions' files get second names in it (`links`).
    staged, links = {}, {}
    for filename in (*manifest.shard_files(), *manifest.side_files):
        origin = sources.get(filename, filename)
        if origin.startswith(own) and origin[len(own):] in in_staging:
            staged[filename] = storage.join(staged_dir, origin[len(own):])
        elif present(filename):
            continue  # a cut commit moved it
        elif not origin.startswith(own) and present(origin):
            links[filename] = origin
        else:
            raise UnfinishedBuild(f"cannot publish {output}: {origin} is neither staged nor in place; "
                                  "rerun `imagerecords build ... --overwrite`")
    if on_gcs and len(staged) < len(manifest.shard_files()) + len(manifest.side_files):  # a redone commit moved some
        metadata.update(storage.gcs_objects(storage.join(output, folder)))
    # First, every file is what its writer wrote: a late writer of another build cannot slip one in. The
    # earlier versions' files were checked when they were published; here only their sizes (local).
    earlier = {f for f, origin in sources.items() if not origin.startswith(own)}
    staged_check.check_staged(output, manifest, staged, reported, metadata, identities, earlier=earlier)
    staged_check.check_link_sizes(output, manifest, links)
    # The shards' keys and hashes files ride along (unlisted: --append checks each against its shard's
    # count and keys digest), also those of shards a cut commit already moved, so a redone commit
    # publishes every one.
    for filename in manifest.shard_files():
        origin = sources.get(filename, filename)
        origin_folder, _, origin_plain = origin.rpartition("/")
        if not filename.startswith(own) or not origin_folder:
            continue
        for keys, origin_keys in zip(side_files.side_names(filename[len(own):]),
                                     side_files.side_names(origin_plain)):
            if origin.startswith(own) and origin_keys in in_staging:
                staged[f"{own}{keys}"] = storage.join(staged_dir, origin_keys)
            elif not origin.startswith(own) and not present(f"{own}{keys}") and present(f"{origin_folder}/{origin_keys}"):
                links[f"{own}{keys}"] = f"{origin_folder}/{origin_keys}"
    # Then into the version folder, which no published manifest names yet: readers see nothing change.
    for i, (filename, path) in enumerate(sorted(staged.items())):
        final = storage.join(output, filename)
        _make_parent(final)
        storage.rename(path, final)
        if i == 0:
            phases.reached("in_commit")
    copied = 0
    for filename, origin in sorted(links.items()):
        final = storage.join(output, filename)
        _make_parent(final)
        copied += not storage.link(storage.join(output, origin), final)
    if copied:
        log.warning("%s has no hard links: %d files of the earlier versions were copied into %s to make it whole",
                    output, copied, folder)


def _switch(output: str, manifest: Manifest, build_id: str, published: Optional[Manifest]) -> List[str]:
    """Step 3: the reports and TFDS's metadata, then manifest.json: readers switch to the new
    version. Returns the flat files of a dataset written before version folders."""
    staged_dir = staging.staging_dir(output, build_id)
    for report in (ERRORS, DUPLICATES):
        staged_report, final_report = storage.join(staged_dir, report), storage.join(output, report)
        if storage.exists(staged_report):
            storage.rename(staged_report, final_report)
        elif report == ERRORS and not storage.exists(final_report):
            storage.write_bytes(final_report, b"")
        elif report == DUPLICATES and manifest.num_duplicate_groups < 0:
            storage.delete_quietly([final_report])  # this build did not look: an older report would mislead
    for filename, content in dataset_files.metadata_files(manifest):
        storage.write_bytes(storage.join(output, filename), content)
    flat = _flat_files(output, manifest.name, published)
    storage.write_bytes(storage.join(output, MANIFEST), manifest.dumps())
    return flat


def _retain(output: str, manifest: Manifest, build_id: str, published: Optional[Manifest], flat: List[str],
            keep_other_staging: bool) -> None:
    """Step 4: the versions the manifest keeps stay; the rest, and the staging, go."""
    folder = manifest.version
    # Every version folder the manifest does not keep goes (older ones, and any a cut commit left
    # unpublished), and the flat files unless they are kept.
    kept = set(manifest.previous_versions).union(*manifest.listed_folders.values())
    for old in sorted(set(_versions_in(output)) | _named_versions(output, published)):
        if old != folder and old not in kept:
            _delete_version(output, old)
    if flat and FLAT_LAYOUT not in kept:
        storage.delete_quietly([storage.join(output, n) for n in flat])
        _remove_empty_folders(output, flat)
    if keep_other_staging:
        staging.remove_staging(output, build_id)
        _remove_abandoned_staging(output)
        if not storage.list_tree(staging.staging_root(output)):
            staging.remove_staging(output)  # the root, when no other build stages there
    else:
        staging.remove_staging(output)


def _columns_from() -> int:
    """Shards per split from which the manifest holds the split as columns (COLUMNS_FROM);
    IMAGERECORDS_COLUMNS_FROM=N lowers it, to write (and try a reader on) the columnar form of a small build."""
    value = os.environ.get("IMAGERECORDS_COLUMNS_FROM")
    return int(value) if value else COLUMNS_FROM


def version_taken(output: str, name: str) -> bool:
    """Whether `output` holds anything under `name` (a file, a folder, or objects below it)."""
    path = storage.join(output, name)
    if storage.is_local(output):
        return os.path.lexists(path)
    return storage.exists(path) or bool(storage.list_tree(path))


def check_version_free(output: str, name: str) -> None:
    """Refuses a --version_name that `output` already holds: a published version is never rewritten.

    Raises:
      OutputError: naming the version.
    """
    if version_taken(output, name):
        raise OutputError(f"version {name!r} already exists in {output} (versions are never rewritten); "
                          f"choose another {setting('version_name')}; nothing was published")


def _named_versions(output: str, published: Optional[Manifest]) -> set:
    """The named (--version_name) versions the published manifest keeps: retention removes them
    like v- folders once they fall out of the count. Only a folder holding nothing but this
    dataset's shards and index files is taken: a manifest naming another folder never deletes it."""
    if published is None:
        return set()
    chain = [published.version, *published.previous_versions]
    out = set()
    for v in chain:
        if not v or v == FLAT_LAYOUT or v.startswith(VERSION_PREFIX) or version_name_problem(v) is not None:
            continue
        root = storage.join(output, v)
        prefix = root.rstrip("/").rstrip(os.sep) + ("/" if not storage.is_local(root) else os.sep)
        names = [p[len(prefix):].replace(os.sep, "/") for p in storage.list_tree(root)]
        if all((n.startswith(f"{published.name}-") and is_shard_name(n) and "/" not in n)
               or (n.startswith((f"{dataset_files.INDEX_DIR}/", f"{side_files.KEYS_DIR}/",
                                 f"{side_files.HASHES_DIR}/")) and n.count("/") == 1)
               or (n.endswith(SHARDS_SUFFIX) and "/" not in n)
               for n in names):
            out.add(v)
        else:
            log.warning("not removing %s: it holds files this dataset's builds do not write", root)
    return out


def _delete_version(output: str, folder: str) -> None:
    path = storage.join(output, folder)
    try:
        if storage.is_local(output):
            shutil.rmtree(path)
        else:
            storage.delete_all(storage.list_tree(path))
    except OSError as e:
        log.warning("could not remove the old version %s: %s", path, e)
