"""The global order of an epoch and each rank's batches of it; the resumable state is three numbers.

Epoch `e` reads the split in one permutation of all its records, drawn from (seed, e). Global step
`k` takes the next `batch_size * world_size` positions of that permutation; rank `r` gets the
`batch_size` of them starting at `r * batch_size`. So after `s` steps the ranks have consumed
exactly the first `s * batch_size * world_size` positions, on any number of DataLoader workers,
and that count (with seed and epoch) is all a resume needs: on the same world size it gives the
same remaining batches; on another one the unconsumed positions are dealt out the same way, each
once.

Remainder (the tail shorter than one global batch), as in imagerecords.reader.hosts:
- "drop" (training): not read this epoch; the permutation changes each epoch, so neither do they.
- "pad" (evaluation): read, and the global batch is filled with padding positions past the end
  (label PAD_LABEL, all-zero image), so every record is read exactly once and every rank gets the
  same number of batches.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Tuple

import numpy as np

from imagerecords.format.errors import ReadError

REMAINDER_POLICIES = ("drop", "pad")
PAD_LABEL = -1  # the label of a padding element (the tf.data reader's PAD_LABEL too)
_STATE_KEYS = ("seed", "epoch", "consumed", "num_examples", "dataset")


def _count_problem(name: str, value: Any) -> Optional[str]:
    """Why `value` is not a count (an int >= 0; a NumPy int is one, a bool or a float is not), or None."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
        return f"{name} must be an int >= 0, got {value!r}"
    return None


class Ticket(NamedTuple):
    """What the sampler hands a worker for one element: the record and where it stands.

    Attributes:
      record: index of the record in the split (shard order, then position in the shard).
      seed: the shuffle seed; with epoch and position it seeds the element's augmentation.
      epoch: the epoch.
      position: the element's position in the epoch's global order.
      pad: True for a padding element (position past the split's end).
    """

    record: int
    seed: int
    epoch: int
    position: int
    pad: bool = False


def permutation(num_examples: int, seed: int, epoch: int) -> np.ndarray:
    """The record indices of epoch `epoch` in their global order (a test pins the first ones)."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch])))
    return rng.permutation(num_examples)


def default_rank() -> Tuple[int, int]:
    """(rank, world_size) of torch.distributed when it is initialised, else (0, 1)."""
    # torch: the torch extra's; only a default rank asks torch.distributed
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@dataclasses.dataclass
class GlobalBatchSampler:
    """A batch sampler (DataLoader's `batch_sampler=`) over one rank's share of the global order.

    It yields lists of Tickets; `imagerecords.torch.RecordDataset` reads them. The state
    (`state_dict()`) says how far the epoch got over all ranks; the loader moves it as it
    delivers batches (`imagerecords.torch.Loader`), not as this sampler's iterator runs ahead.

    Attributes:
      num_examples: records in the split.
      batch_size: per-rank batch size.
      seed: shuffle seed (and augmentation seed).
      shuffle: False reads the records in split order every epoch (evaluation).
      rank: this rank; None takes torch.distributed's, or 0.
      world_size: ranks; None takes torch.distributed's, or 1.
      remainder: "drop" or "pad" (module docstring).
      epoch: the epoch being read.
      consumed: positions of this epoch delivered over all ranks (a multiple of the global batch
        of whoever delivered them).
      dataset: what the order runs over (RecordDataset.digest: the split's records, in order); a
        state taken on another one is refused.
    """

    num_examples: int
    batch_size: int
    seed: int = 0
    shuffle: bool = True
    rank: Optional[int] = None
    world_size: Optional[int] = None
    remainder: str = "drop"
    epoch: int = 0
    consumed: int = 0
    dataset: str = ""

    def __post_init__(self):
        if self.rank is None or self.world_size is None:
            rank, world = default_rank()
            self.rank = rank if self.rank is None else self.rank
            self.world_size = world if self.world_size is None else self.world_size
        problems = [p for p in (_count_problem("seed", self.seed), _count_problem("epoch", self.epoch)) if p]
        if self.batch_size < 1:
            problems.append(f"batch_size must be >= 1, got {self.batch_size}")
        if self.world_size < 1:
            problems.append(f"world_size must be >= 1, got {self.world_size}")
        elif not 0 <= self.rank < self.world_size:
            problems.append(f"rank must be in [0, {self.world_size}), got {self.rank}")
        if self.remainder not in REMAINDER_POLICIES:
            problems.append(f"remainder must be one of {REMAINDER_POLICIES}, got {self.remainder!r}")
        if not problems and self.remainder == "drop" and 0 < self.num_examples < self.global_batch:
            problems.append(f"{self.num_examples} records do not fill one global batch of {self.batch_size} x "
                            f"{self.world_size} ranks with remainder='drop'; use remainder='pad' or a smaller batch")
        if problems:
            raise ReadError("; ".join(problems))
        self._order: Tuple[Optional[Tuple[int, int]], Optional[np.ndarray]] = (None, None)

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    def steps_left(self) -> int:
        """Batches each rank still gets this epoch."""
        left = max(self.num_examples - self.consumed, 0)
        whole, part = divmod(left, self.global_batch)
        return whole + (1 if part and self.remainder == "pad" else 0)

    def __len__(self) -> int:
        return self.steps_left()

    def order(self, epoch: int) -> np.ndarray:
        key = (self.seed, epoch)
        if self._order[0] != key:
            self._order = (key, permutation(self.num_examples, self.seed, epoch) if self.shuffle
                           else np.arange(self.num_examples))
        return self._order[1]

    def __iter__(self) -> Iterator[List[Ticket]]:
        epoch, start, steps = self.epoch, self.consumed, self.steps_left()
        order = self.order(epoch)
        n = self.num_examples
        for step in range(steps):
            first = start + step * self.global_batch + self.rank * self.batch_size
            yield [Ticket(int(order[p % n]), self.seed, epoch, p, p >= n)
                   for p in range(first, first + self.batch_size)]

    def advance(self) -> None:
        """One global batch was delivered: count it, and start the next epoch after the last one."""
        self.consumed += self.global_batch
        if self.steps_left() == 0:
            self.set_epoch(self.epoch + 1)

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch `epoch` from its beginning (DistributedSampler's name for it).

        Raises:
          ValueError: when `epoch` is not an int >= 0.
        """
        problem = _count_problem("epoch", epoch)
        if problem:
            raise ReadError(problem)
        self.epoch, self.consumed = int(epoch), 0

    def state_dict(self) -> Dict[str, Any]:
        return {"seed": self.seed, "epoch": self.epoch, "consumed": self.consumed, "num_examples": self.num_examples,
                "dataset": self.dataset}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continues where `state` says, on this sampler's world size and batch size.

        Raises:
          ValueError: naming the problem when `state` is not a state of this split.
        """
        if not isinstance(state, dict):
            raise ReadError(f"not an imagerecords.torch state (a dict of {', '.join(_STATE_KEYS)}): {state!r}")
        missing = [k for k in _STATE_KEYS if k not in state]
        if missing:
            raise ReadError(f"not an imagerecords.torch state (missing {', '.join(missing)}): {state!r}")
        problems = [p for p in (_count_problem(k, state[k]) for k in _STATE_KEYS[:4]) if p]
        if problems:
            raise ReadError("; ".join(problems))
        if int(state["num_examples"]) != self.num_examples:
            raise ReadError(f"the state is of a split of {state['num_examples']} records; this one has "
                            f"{self.num_examples} (another split, or the dataset was rebuilt)")
        if state["dataset"] != self.dataset:
            raise ReadError(f"the state was taken on another build of this split (dataset {state['dataset']!r}, "
                            f"this one {self.dataset!r}): its positions name other records; load the dataset it "
                            "was taken on, or start an epoch over with set_epoch")
        if not 0 <= int(state["consumed"]) <= self.num_examples:
            raise ReadError(f"consumed must be in [0, {self.num_examples}], got {state['consumed']}")
        self.seed, self.epoch, self.consumed = int(state["seed"]), int(state["epoch"]), int(state["consumed"])
        if self.steps_left() == 0 and self.consumed:  # only a tail under one global batch is left
            self.set_epoch(self.epoch + 1)
