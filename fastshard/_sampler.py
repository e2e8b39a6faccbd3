"""The samplers: thin Python classes over the compiled shard engine."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import Sampler
from torch.utils.data.distributed import DistributedSampler as _TorchDistributedSampler

from . import _core, _distributed, _frameworks, _state, _torch_shuffle, _validate, _world
from ._warnings import EpochWarning

ORDERS = ("feistel", "torch", "block")

# torch.Generator.manual_seed accepts [-2**63, 2**64); order="torch" seeds with seed + epoch.
_TORCH_SEED_MIN, _TORCH_SEED_MAX = -(2**63), 2**64 - 1


class _ShardSampler(_TorchDistributedSampler[int]):
    """What every fastshard sampler shares: the plan of an epoch over ranks, its checkpoint,
    and the ways to read it. Subclasses say how to build a pass's shard and what their
    configuration is (the part of a checkpoint that must match).

    Every fastshard sampler is an instance of torch's ``DistributedSampler``, because that
    is how frameworks recognise a sampler that already shards over ranks: Lightning,
    Ray Train and Composer test ``isinstance(sampler, DistributedSampler)`` and otherwise wrap
    the sampler in one more sharding layer, which silently trains each rank on a fraction
    of its shard. torch's ``__init__`` is never run (it calls ``len(dataset)`` and needs the
    process group); every attribute and method torch's class has is defined here instead.
    """

    num_replicas: int
    rank: int
    shuffle: bool
    dataset: Any  # torch's is a Dataset: here also range(n) for a length or for weights
    check_consistency: bool
    auto_epoch: bool = False
    _epoch_warned: bool = False
    _resume_pending: bool = False
    _epoch_chosen: bool = False

    # Attributes fixed at construction: the order and the plan are built from them, so a
    # later assignment would change the attribute (and repr) but not one index. torch's
    # sampler reads them on every iteration, so torch-era code may assign them; here that
    # raises instead of being ignored. (``epoch`` is the exception: assigning it is set_epoch.)
    _FROZEN = frozenset(
        {
            "num_replicas", "rank", "shuffle", "seed", "drop_last", "pad", "dataset", "order",
            "block_size", "window", "replacement", "num_draws", "sizes", "weights", "period",
            "lengths", "batch_size", "max_tokens", "max_batch_size", "sort_window", "schedule",
        }
    )  # fmt: skip

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "epoch" and "epoch" in self.__dict__:
            # torch's set_epoch is `self.epoch = epoch`, so torch-era code assigns it.
            self.set_epoch(value)
            return
        if name in self._FROZEN and name in self.__dict__:
            raise AttributeError(
                f"fastshard.{type(self).__name__}.{name} cannot be changed after construction: "
                "the sampler's order and plan are built from it, so the new value would not "
                f"change which items it yields. Build a new sampler with {name}={value!r} "
                "instead (sampler.epoch can be assigned: it is set_epoch)."
            )
        object.__setattr__(self, name, value)

    def _set_shared_arguments(
        self,
        num_replicas: int | None,
        rank: int | None,
        seed: int | None,
        drop_last: bool,
        check_consistency: bool,
        auto_epoch: bool,
    ) -> None:
        """Check and set the arguments every fastshard sampler takes. Call it after the
        sampler's own checks: seed=None is a collective call (a broadcast from rank 0), so
        every purely local error comes before it."""
        self.num_replicas, self.rank = _world.resolve(num_replicas, rank)
        self.drop_last = _validate.flag(drop_last, "drop_last")
        self.check_consistency = _validate.flag(check_consistency, "check_consistency")
        self.auto_epoch = _validate.flag(auto_epoch, "auto_epoch")
        self.seed = _distributed.random_seed() if seed is None else _validate.integer(seed, "seed")

    def _make_shard(self, cursor: int) -> _core.Shard:
        raise NotImplementedError

    def _config(self) -> dict[str, Any]:
        raise NotImplementedError

    def _plan_args(self) -> tuple[int, bool, bool]:
        """(length of the epoch's global sequence, drop_last, pad)."""
        raise NotImplementedError

    def _lengths(self, cursor: int | None = None) -> tuple[int, int]:
        """This pass's (num_samples, total_size), from the plan alone: no order is built.
        With ``cursor=0``: a whole epoch's."""
        n, drop_last, pad = self._plan_args()
        cursor = self._cursor if cursor is None else cursor
        return _core.plan_lengths(n, self.num_replicas, self.rank, drop_last, pad, cursor)

    def _start_pass(
        self,
        epoch: int = 0,
        cursor: int = 0,
        rnd: _state.Round | None = None,
        resumed: bool = False,
    ) -> None:
        if (
            resumed
            and self._chosen_unread()
            and self.epoch > epoch
            and not self._lengths(cursor)[1]
        ):
            # A state saved at the end of its epoch, loaded after set_epoch chose a later one
            # (torchdata's StatefulDataLoader loads the sampler's state when it makes its
            # iterator, after the loop's set_epoch): nothing of the saved epoch is left, and
            # going back to it would spend the chosen epoch on an empty pass.
            epoch, cursor, rnd, resumed = self.epoch, 0, None, False
        self.__dict__["epoch"] = epoch  # not through __setattr__, for which it is set_epoch
        self._epoch_chosen = False  # whether set_epoch chose this pass: see _chosen_unread
        # A state just loaded and not yet iterated: set_epoch(epoch) keeps it (see set_epoch).
        self._resume_pending = resumed
        # Positions of the epoch's global sequence consumed before this pass began (non-zero
        # only after load_state_dict; for the block order also its interrupted round), the
        # pass's shard (built lazily), its latest iterator, and whether a BatchSampler
        # iterated this pass to its end.
        self._cursor = cursor
        self._round = rnd
        self._shard: _core.Shard | None = None
        self._iterator: Any = None
        self._pass_done = False

    def _begin_iteration(self) -> int:
        """At the start of every iteration (of this sampler, or of a BatchSampler over it):
        after a pass that ran to its end, with no set_epoch or load_state_dict since, advance
        the epoch (auto_epoch) or warn once that the same order comes again. First of all,
        refuse to run under a framework layer that would shard this rank's shard again.

        Returns how many processes iterate this sampler together, as accelerate's
        ``BatchSamplerShard`` does on every process (0 when none is known to): what the
        rank-consistency check needs to know of a sampler with ``num_replicas=1``.
        """
        splitter, processes = _frameworks.accelerate_split()
        _frameworks.check_not_resharded(self, splitter, processes)
        self._advance_if_done()
        return processes if splitter == "BatchSamplerShard" else 0

    def _chosen_unread(self) -> bool:
        """Whether set_epoch chose the current pass and nothing of it was yielded yet (an
        iterator may have begun: torchdata's BatchSampler iterator calls ``iter`` on the
        sampler before it loads the sampler's state)."""
        it = self._iterator
        return self._epoch_chosen and not self._pass_done and (it is None or not it.position)

    def _advance_if_done(self) -> None:
        self._resume_pending = False
        it = self._iterator
        if (
            self.auto_epoch
            and it is None
            and (self._cursor or self._round)
            and self._lengths()[1] == 0
        ):
            # A state saved at the end of a pass: its rest is empty on every rank, so the
            # next epoch begins now rather than after an empty pass.
            self._start_pass(self.epoch + 1)
            return
        if not (self._pass_done or (it is not None and it.__length_hint__() == 0)):
            return
        if self.auto_epoch:
            self._start_pass(self.epoch + 1)
        elif self.shuffle and not self._epoch_warned:
            self._epoch_warned = True
            warnings.warn(
                f"fastshard.{type(self).__name__}: a new iteration started at epoch {self.epoch}, "
                "which the previous iteration already yielded to its end, so it repeats the same "
                "order. Call sampler.set_epoch(epoch) before each epoch (as with torch's "
                "DistributedSampler), or build the sampler with auto_epoch=True to advance the "
                "epoch on each new iteration. (Warned once per sampler; filter it with "
                "warnings.filterwarnings('ignore', category=fastshard.EpochWarning).)",
                EpochWarning,
                stacklevel=4,
            )

    def __getstate__(self) -> dict[str, Any]:
        # The shard and iterator are caches of compiled objects: rebuilt after unpickling.
        state = self.__dict__.copy()
        state["_shard"] = None
        state["_iterator"] = None
        return state

    def _current(self) -> _core.Shard:
        # Read once into a local: another thread's set_epoch may reset self._shard meanwhile.
        shard = self._shard
        if shard is None:
            shard = self._shard = self._make_shard(self._cursor)
        return shard

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the sampler yields (any int, reduced modulo 2**64).

        Also ends a resumed pass: the sampler yields the whole epoch again. Except right
        after ``load_state_dict``, before the resumed pass is iterated: ``set_epoch`` of the
        saved epoch then keeps the resume, so that the usual loop (load the checkpoint, then
        ``set_epoch(epoch)`` at the top of every epoch) continues the saved epoch instead of
        training on its first part twice.

        Parameters
        ----------
        epoch : int
            The epoch. Every rank must pass the same one.

        Raises
        ------
        TypeError
            ``epoch`` is not an int.
        fastshard.ReshardedError
            The sampler is being split again by accelerate's batch dispatcher.

        Examples
        --------
        >>> sampler = fastshard.DistributedSampler(10, num_replicas=2, rank=0)
        >>> list(sampler)
        [4, 1, 0, 7, 5]
        >>> sampler.set_epoch(1)
        >>> list(sampler)
        [8, 4, 9, 6, 1]
        """
        epoch = _validate.integer(epoch, "epoch")
        # accelerate's DataLoaderDispatcher sets the epoch on every process but iterates the
        # sampler on process 0 only: the one point where every process can refuse it.
        _frameworks.check_not_resharded(self, *_frameworks.accelerate_split())
        if self._resume_pending and epoch == self.epoch:
            return
        self._start_pass(epoch, 0)
        self._epoch_chosen = True

    # -- checkpoints ------------------------------------------------------------------------
    def _cursor_after(self, consumed: int) -> int:
        length, total = self._lengths()
        if not 0 <= consumed <= length:
            raise ValueError(
                f"consumed must be in [0, {length}] (this pass's length), got {consumed}"
            )
        # At step k every rank has taken its first k items, i.e. all positions before k * W
        # (capped at the pass's end): the same cursor on every rank.
        return self._cursor + min(consumed * self.num_replicas, total)

    def _resume_after(self, consumed: int) -> tuple[int, _state.Round | None]:
        """(cursor, round) once every rank consumed ``consumed`` items of this pass."""
        return self._cursor_after(consumed), None

    def _resume_point(self) -> dict[str, Any]:
        """Where this pass starts, for the rank-consistency check."""
        return {"cursor": self._cursor}

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """A JSON-serialisable checkpoint of the sampler (no rank in it).

        Parameters
        ----------
        consumed : int, optional
            How many of this pass's indices the training loop has consumed on this rank.
            Defaults to how many the sampler's latest iterator has yielded — pass it
            explicitly when a loader prefetches ahead of the training step.

        Returns
        -------
        dict
            The epoch, the position in its global sequence, and the configuration a resume
            must match (length, seed, order, ...). Every rank returns the same state at the
            same step. Once the loop over the pass has ended (its iterator, or a
            :class:`BatchSampler`'s, ran out) with all of it consumed, the state is the
            epoch's end: with ``pad=False`` a shorter rank's loop can end a step before the
            others', and its state then resumes without reading their last step again.

        Raises
        ------
        ValueError
            ``consumed`` is outside ``[0, remaining]``.

        Examples
        --------
        >>> sampler = fastshard.DistributedSampler(10, num_replicas=2, rank=0)
        >>> it = iter(sampler)
        >>> [next(it) for _ in range(3)]
        [4, 1, 0]
        >>> state = sampler.state_dict()  # 3 consumed on each of 2 ranks
        >>> state["epoch"], state["cursor"]
        (0, 6)
        """
        it = self._iterator
        if consumed is None:
            consumed = 0 if it is None else it.position
        else:
            consumed = _validate.integer(consumed, "consumed")
        n = self._plan_args()[0]
        # The loop over this pass has ended (its iterator ran out, or a BatchSampler's did)
        # with all of it consumed: with pad=False a rank may be a whole step shorter than
        # another, and its state at its loop's end is the epoch's end, not its last step's
        # (which would read the longer rank's last step again). Until its loop has ended, a
        # rank at its last item is at the same step as the others (the longer ones' last
        # items still to come).
        ended = self._pass_done or bool(getattr(it, "ended", False))
        if ended and consumed == len(self._current()):
            return _state.make(self._config(), self.epoch, n, None)
        cursor, rnd = self._resume_after(consumed)
        if cursor > n:
            # Padding ran past the epoch's end: cursor + total_size reaches n + W - 1, which
            # can pass the 2**63 - 1 a state may hold. Any cursor >= n leaves nothing on any
            # number of ranks, so the exhausted pass is saved as n, which always loads.
            cursor, rnd = n, None
        return _state.make(self._config(), self.epoch, cursor, rnd)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from a state saved by any rank, on any number of ranks.

        The next iteration yields the rest of the saved epoch re-sharded over this sampler's
        ``num_replicas``: with the same number of ranks exactly what the uninterrupted run
        would have yielded. A state of another length, seed, order, shuffle, drop_last or pad
        is refused and the sampler is left unchanged.

        Parameters
        ----------
        state : dict
            What :meth:`state_dict` returned, on any rank (also after a JSON round trip).

        Raises
        ------
        ValueError
            The state was saved by a sampler of another configuration, or a value in it is
            out of range.
        TypeError
            The state is not a dict of the expected types.

        Examples
        --------
        Saved on 2 ranks after 3 steps, resumed on 1: the 4 items no rank had reached.

        >>> saved = fastshard.DistributedSampler(10, num_replicas=2, rank=0)
        >>> it = iter(saved)
        >>> _ = [next(it) for _ in range(3)]
        >>> resumed = fastshard.DistributedSampler(10, num_replicas=1, rank=0)
        >>> resumed.load_state_dict(saved.state_dict())
        >>> resumed.remaining, list(resumed)
        (4, [7, 2, 5, 6])
        """
        epoch, cursor, rnd = _state.check(state, self._config())
        self._start_pass(epoch, cursor, rnd, resumed=True)

    # -- torch's attributes -----------------------------------------------------------------
    # A whole epoch's lengths, also while a resumed pass yields only the rest of its epoch:
    # a framework that resumes mid-epoch (Lightning with a stateful loader) counts the
    # epoch's batches from len() and the batches it has already run from its checkpoint, so
    # a len() of only the rest would end the resumed epoch early.
    # torch's two are plain attributes; here they are derived from the plan, read-only.
    @property
    def num_samples(self) -> int:  # type: ignore[override]
        """This rank's number of indices per epoch."""
        return self._lengths(0)[0]

    @property
    def total_size(self) -> int:  # type: ignore[override]
        """Indices per epoch over all ranks (``num_samples * num_replicas`` unless pad=False)."""
        return self._lengths(0)[1]

    def __len__(self) -> int:
        """This rank's number of indices (batches, rows) per epoch, as torch's sampler: the
        whole epoch's, also after ``load_state_dict`` (the resumed pass yields only the rest,
        :attr:`remaining`)."""
        return self._lengths(0)[0]

    @property
    def remaining(self) -> int:
        """This rank's number of indices in the current pass, in O(1): ``len(self)``, or
        after ``load_state_dict`` what is left of the saved epoch on this rank (see the
        example of :meth:`load_state_dict`)."""
        return self._lengths()[0]

    # -- access -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[int]:
        """This rank's indices of the current pass, as Python ints computed one at a time.

        With a process group (and ``check_consistency``), first checks that every rank has
        the same configuration: a collective, so every rank must iterate as often.

        Raises
        ------
        fastshard.InconsistentRanksError
            The ranks disagree on the configuration (raised on every rank).
        fastshard.ReshardedError
            A framework is sharding this sampler's shard again.
        """
        _distributed.check(self, self._begin_iteration())
        it: Iterator[int] = self._current().iter(0)
        self._iterator = it
        return it

    def indices(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """This rank's indices ``[start, stop)`` of the current pass as a new int64 array.

        Large ranges are filled by several threads (:func:`set_num_threads`), without the GIL.

        Parameters
        ----------
        start, stop : int, optional
            Positions in this rank's shard, with slice rules: negative values count from the
            end, out-of-range values are clipped. Default: the whole pass.

        Returns
        -------
        numpy.ndarray
            A new 1-D int64 array, the same indices iteration yields at those positions.

        Raises
        ------
        TypeError
            ``start`` or ``stop`` is not an int; or the sampler yields batches or rows rather
            than indices.

        Examples
        --------
        >>> sampler = fastshard.DistributedSampler(10, num_replicas=2, rank=0)
        >>> sampler.indices()
        array([4, 1, 0, 7, 5])
        >>> sampler.indices(1, 3)
        array([1, 0])
        """
        start = 0 if start is None else _validate.integer(start, "start")
        stop = None if stop is None else _validate.integer(stop, "stop")
        shard = self._current()
        lo, hi, _ = slice(start, stop).indices(len(shard))
        return shard.indices(lo, max(lo, hi))

    def __getitem__(self, k: int) -> int:
        """This rank's k-th index of the current pass, in O(1).

        Parameters
        ----------
        k : int
            Position in this rank's shard; negative values count from the end.

        Returns
        -------
        int
            The index iteration yields at position ``k``.

        Raises
        ------
        IndexError
            ``k`` is outside ``[-len, len)`` of the pass.

        Examples
        --------
        >>> sampler = fastshard.DistributedSampler(10, num_replicas=2, rank=0)
        >>> sampler[0], sampler[-1]
        (4, 5)
        """
        k = _validate.integer(k, "index")
        shard = self._current()
        n = len(shard)
        if not -n <= k < n:  # checked here: beyond int64 the compiled call cannot take k at all
            raise IndexError(f"index {k} is out of range for a shard of {n} items")
        return shard[k]


class _UnitIterator(Iterator[Any]):
    """A pass over a rank's elements of a unit sampler; ``position`` is how many it has
    yielded (the base class's epoch logic reads ``__length_hint__``)."""

    def __init__(self, sampler: _UnitSampler, shard: Any) -> None:
        self._sampler = sampler
        self._shard = shard
        self.position = 0
        self.ended = False

    def __iter__(self) -> _UnitIterator:
        return self

    def __next__(self) -> Any:
        if self.position >= len(self._shard):
            self.ended = True  # the loop over it has ended (see state_dict)
            raise StopIteration
        element = self._sampler._element(self._shard, self.position)
        self.position += 1
        return element

    def __length_hint__(self) -> int:
        return len(self._shard) - self.position


class _UnitSampler(_ShardSampler):
    """A sampler whose elements are not item indices but larger units of its plan (a batch
    of indices, a packed row): it yields them one by one, ``sampler[k]`` is this rank's k-th,
    and ``len()``, ``state_dict(consumed)`` and ``load_state_dict`` count them."""

    _unit = "element"  # for messages: "batch", "row"
    _units = "elements"

    def _element(self, shard: Any, k: int) -> Any:
        """This rank's k-th element, 0 <= k < len(shard)."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[Any]:
        _distributed.check(self, self._begin_iteration())
        it = _UnitIterator(self, self._current())
        self._iterator = it
        return it

    def __getitem__(self, k: int) -> Any:
        """This rank's k-th element (batch, row) of the current pass.

        Parameters
        ----------
        k : int
            Position in this rank's shard; negative values count from the end.

        Returns
        -------
        object
            The element iteration yields at position ``k``.

        Raises
        ------
        IndexError
            ``k`` is outside ``[-len, len)`` of the pass.
        """
        k = _validate.integer(k, "index")
        shard = self._current()
        n = len(shard)
        if not -n <= k < n:
            raise IndexError(f"index {k} is out of range for a shard of {n} {self._units}")
        return self._element(shard, k % n)

    def indices(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Not available: this sampler's elements are not indices (iterate it, or use
        ``sampler[k]``).

        Raises
        ------
        TypeError
            Always.
        """
        raise TypeError(
            f"{type(self).__name__} yields {self._units}, not indices: iterate it or use sampler[k]"
        )

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """A JSON-serialisable checkpoint (no rank in it), counted in this sampler's elements.

        Parameters
        ----------
        consumed : int, optional
            How many of this pass's elements the training loop has consumed on this rank
            (default: how many the latest iterator yielded; pass it when the DataLoader
            prefetches). The same on every rank at the same step.

        Returns
        -------
        dict
            The epoch, the position in its global sequence and the configuration a resume
            must match; load it with ``load_state_dict`` on any number of ranks.

        Raises
        ------
        ValueError
            ``consumed`` is outside ``[0, remaining]``.
        """
        return super().state_dict(consumed)


class DistributedSampler(_ShardSampler):
    """Drop-in replacement for :class:`torch.utils.data.distributed.DistributedSampler`.

    Every rank computes only its own indices, each in O(1) time and memory, for datasets of
    up to ``2**63 - 1`` items. The plan is torch's: ``num_samples = ceil(n / num_replicas)``
    (``n // num_replicas`` with ``drop_last=True``), padding wraps to the start of the epoch's
    order, and rank ``r`` takes positions ``r, r + num_replicas, ...`` of it.

    Parameters
    ----------
    dataset : Sized or int
        The dataset, or its length (the attribute ``dataset`` is then ``range(length)``).
    num_replicas, rank : int, optional
        Default to the initialised process group, else to ``WORLD_SIZE`` / ``RANK``.
    shuffle : bool
        ``False`` takes the items in order.
    seed : int or None
        Any Python int; reduced modulo ``2**64``. ``None``: a random seed in ``[0, 2**63)``
        drawn on rank 0 and broadcast to every rank (a collective call, so every rank must
        pass ``None``; needs an initialised process group, else ValueError). ``seed`` then
        holds the drawn int. With ``order="torch"``, ``seed + epoch`` must lie in
        ``[-2**63, 2**64)`` as for :meth:`torch.Generator.manual_seed`.
    drop_last : bool
        Truncate to a multiple of ``num_replicas`` instead of padding.
    order : {"feistel", "torch", "block"}
        ``"feistel"``: a keyed bijection of ``[0, n)``, a fresh one for every (n, seed, epoch).
        ``"torch"``: exactly the indices of torch's sampler for the same arguments, seed and
        epoch. It costs what torch's order costs by nature: torch's shuffle is sequential, so
        the epoch's whole permutation is built (in C++) when the epoch is first used, in O(n)
        time and 4 bytes per item of transient memory (8 above ``2**32`` items); then only
        this rank's ``num_samples`` items are kept. The default order costs O(1) time and
        memory per index and nothing up front.
        ``"block"``: for fast local reads; items in blocks of ``block_size`` consecutive
        indices, the blocks in a fresh random order every epoch, dealt to ranks in windows of
        ``window`` blocks whose items are shuffled together. Any ``block_size * window``
        consecutive indices of a rank come from at most ``2 * window + 2`` blocks. The plan
        (lengths, padding, drop_last, pad=False, resume) is as for ``"feistel"``; padding
        repeats fewer than ``num_replicas`` items. With ``shuffle=False``: blocks in order,
        windows unshuffled (each rank reads contiguous runs).
    block_size : int
        Items per block, required with ``order="block"`` and refused with other orders.
    window : int
        Blocks per window (default 1), with ``order="block"`` only.
    pad : bool
        ``False`` (with ``drop_last=False``): no repeats; every item exactly once, shard
        lengths differ by at most one. For evaluation.
    check_consistency : bool
        With an initialised process group, each iteration starts with one small all_gather
        that checks every rank has the same length, seed, epoch, resume point, order, shuffle,
        drop_last, pad and num_replicas, and raises :class:`fastshard.InconsistentRanksError`
        on every rank if not. It is a collective: every rank must iterate as often. ``False``
        turns it off; it must be the same on every rank.
    auto_epoch : bool
        ``True``: each new iteration that follows one which ran to its end advances the
        epoch by one, so a loop that never calls ``set_epoch`` still gets a fresh order every
        epoch. ``set_epoch`` and ``load_state_dict`` still set the epoch (and then the next
        iteration does not advance it). Default ``False``, as torch: the same epoch repeats
        until ``set_epoch``, and a shuffled sampler warns once when that happens.

    Raises
    ------
    ValueError
        An argument is out of range (a negative length, ``rank >= num_replicas``, an unknown
        ``order``, ``block_size`` without ``order="block"``), or ``num_replicas``/``rank``
        are not given and neither a process group nor ``WORLD_SIZE``/``RANK`` provides them.
    TypeError
        An argument has the wrong type (a float length, a string seed).

    Examples
    --------
    In a DataLoader, as torch's sampler (``num_replicas`` and ``rank`` usually come from the
    process group):

    >>> from torch.utils.data import DataLoader
    >>> data = list(range(100, 110))
    >>> sampler = fastshard.DistributedSampler(data, num_replicas=2, rank=0)
    >>> loader = DataLoader(data, sampler=sampler, batch_size=2)
    >>> for epoch in range(2):
    ...     sampler.set_epoch(epoch)
    ...     print([batch.tolist() for batch in loader])
    [[104, 101], [100, 107], [105]]
    [[108, 104], [109, 106], [101]]

    A length instead of a dataset, random access and the epoch as an array:

    >>> big = fastshard.DistributedSampler(10**12, num_replicas=8, rank=3)
    >>> len(big), 0 <= big[0] < 10**12, big.indices(0, 4).shape
    (125000000000, True, (4,))

    ``order="torch"`` yields exactly torch's indices:

    >>> import torch.utils.data.distributed as tud
    >>> ours = fastshard.DistributedSampler(
    ...     10, num_replicas=2, rank=0, order="torch"
    ... )
    >>> theirs = tud.DistributedSampler(range(10), num_replicas=2, rank=0)
    >>> list(ours) == list(theirs)
    True
    """

    def __init__(
        self,
        dataset: Any,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int | None = 0,
        drop_last: bool = False,
        *,
        order: str = "feistel",
        pad: bool = True,
        check_consistency: bool = True,
        block_size: int | None = None,
        window: int | None = None,
        auto_epoch: bool = False,
    ) -> None:
        self._n = _validate.length(dataset)
        # torch's attribute: the dataset, or for a length a lazy range of that many items,
        # so that torch code reading len(sampler.dataset) still works.
        self.dataset = range(self._n) if isinstance(dataset, (int, np.integer)) else dataset
        self.shuffle = _validate.flag(shuffle, "shuffle")
        self.pad = _validate.flag(pad, "pad")
        if not isinstance(order, str) or order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(map(repr, ORDERS))}, got {order!r}")
        self.order = order
        self.block_size, self.window = _block_arguments(order, block_size, window)
        self._set_shared_arguments(
            num_replicas, rank, seed, drop_last, check_consistency, auto_epoch
        )
        self._start_pass()

    # -- the epoch's shard ------------------------------------------------------------------
    def _check_torch_seed(self, epoch: int) -> None:
        # torch.Generator.manual_seed(seed + epoch) refuses values outside [-2**63, 2**64);
        # wrapping them silently would yield an order torch never produces.
        if self.order == "torch" and self.shuffle:
            value = self.seed + epoch
            if not _TORCH_SEED_MIN <= value <= _TORCH_SEED_MAX:
                raise ValueError(
                    f'order="torch" seeds torch.Generator.manual_seed(seed + epoch), which '
                    f"needs a value in [-2**63, 2**64 - 1]; seed + epoch = {self.seed} + "
                    f"{epoch} = {value}"
                )

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the sampler yields (any int, reduced modulo 2**64).

        Also ends a resumed pass: the sampler yields the whole epoch again. Except right
        after ``load_state_dict``, before the resumed pass is iterated: ``set_epoch`` of the
        saved epoch then keeps the resume, so that the usual loop (load the checkpoint, then
        ``set_epoch(epoch)`` at the top of every epoch) continues the saved epoch instead of
        training on its first part twice.

        Parameters
        ----------
        epoch : int
            The epoch. Every rank must pass the same one.

        Raises
        ------
        TypeError
            ``epoch`` is not an int.
        ValueError
            With ``order="torch"``: ``seed + epoch`` is outside ``[-2**63, 2**64)``.
        fastshard.ReshardedError
            The sampler is being split again by accelerate's batch dispatcher.

        Examples
        --------
        >>> sampler = fastshard.DistributedSampler(10, num_replicas=2, rank=0)
        >>> list(sampler)
        [4, 1, 0, 7, 5]
        >>> sampler.set_epoch(1)
        >>> list(sampler)
        [8, 4, 9, 6, 1]
        """
        epoch = _validate.integer(epoch, "epoch")
        self._check_torch_seed(epoch)
        super().set_epoch(epoch)

    def _plan_args(self) -> tuple[int, bool, bool]:
        return self._n, self.drop_last, self.pad

    def _lengths(self, cursor: int | None = None) -> tuple[int, int]:
        if self.order != "block" or cursor == 0:
            return super()._lengths(cursor)
        # After an interrupted round the rest is not n - cursor: ask the shard (cheap to
        # build for this order: O(1) but for a table of at most 1024 words).
        shard = self._current()
        return len(shard), shard.total_size

    def _make_shard(self, cursor: int) -> _core.Shard:
        self._check_torch_seed(self.epoch)
        extra: dict[str, Any] = {}
        if self.order == "block":
            # the block order keeps shuffle=False itself: blocks in order, windows unshuffled
            extra = dict(
                block_size=self.block_size,
                window=self.window,
                shuffle=self.shuffle,
                round=self._round,
            )
        elif self.order == "torch" and self.shuffle:
            # torch's own shuffle for large n changed in 2.6: follow the installed torch
            extra = dict(torch_shuffle=_torch_shuffle.shard_argument())
        order = self.order if self.shuffle or extra else "identity"
        return _core.Shard(
            self._n,
            self.num_replicas,
            self.rank,
            self.drop_last,
            self.pad,
            cursor,
            order,
            self.seed % 2**64,
            self.epoch % 2**64,
            **extra,
        )

    def _config(self) -> dict[str, Any]:
        config = {
            "n": self._n,
            "seed": self.seed % 2**64,
            "order": self.order,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "pad": self.pad,
        }
        if self.order == "block":
            config.update(block_size=self.block_size, window=self.window)
        return config

    def _resume_after(self, consumed: int) -> tuple[int, _state.Round | None]:
        if self.order != "block":
            return super()._resume_after(consumed)
        shard = self._current()
        if not 0 <= consumed <= len(shard):
            raise ValueError(
                f"consumed must be in [0, {len(shard)}] (this pass's length), got {consumed}"
            )
        cursor, rnd = shard.resume_after(consumed)
        return cursor, rnd

    def _resume_point(self) -> dict[str, Any]:
        point = super()._resume_point()
        if self.order == "block":
            point["round"] = _state.round_code(self._round)
        return point

    def __repr__(self) -> str:
        block = (
            f", block_size={self.block_size}, window={self.window}" if self.order == "block" else ""
        )
        return (
            f"{type(self).__name__}(n={self._n}, num_replicas={self.num_replicas}, "
            f"rank={self.rank}, shuffle={self.shuffle}, seed={self.seed}, epoch={self.epoch}, "
            f"drop_last={self.drop_last}, order={self.order!r}{block}, pad={self.pad}, "
            f"num_samples={self.num_samples})"
        )


def _block_arguments(order: str, block_size: Any, window: Any) -> tuple[int | None, int | None]:
    """(block_size, window) for the block order, (None, None) for others, or an error naming
    the argument."""
    if order != "block":
        for value, name in ((block_size, "block_size"), (window, "window")):
            if value is not None:
                raise ValueError(f"{name} only applies to order='block', got order={order!r}")
        return None, None
    if block_size is None:
        raise ValueError("order='block' needs block_size (items per block), e.g. block_size=64")
    b = _validate.in_range(block_size, "block_size", 1, _validate.MAX_LENGTH)
    k = 1 if window is None else _validate.in_range(window, "window", 1, _validate.MAX_LENGTH // b)
    return b, k


class BatchSampler(Sampler[list[int]]):
    """Batches of a fastshard sampler, each built in C++ in one call.

    Use as ``DataLoader(dataset, batch_sampler=BatchSampler(sampler, batch_size))``: the
    batches are those of ``torch.utils.data.BatchSampler`` over the same sampler, without a
    Python call per index. ``set_epoch``, ``state_dict`` and ``load_state_dict`` reach the
    sampler, counted in batches.

    Parameters
    ----------
    sampler : DistributedSampler or WeightedDistributedSampler
        A fastshard sampler that yields indices (not one that yields batches or rows).
    batch_size : int
        Indices per batch, at least 1.
    drop_last : bool
        Drop the rank's last batch when it is smaller than ``batch_size``.

    Raises
    ------
    TypeError
        ``sampler`` is not a fastshard index sampler (torch's samplers: use
        ``torch.utils.data.BatchSampler``), already yields batches
        (:class:`LengthGroupedBatchSampler`: pass it as the DataLoader's ``batch_sampler``),
        or yields other elements than indices (:class:`PackedSampler`'s rows: pass it as
        the DataLoader's ``sampler`` with ``batch_size``).
    ValueError
        ``batch_size`` is less than 1.

    Examples
    --------
    >>> sampler = fastshard.DistributedSampler(10, num_replicas=2, rank=0)
    >>> batches = fastshard.BatchSampler(sampler, batch_size=2)
    >>> len(batches), list(batches)
    (3, [[4, 1], [0, 7], [5]])

    In a DataLoader: ``DataLoader(dataset, batch_sampler=batches, num_workers=4)``.
    """

    def __init__(self, sampler: _ShardSampler, batch_size: int, drop_last: bool = False) -> None:
        if not isinstance(sampler, _ShardSampler):
            original = _frameworks.lightning_predict_original(BatchSampler)
            if original is not None:
                # Lightning's predict loop rebuilds the batch sampler around the DataLoader's
                # default sampler: continue the fastshard sampler the batches came from
                # (with Lightning's drop_last=False, so that every item is predicted).
                sampler = original.sampler
        if getattr(sampler, "_yields_batches", False):
            raise TypeError(
                f"fastshard.BatchSampler was given a {type(sampler).__name__}, which yields "
                "batches already: pass it to the DataLoader as "
                "DataLoader(dataset, batch_sampler=sampler) instead of wrapping it"
            )
        if not isinstance(sampler, _ShardSampler):
            if isinstance(sampler, _TorchDistributedSampler):
                # Lightning (Trainer(use_distributed_sampler=True), its default) rebuilds a
                # DataLoader's batch_sampler around a torch DistributedSampler of its own,
                # dropping the fastshard sampler the batches were built from.
                raise TypeError(
                    "fastshard.BatchSampler was given torch's "
                    f"{type(sampler).__name__}, not a fastshard sampler. If a framework built "
                    "it (Lightning replaces the sampler inside a DataLoader's batch_sampler "
                    "unless Trainer(use_distributed_sampler=False)), pass the fastshard sampler "
                    "as DataLoader(dataset, sampler=fastshard_sampler, batch_size=B) instead, "
                    "which Lightning keeps as it is, or build the Trainer with "
                    "use_distributed_sampler=False. See "
                    "https://github.com/fastshard/fastshard/blob/main/docs/frameworks.md#lightning"
                )
            raise TypeError(
                "sampler must be a fastshard sampler, got "
                f"{type(sampler).__name__}; use torch.utils.data.BatchSampler for other samplers"
            )
        if isinstance(sampler, _UnitSampler):
            # Its elements are rows (or other units), not indices: batch them in the DataLoader.
            raise TypeError(
                f"fastshard.BatchSampler batches indices, but a {type(sampler).__name__} yields "
                f"{sampler._units}: pass it as DataLoader(dataset, sampler=sampler, "
                "batch_size=B)"
                + (
                    ", with collate_fn=fastshard.collate_rows for PackedTokens' rows"
                    if sampler._unit == "row"
                    else ""
                )
            )
        self.sampler = sampler
        self.batch_size = _validate.in_range(batch_size, "batch_size", 1, _validate.MAX_LENGTH)
        self.drop_last = _validate.flag(drop_last, "drop_last")
        self._yielded = 0  # batches yielded by the latest iteration

    def set_epoch(self, epoch: int) -> None:
        """Set the sampler's epoch (see :meth:`DistributedSampler.set_epoch`).

        Parameters
        ----------
        epoch : int
            The epoch, the same on every rank.
        """
        self._yielded = 0
        self.sampler.set_epoch(epoch)

    def state_dict(self, consumed_batches: int | None = None) -> dict[str, Any]:
        """The sampler's checkpoint after ``consumed_batches`` batches of this pass.

        Parameters
        ----------
        consumed_batches : int, optional
            Batches the training loop has consumed on this rank (default: as many as the
            latest iteration yielded; pass it when the DataLoader prefetches).

        Returns
        -------
        dict
            The sampler's ``state_dict`` at that batch boundary.

        Raises
        ------
        ValueError
            ``consumed_batches`` is negative.

        Examples
        --------
        >>> sampler = fastshard.DistributedSampler(10, num_replicas=2, rank=0)
        >>> batches = fastshard.BatchSampler(sampler, batch_size=2)
        >>> batches.state_dict(consumed_batches=1)["cursor"]  # 2 items x 2 ranks
        4
        """
        b = (
            self._yielded
            if consumed_batches is None
            else _validate.integer(consumed_batches, "consumed_batches")
        )
        if b < 0:
            raise ValueError(f"consumed_batches must be >= 0, got {b}")
        return self.sampler.state_dict(min(b * self.batch_size, self.sampler.remaining))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the saved batch boundary, on any number of ranks.

        Parameters
        ----------
        state : dict
            What :meth:`state_dict` (of this class or of the sampler) returned.

        Raises
        ------
        ValueError
            As :meth:`DistributedSampler.load_state_dict`.
        TypeError
            As :meth:`DistributedSampler.load_state_dict`.
        """
        self.sampler.load_state_dict(state)
        self._yielded = 0

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        sampler = self.sampler
        _distributed.check(sampler, sampler._begin_iteration())
        shard = sampler._current()
        size = self.batch_size
        end = len(shard) - len(shard) % size if self.drop_last else len(shard)
        self._yielded = 0
        for start in range(0, end, size):
            batch = shard.batch(start, min(start + size, end))
            self._yielded += 1
            yield batch
        if sampler._shard is shard:  # no set_epoch / load_state_dict meanwhile
            sampler._pass_done = True

    def __repr__(self) -> str:
        return f"BatchSampler({self.sampler!r}, batch_size={self.batch_size}, drop_last={self.drop_last})"
