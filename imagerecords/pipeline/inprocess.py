"""The in-process engine: a local build's stages run in this process, on threads, without Beam.

A local build (local input and output, no Beam option on the command line) runs here by default:
it starts in well under a second where Beam's DirectRunner takes seconds (importing Beam alone is
~1.6 s), holds each reference once (about 0.5 KiB an image instead of DirectRunner's 4-6 KiB of
per-element buffering), and keeps every core busy to the last shard. `--runner DirectRunner`, or
any Beam option, runs the same build as a Beam pipeline (pipeline/graph.py) instead.

Both engines call the same stage functions (imagerecords/stages.py) and the same shard planning,
so their shards, index files, errors.jsonl and duplicates.jsonl are byte-identical (tested); only
the orchestration differs:

    list (class folders or manifest lines) → vocabulary → assign split and label id
    → per split: shuffle hashes → shard plan (planning.plan_shards) → refs grouped per shard
    → shards written concurrently, images prepared on a shared thread pool → results.json
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import threading
from typing import Dict, Iterator, List, Mapping, Optional, Tuple, Union

from imagerecords import planning, publish, shard_writer, sources, stages
from imagerecords import refs as refs_lib
from imagerecords.config import BuildConfig
from imagerecords.refs import ImageRef, LabelMap, Rejected

ShardKey = Tuple[str, int, int]


def _manifest_lines(path: str, csv: bool) -> Iterator[str]:
    """The manifest's lines as Beam's ReadFromText gives them: split at '\\n', one trailing '\\r'
    dropped, UTF-8, a CSV's header line skipped."""
    with open(path, "rb") as f:
        if csv:
            next(f, None)
        for raw in f:
            line = raw[:-1] if raw.endswith(b"\n") else raw
            if line.endswith(b"\r"):
                line = line[:-1]
            yield line.decode("utf-8")


def list_inputs(config: BuildConfig, csv_header: Optional[str]) -> Iterator[Union[ImageRef, Rejected]]:
    """Every listed input as a ref, or as a row saying why it cannot be one (ListImages, ReadManifest)."""
    max_bytes = config.image.max_file_bytes
    if refs_lib.is_manifest(config.input):
        columns = refs_lib.ManifestColumns(config.path_column, config.label_column, config.split_column,
                                           config.key_column, config.size_column)
        parse = refs_lib.csv_row_parser(csv_header) if csv_header is not None else refs_lib.parse_jsonl_line
        for line in _manifest_lines(config.input, csv_header is not None):
            out = stages.manifest_row(line, parse, config.input, columns, max_bytes, stat=not config.skip_stat)
            if out is not None:
                yield out
        return
    root = config.input.rstrip("/") or "/"
    for item in sources.list_root(root):
        if isinstance(item, Rejected):
            yield item
        else:
            yield from sources.walk_class_folder(root, item, max_bytes)


class _Shards:
    """Refs grouped per planned shard, each shard's list handed out once (and then forgotten)."""

    def __init__(self):
        self.plans: Dict[str, planning.ShardPlan] = {}
        self._members: Dict[ShardKey, List[Tuple[int, ImageRef]]] = {}

    def add_split(self, plan: planning.ShardPlan, hashed: List[Tuple[int, ImageRef]]) -> None:
        self.plans[plan.split] = plan
        groups: List[List[Tuple[int, ImageRef]]] = [[] for _ in range(plan.num_shards)]
        for h, ref in hashed:
            groups[plan.shard_of(h)].append((h, ref))
        for i, members in enumerate(groups):
            self._members[(plan.split, i, plan.num_shards)] = members

    def keys(self) -> List[ShardKey]:
        return sorted(self._members)

    def take(self, key: ShardKey) -> List[ImageRef]:
        return stages.shard_order(self._members.pop(key))


def plan(config: BuildConfig, refs: List[ImageRef]) -> _Shards:
    """Cuts each split into shards exactly as GlobalShuffle does. Empties `refs` as it goes."""
    by_split: Dict[str, List[Tuple[int, ImageRef]]] = collections.defaultdict(list)
    num_bytes: Dict[str, int] = collections.Counter()
    while refs:
        ref = refs.pop()
        by_split[ref.split].append((refs_lib.shuffle_hash(config.seed, ref.key), ref))
        num_bytes[ref.split] += max(ref.size, 0)
    shards = _Shards()
    for split in sorted(by_split):
        hashed = by_split.pop(split)
        n = planning.choose_num_shards(len(hashed), num_bytes[split], config.num_shards, config.target_shard_mb,
                                       config.min_shards)
        shards.add_split(planning.plan_shards(split, [h for h, _ in hashed], num_bytes[split], n), hashed)
    return shards


def default_workers() -> int:
    return os.cpu_count() or 1


def build(config: BuildConfig, *, build_id: str, versions: Mapping[str, str], label_map: Optional[LabelMap],
          csv_header: Optional[str], progress_dir: Optional[str], workers: Optional[int] = None
          ) -> publish.BuildResults:
    """Runs the whole build into `config.output`'s staging area and writes staging/results.json,
    as build_pipeline's graph does. Nothing is published here (see imagerecords.publish).

    Args:
      workers: shards written at once (default: one per core); images are prepared on a shared
        pool of max(workers, config.threads) threads, since decoding, encoding and hashing release
        the GIL.
    """
    rejected: List[Rejected] = []
    listed: List[ImageRef] = []
    for item in list_inputs(config, csv_header):
        (rejected if isinstance(item, Rejected) else listed).append(item)
    if label_map is None:
        label_map = refs_lib.vocabulary(sorted({r.label for r in listed}), config.label_type, config.label_offset)
    refs: List[ImageRef] = []
    splits = tuple(config.splits) if config.splits else None
    for ref in listed:
        out = stages.assign(ref, label_map, splits, config.split_seed)
        (rejected if isinstance(out, Rejected) else refs).append(out)
    del listed
    shards = plan(config, refs)
    if progress_dir:
        for p in shards.plans.values():
            stages.report_plan(p, progress_dir)

    workers = workers or default_workers()
    threads = max(workers, config.threads)
    cancelled = threading.Event()
    read = shard_writer.limited_reader(config.image)
    contents: Dict[bytes, Union[Tuple[str, str, str], List[Tuple[str, str, str]]]] = {}
    results = []
    find_duplicates = not config.skip_duplicate_check
    images = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="imagerecords-image")
    writers = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="imagerecords-shard")

    def write(key: ShardKey) -> stages.StagedShard:
        return stages.stage_shard(
            key, shards.take(key), output=config.output, name=config.name, preset=config.schema, labels=label_map,
            options=config.image, read_bytes=read, executor=images, window=2 * threads,
            write_index=config.write_index, progress_dir=progress_dir, contents=find_duplicates,
            cancelled=cancelled.is_set)

    try:
        futures = [writers.submit(write, key) for key in shards.keys()]
        for future in concurrent.futures.as_completed(futures):
            staged = future.result()
            results.append(staged.result)
            rejected.extend(staged.rejected)
            for digest, ref in staged.contents:
                member = (ref.key, ref.split, ref.uri)
                seen = contents.setdefault(digest, member)
                if seen is not member:  # a second file with these bytes: keep the whole group
                    contents[digest] = (seen if isinstance(seen, list) else [seen]) + [member]
    except BaseException:
        cancelled.set()  # running shards stop at their next image; queued ones never start
        writers.shutdown(wait=True, cancel_futures=True)
        images.shutdown(wait=True, cancel_futures=True)
        raise
    writers.shutdown()
    images.shutdown()
    groups = []
    for digest, members in contents.items():
        if isinstance(members, list):
            group = stages.duplicate_group(digest, members)
            if group is not None:
                groups.append(group)
    return stages.record_results(
        results, rejected, label_map, groups, output=config.output, find_duplicates=find_duplicates,
        build=dict(build_id=build_id, name=config.name, schema=config.schema, seed=config.seed,
                   parameters=config.to_json(), versions=dict(versions),
                   max_reject_fraction=config.max_reject_fraction))
