"""The local engine: a local build's stages run on this machine without Beam.

A local build (local input and output, no Beam option on the command line) runs here by default:
it never imports Beam, holds each reference once (no per-element buffering), and writes shards
in one worker process per core, so the Python parts of each image (container parsing, the
Example, framing) do not queue for one interpreter's GIL (figures: README, Benchmarks).
`--runner DirectRunner`, or any Beam option, runs the same build as a Beam pipeline
(engines/beam/graph.py) instead.

Both engines call the same stage functions (pipeline/plan/assign.py, write/shard_writer.py,
publish/results.py) and the same shard planning, so their shards, index files, errors.jsonl and
duplicates.jsonl are byte-identical (tested); only the orchestration differs:

    list (class folders one per task, manifest byte ranges; each ref with its shuffle hash)
    → vocabulary → assign split and label id
    → one plan (plan/columns.py): each split's shard count and boundaries from the inputs'
      hash, split and size columns, each shard the positions of its inputs in hash order
    → shards sorted and written concurrently (worker processes, or threads here for small
      inputs), images of a shard prepared on a small thread pool → results.json

With worker processes the listing runs in them too; the launcher only gathers, assigns, plans
and records. Inputs reach the plan as a table of either kind: refs (columns.RefTable, every
input kind), or an arrays build's rows (array_rows.applies), which are listed and assigned as
NumPy columns with no ref per row (array_rows.RowTable): each of its shards' writer gets the row
indices (array_rows.RowShard) and sends back its content digests in one piece (array_rows.RowContents).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import gc
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
from typing import Callable, Dict, Iterator, List, Optional, Tuple, Union

from imagerecords.pipeline import processes, sources
from imagerecords.pipeline.config import BuildConfig
from imagerecords.pipeline.plan import array_rows, columns, near
from imagerecords.pipeline.publish import appending
from imagerecords.pipeline.publish.build import Build
from imagerecords.pipeline.plan import assign as assign_lib
from imagerecords.pipeline import refs as refs_lib
from imagerecords.pipeline.plan import shard_plan as planning
from imagerecords.pipeline.refs import DuplicateGroup, ImageRef, LabelMap, Rejected
from imagerecords.pipeline.publish import commit as publish
from imagerecords.pipeline.publish import results as results_lib
from imagerecords.pipeline.read import array_files as arrays
from imagerecords.pipeline.write import shard_writer

ShardKey = columns.ShardKey


# (shuffle hash, ref), or (0, row) for an input that is not a ref: the launcher keeps a ref's pair
# as it comes, the pair the shard plan and the writers take.
Listed = Tuple[int, Union[ImageRef, Rejected]]


def _list_part(source: sources.Source, config: BuildConfig, info: sources.InputInfo, part) -> List[Listed]:
    """One listing task (Source.list_part): each ref comes with its shuffle hash (a function of the
    key alone), so the launcher does not compute them all."""
    seed = config.split.seed
    return [(0 if isinstance(item, Rejected) else refs_lib.shuffle_hash(seed, item.key), item)
            for item in source.list_part(config, info, part)]


def list_inputs(config: BuildConfig, info: Optional[sources.InputInfo], pool=None, workers: int = 0
                ) -> Iterator[Listed]:
    """Every listed input as a ref, or as a row saying why it cannot be one, as (shuffle hash, ref)
    or (0, row): the source's parts listed here, or shared by a process pool's workers (class
    folders one per task, a manifest in byte ranges). Results come back in the serial order, so
    both ways list the same rows in the same order.
    """
    source = sources.of(config.input)
    info = info if info is not None else sources.InputInfo(source.kind)  # the checks learned nothing it needs
    parts = source.parts(config, info, workers if pool is not None else 0)
    if pool is None:
        for part in parts:
            yield from _list_part(source, config, info, part)
        return
    tasks = [pool.submit(_list_part, source, config, info, part) for part in parts]
    for task in tasks:
        yield from task.result()


class _Shards:
    """The build's plan (columns.plan over its table): each shard's members made from its positions
    when it is handed out, once."""

    def __init__(self, table: columns.Table, shards):
        self._table = table
        self.plans, self._positions = columns.plan(table.columns(), shards)

    def keys(self) -> List[ShardKey]:
        return sorted(self._positions)

    def take(self, key: ShardKey) -> Union[columns.RefShard, array_rows.RowShard]:
        """The shard's refs with their shuffle hashes (its writer sorts them: assign_lib.shard_order),
        or an arrays build's RowShard."""
        return self._table.members(key, self._positions.pop(key))


def plan(config: BuildConfig, refs: List[Tuple[int, ImageRef]]) -> _Shards:
    """Cuts each split into shards exactly as GlobalShuffle does, from (shuffle hash, ref) pairs.
    Takes over `refs` (columns.RefTable)."""
    return _Shards(columns.RefTable(refs), config.shards)


Member = Tuple[str, str, str, str]  # (key, split, uri, label name) of a written image


class _Contents:
    """Each written image's (key, split, uri, label name) by its content digest, for the duplicate check.

    A digest seen once keeps its member bare; a digest seen again gets a list, appended to in
    place, so one file under 100,000 keys (a scraped dataset's placeholder image) stays linear.
    """

    def __init__(self):
        self._by_digest: Dict[bytes, Union[Member, List[Member]]] = {}

    def add(self, digest: bytes, member: Member) -> None:
        seen = self._by_digest.setdefault(digest, member)
        if seen is member:
            return
        if isinstance(seen, list):
            seen.append(member)
        else:
            self._by_digest[digest] = [seen, member]

    def groups(self) -> List[DuplicateGroup]:
        """The DuplicateGroup of every digest held by more than one key, in first-seen order."""
        found = []
        for digest, members in self._by_digest.items():
            if isinstance(members, list):
                group = refs_lib.duplicate_group(digest, members)
                if group is not None:
                    found.append(group)
        return found


# Below this many images, worker processes cost more to start than they save.
PROCESS_MIN_IMAGES = 256
# Image threads per worker process: one prepares an image while another parses or writes (4 ran
# 1.02x slower on 4,000 photos). A source that downloads gets --threads instead (Source.downloads).
THREADS_PER_PROCESS = 2


def _auto_workers() -> int:
    """Worker processes an input of PROCESS_MIN_IMAGES or more gets: one per core, where forking is
    available and there is more than one core; otherwise 0 (threads in this process)."""
    cores = os.cpu_count() or 1
    return cores if cores > 1 and processes.fork_available() else 0


class _Progress:
    """The local engine's side of the progress line: each shard's {done, rejected, total} and each
    split's image count as small JSON files in `folder`, which the launcher sums once a second;
    raises KeyboardInterrupt in a shard writer once the build is cancelled."""

    def __init__(self, folder: Optional[str], cancelled):
        self._folder = folder
        self._cancelled = self.cancelled = cancelled
        self._last: Dict[str, float] = {}

    def __call__(self, filename: str, done: int, rejected: int, total: int) -> None:
        if self._cancelled():
            raise KeyboardInterrupt(f"cancelled while writing {filename}")
        now = time.monotonic()
        if self._folder is None or (done < total and now - self._last.get(filename, 0.0) < 0.5):
            return
        self._last[filename] = now
        self._write(filename + ".json", {"done": done, "rejected": rejected, "total": total})

    def plan(self, plan: planning.ShardPlan) -> None:
        if self._folder is not None:
            self._write(f"plan-{plan.split}.plan", {"split": plan.split, "count": plan.count,
                                                    "num_shards": plan.num_shards})

    def _write(self, name: str, data: dict) -> None:
        path = os.path.join(self._folder, name)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)


class _Writer:
    """Writes shards with the build's ShardWriter: one per process, or one shared by this process's
    shard threads (which then share its image threads)."""

    def __init__(self, writer: shard_writer.ShardWriter, threads: int, progress: _Progress):
        self._writer = writer
        self._threads = threads
        self._progress = progress
        self._read = writer.reader()
        if hasattr(self._read, "stop_when"):  # a manifest's reader: it may be downloading when the build is cancelled
            self._read.stop_when(progress.cancelled)
        self._images = (concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="imagerecords-image")
                        if threads > 1 else None)

    def __call__(self, key: ShardKey, members: Union[columns.RefShard, array_rows.RowShard],
                 labels: LabelMap) -> shard_writer.StagedShard:
        rows = isinstance(members, array_rows.RowShard)
        # A row shard is written from its columns (row_writer), its contents already compact.
        ordered = members if rows else assign_lib.shard_order(members.pairs())
        staged = self._writer.write(key, ordered, labels, read_bytes=self._read,
                                    executor=self._images, window=2 * self._threads, observe=self._progress)
        if rows:  # a shard reused by --resume comes back as (digest, member) pairs
            staged.contents = array_rows.RowContents.of(staged.contents, members)
        return staged

    def stop(self) -> None:
        """The build is cancelled: the downloads in flight are cut now (not at the reader's next look)."""
        if hasattr(self._read, "stop"):
            self._read.stop()

    def close(self) -> None:
        if self._images is not None:
            self._images.shutdown(wait=True, cancel_futures=True)


_WORKER: Dict[str, _Writer] = {}


def _start_worker(writer: shard_writer.ShardWriter, progress_dir: Optional[str], cancel, launcher: int,
                  threads: int) -> None:
    # Ctrl-C (or a SIGTERM/SIGHUP to the group) reaches every process; the launcher answers it by
    # setting `cancel`, which stops each shard at its next image and cleans its temporary file.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    _die_with_launcher(launcher)
    _WORKER["writer"] = _Writer(writer, threads, _Progress(progress_dir, cancel.is_set))


def _die_with_launcher(launcher: int) -> None:
    """Linux: the kernel kills this worker when its launcher dies without cleaning up (SIGKILL, the
    OOM killer), so no orphan keeps writing."""
    if not sys.platform.startswith("linux"):
        return

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != launcher:  # it died before the line above took effect
        os._exit(1)


# After a cancel, how long shard writers get to stop at their next image before they are killed.
STOP_GRACE_S = 2.0


def end_workers(pool) -> None:
    """Stops a process pool now: queued shards never start, running ones get STOP_GRACE_S to stop
    at their next image (the cancel event is set), then every worker left is killed."""
    # shutdown(wait=False) forgets the pool's manager thread; joined below, so it is gone before the
    # interpreter exits (CPython 3.11's exit hook races a manager thread still closing its wakeup pipe).
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + STOP_GRACE_S
    for child in multiprocessing.active_children():
        child.join(max(0.0, deadline - time.monotonic()))
    for child in multiprocessing.active_children():
        child.kill()
        child.join(5)
    if manager is not None:
        manager.join(5)


def _write_in_worker(key: ShardKey, members: Union[columns.RefShard, array_rows.RowShard],
                     labels: LabelMap) -> shard_writer.StagedShard:
    if not isinstance(members, array_rows.RowShard):
        return _WORKER["writer"](key, members, labels)
    # A row shard's per-row objects (refs, contents, keys lines) form no cycles, and the collector's
    # passes over them while they are built cost about a tenth of the shard's CPU. A worker writes
    # one shard at a time, so its collector is paused and restored here without a race.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _WORKER["writer"](key, members, labels)
    finally:
        if enabled:
            gc.enable()


def _fork_workers(workers: int, writer: shard_writer.ShardWriter, progress_dir: Optional[str],
                  threads: int = THREADS_PER_PROCESS):
    """Starts `workers` forked worker processes now, before the build lists anything: a worker
    forked later would share the launcher's pages holding every ref, and each page the launcher
    then touches (a refcount, while pickling a shard's refs) would be copied, once per worker
    (README, Scale). Forking is cheap (no new interpreter, nothing imported again), so it is done
    even if the input turns out too small to use them. Elsewhere than Linux workers are spawned (the caller needs a
    `__main__` guard)."""
    ctx = processes.worker_context()
    cancel = ctx.Event()
    pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_start_worker,
                                                  initargs=(writer, progress_dir, cancel, os.getpid(), threads))
    # A worker must never run a destructor it inherited: a caller's garbage (a finished tf.data
    # iterator, in a notebook or a test process) waits in its destructor for threads that fork did
    # not copy, and the worker hangs in its first garbage collection. So the caller's garbage goes
    # here, where its threads live, and what the workers inherit is frozen out of their collector.
    enabled = gc.isenabled()
    gc.disable()  # no collection starts in another thread from here to the fork
    try:
        _collect_fully()
        gc.freeze()
        try:
            pool.submit(os.getpid).result()  # a fork context starts every worker at the first submit
        finally:
            gc.unfreeze()
    finally:
        if enabled:
            gc.enable()
    return pool, cancel


def _collect_fully(pause: Callable[[float], None] = time.sleep) -> None:
    """A full collection that surely ran here. gc.collect() returns at once, collecting nothing,
    while another thread's collection is under way (CPython); the garbage it missed would then be
    frozen into the workers and its destructors never run. With automatic collections off (the
    caller), wait until a full collection completes during our call, then run one more: it cannot
    be skipped, since no other can have started."""
    full = lambda: gc.get_stats()[2]["collections"]  # noqa: E731 (completed full collections)
    for _ in range(1000):
        before = full()
        gc.collect()
        if full() > before:
            break
        pause(0.001)
    gc.collect()


def run(build: Build, *, input_info: sources.InputInfo, progress_dir: Optional[str], workers: Optional[int] = None
        ) -> Tuple[publish.BuildResults, int]:
    """Runs the whole build into its output's staging area and writes staging/results.json,
    as build_pipeline's graph does. Nothing is published here (see imagerecords.pipeline.publish.commit).

    Args:
      workers: worker processes writing shards (0: threads in this process); None: one per core
        (_auto_workers) for PROCESS_MIN_IMAGES images or more, threads below.

    Returns:
      The results written, and the worker processes used.
    """
    config = build.config
    asked = workers is not None  # before `workers` names the pool's processes below
    forked = workers if asked else _auto_workers()
    source = sources.for_build(config)
    source.prepare(config)  # before the fork: what the workers share
    writer = shard_writer.ShardWriter.of(config, build.build_id, source)
    # Each worker writes one shard at a time: a download waits on the network, not on this machine's cores.
    threads = max(THREADS_PER_PROCESS, config.threads) if source.downloads(config, input_info) else THREADS_PER_PROCESS
    pool, cancel = _fork_workers(forked, writer, progress_dir, threads) if forked else (None, None)
    workers = list(getattr(pool, "_processes", {}).values())  # the pool forgets a dead worker
    try:
        return _build(build, writer, pool, cancel, forked, input_info=input_info, progress_dir=progress_dir,
                      asked=asked)
    except BaseException as e:
        if pool is not None:
            if isinstance(e, concurrent.futures.BrokenExecutor):
                # Before end_workers kills the survivors: which worker died, and how, for the one-line error.
                e.worker_exits = [(p.pid, p.exitcode) for p in workers if p.exitcode is not None]
            cancel.set()
            end_workers(pool)
        raise
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _list_refs(config: BuildConfig, input_info: sources.InputInfo, process_pool, forked: int,
               label_map: Optional[LabelMap], base: Optional[appending.Base]
               ) -> Tuple[List[Rejected], LabelMap, columns.RefTable, List[DuplicateGroup]]:
    """Lists, labels and assigns a build ref by ref (with --append, against `base`, the published
    dataset): (rejected rows, label map, the refs to plan, known duplicate groups (an append's))."""
    rejected: List[Rejected] = []
    refs: List[Tuple[int, ImageRef]] = []
    for pair in list_inputs(config, input_info, process_pool, forked):
        if isinstance(pair[1], Rejected):
            rejected.append(pair[1])
        else:
            refs.append(pair)
    known: List[DuplicateGroup] = []
    if base is not None:
        refs, known = _against(config, base, refs, rejected)
    if base is not None:
        label_map = appending.grow_labels(base.labels, {r.label for _, r in refs}, label_map)
    elif label_map is None:
        label_map = refs_lib.vocabulary(sorted({r.label for _, r in refs}), sources.of(config.input).label_type(config),
                                        config.labels.label_offset)
    if any(f.dtype == "class_list" for f in config.features):
        pairs = [pair for _, r in refs for pair in refs_lib.list_names(r.extras, config.features)]
        label_map = (appending.grow_lists(label_map, config.features, pairs) if base is not None
                     else refs_lib.with_lists(label_map, config.features, pairs))
    # Assigned in place: each listed ref is freed as its assigned one takes its slot (no ref held twice).
    splits = tuple(config.split.splits) if config.split.splits else None
    kept = 0
    for h, ref in refs:
        out = assign_lib.assign(ref, label_map, splits, config.split.split_seed)
        if isinstance(out, Rejected):
            rejected.append(out)
        else:
            refs[kept] = (h, out)
            kept += 1
    del refs[kept:]
    return rejected, label_map, columns.RefTable(refs), known


def _list_rows(config: BuildConfig, label_map: Optional[LabelMap], pool=None
               ) -> Tuple[List[Rejected], LabelMap, array_rows.RowTable, array_rows.Contents]:
    """_list_refs for an arrays build (array_rows.applies), on NumPy columns: (rejected rows, label
    map, the rows to plan, the duplicate check of their records); the rows' key hashes are shared by
    `pool`'s workers when there is one."""
    arrays.forget_if_changed(config.input)
    n = arrays.opened(config.input, config.schema, config.image.image_encoding)[1]
    # Started before the listing: a row's key hashes need only its number.
    shuffled = array_rows.RowHashes(refs_lib.shuffle_salt(config.split.seed), config.input, n, pool)
    split = array_rows.RowHashes(refs_lib.split_salt(config.split.split_seed), config.input, n, pool) if config.split.splits else None
    listed = array_rows.list_rows(config.input, config.schema, config.image.image_encoding)
    if label_map is None:
        label_map = refs_lib.vocabulary(listed.texts, sources.of(config.input).label_type(config), config.labels.label_offset)
    assigned = array_rows.assign(listed, label_map, tuple(config.split.splits) if config.split.splits else None,
                                 config.split.split_seed, config.split.seed, pool, shuffled, split)
    return (listed.rejected + assigned.rejected, label_map, array_rows.RowTable(assigned, config.input, listed.row_bytes),
            array_rows.Contents(config.input, assigned, label_map))


def _build(build: Build, writer: shard_writer.ShardWriter, process_pool, process_cancel, forked: int, *,
           input_info: sources.InputInfo, progress_dir: Optional[str], asked: bool) -> Tuple[publish.BuildResults, int]:
    config, base = build.config, build.base
    table: columns.Table
    if array_rows.applies(config):
        rejected, label_map, table, contents = _list_rows(config, build.label_map, process_pool)
        known = []
    else:
        rejected, label_map, table, known = _list_refs(config, input_info, process_pool, forked, build.label_map, base)
        contents = _Contents()
    count = len(table)
    shards = _Shards(table, config.shards)  # one plan, whichever way the inputs were listed
    del table
    workers = forked if asked or count >= PROCESS_MIN_IMAGES else 0
    planned = _Progress(progress_dir, lambda: False)
    for p in shards.plans.values():
        planned.plan(p)

    local_writer = None
    if workers:
        pool, write, cancel = process_pool, _write_in_worker, process_cancel
    else:
        cancel = threading.Event()
        cores = os.cpu_count() or 1
        # Threads: one shard writer per core, sharing one pool of image threads.
        local_writer = _Writer(writer, max(cores, config.threads), _Progress(progress_dir, cancel.is_set))
        pool = concurrent.futures.ThreadPoolExecutor(cores, thread_name_prefix="imagerecords-shard")
        write = local_writer
    results = []
    hashed: List[near.Item] = []
    try:
        futures = [pool.submit(write, key, shards.take(key), label_map) for key in shards.keys()]
        for future in concurrent.futures.as_completed(futures):
            staged = future.result()
            results.append(staged.result)
            rejected.extend(staged.rejected)
            hashed.extend(staged.near)
            if isinstance(contents, array_rows.Contents):
                contents.add(staged.contents)
            else:
                for digest, member in staged.contents:
                    contents.add(digest, member)
    except BaseException:
        cancel.set()  # running shards stop at their next image; queued ones never start
        if local_writer is not None:
            local_writer.stop()
        if workers:
            end_workers(pool)
        else:
            pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        if local_writer is not None:
            local_writer.close()
            pool.shutdown()
    groups = contents.groups() + known
    del contents
    near_groups = None
    if writer.near:
        if base is not None:  # the dataset's records, from its hashes files: compared with this build's
            hashed.extend(appending.near_items(config.output, base.manifest))
        near_groups = near.groups(near.find_pairs(hashed))
    del hashed
    results_written = results_lib.record_results(
        results, rejected, label_map, groups, output=config.output,
        find_duplicates=not config.publish.skip_duplicate_check or config.publish.append, near=near_groups,
        build=build.header())
    return results_written, workers


def _against(config: BuildConfig, base, refs: List[Tuple[int, ImageRef]], rejected: List[Rejected]
             ) -> Tuple[List[Tuple[int, ImageRef]], List[DuplicateGroup]]:
    """The refs whose keys the published dataset does not hold; the others become duplicates.jsonl
    rows (same content) or errors.jsonl rows (changed), as appending.against says."""
    read = sources.for_build(config).reader(config.image)
    splits = tuple(config.split.splits) if config.split.splits else None
    kept, known = [], []
    for h, ref in refs:
        out = appending.against(ref, base, read, config.image, splits, config.split.split_seed)
        if isinstance(out, ImageRef):
            kept.append((h, out))
        elif isinstance(out, Rejected):
            rejected.append(out)
        else:
            known.append(out)
    return kept, known


class LocalEngine:
    """The local engine as the launcher runs it (see imagerecords.builder.engines.Engine)."""

    reports_progress = True

    def __init__(self, config: BuildConfig, workers: Optional[int] = None):
        self.config = config
        self.workers = workers
        self.description = "local engine"

    def name_job(self, build_id: str) -> None:
        pass

    def run(self, build: Build, *, input_info: sources.InputInfo, progress_dir: Optional[str]) -> None:
        _, used = run(build, input_info=input_info, progress_dir=progress_dir, workers=self.workers)
        self.description = f"local engine, {used} worker processes" if used else "local engine, in-process"

    def stop(self) -> None:
        pass  # build() ends its workers itself, on any way out

    def handoff(self, lock) -> Optional[str]:
        return None
