"""A DataLoader that knows how much of the epoch it delivered, and resumes from that count."""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

import torch

from imagerecords.torch.dataset import RecordDataset
from imagerecords.torch.order import GlobalBatchSampler
from imagerecords.format.errors import ReadError

_OURS = ("sampler", "batch_sampler", "drop_last")


class Loader(torch.utils.data.DataLoader):
    """torch.utils.data.DataLoader over a RecordDataset, reading this rank's share of each epoch's
    global order (imagerecords.torch.order) with any number of workers.

    State follows torchdata's StatefulDataLoader: `state_dict()` after any batch, and
    `load_state_dict(state)` on a new loader before iterating it. The state counts what was
    delivered to the training loop (not what workers prefetched), over all ranks:
    {"seed", "epoch", "consumed", "num_examples", "dataset"} (dataset: RecordDataset.digest, so a
    state is refused on a rebuilt dataset), under a kilobyte, the same on every rank (save rank 0's). Loaded on the same world size and batch size it gives exactly the remaining
    batches; on another one, the epoch's unconsumed examples, each once, disjoint over ranks.

    One `for` over the loader is the rest of the current epoch; the next epoch starts when the
    last batch is delivered (or set it with `set_epoch`, as with DistributedSampler).

    Args:
      dataset: the RecordDataset.
      batch_size: per-rank batch size.
      seed: shuffle and augmentation seed.
      shuffle: False reads the split in order (evaluation).
      rank, world_size: this rank and the number of ranks; None takes torch.distributed's (or 0, 1).
      remainder: "drop" (default) or "pad" (every record once; padding has label PAD_LABEL).
      **kwargs: DataLoader's own (num_workers, pin_memory, persistent_workers, collate_fn, ...).

    Raises:
      ValueError: for the DataLoader arguments this loader sets itself, or bad sampler arguments.
    """

    def __init__(self, dataset: RecordDataset, batch_size: int, *, seed: int = 0, shuffle: bool = True,
                 rank: Optional[int] = None, world_size: Optional[int] = None, remainder: str = "drop", **kwargs):
        taken = sorted(set(kwargs) & set(_OURS))
        if taken:
            raise ReadError(f"Loader sets {', '.join(taken)} itself (batch_size is per rank; the order is "
                            "imagerecords.torch.order's)")
        sampler = GlobalBatchSampler(len(dataset), batch_size, seed=seed, shuffle=shuffle, rank=rank,
                                     world_size=world_size, remainder=remainder, dataset=dataset.digest)
        super().__init__(dataset, batch_sampler=sampler, **kwargs)

    @property
    def order(self) -> GlobalBatchSampler:
        return self.batch_sampler

    def __iter__(self) -> Iterator[Any]:
        order = self.batch_sampler
        for batch in super().__iter__():
            order.advance()  # before the hand-over: a state saved now includes this batch
            yield batch

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)

    def state_dict(self) -> Dict[str, Any]:
        return self.batch_sampler.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.batch_sampler.load_state_dict(state)
