"""fastshard inside the transformers ``Trainer``.

The Trainer hands its training DataLoader to accelerate, which splits every DataLoader it
prepares over the processes by batches. So the sampler must be one global order
(``num_replicas=1``) that accelerate splits, and a fastshard sampler that shards over the
ranks itself is refused when it is iterated there (it would train on ``1 / world_size`` of
the data). :class:`FastshardTrainer` is that global order, with the epoch kept right when a
run resumes mid-epoch::

    from fastshard.transformers import FastshardTrainer

    trainer = FastshardTrainer(model=model, args=args, train_dataset=dataset)
    trainer.train()                        # or trainer.train(resume_from_checkpoint=...)

Importing this module imports transformers; ``import fastshard`` does not.
"""

from __future__ import annotations

from typing import Any

import transformers

from ._sampler import DistributedSampler, _ShardSampler

__all__ = ["FastshardTrainer"]

# TrainingArguments.train_sampling_strategy values a fastshard DistributedSampler serves.
_STRATEGIES = ("random", "sequential")


class _EpochToSampler(transformers.TrainerCallback):
    """Sets the sampler's epoch at the start of every epoch, resumed ones included.

    The Trainer's own ``set_epoch`` does not reach the sampler in a resumed epoch: accelerate
    wraps the batch sampler in a ``SkipBatchSampler`` that hides it, so without this the
    resumed epoch would replay epoch 0's order from the skipped position (items of the
    interrupted epoch trained twice, others never)."""

    def __init__(self, trainer: FastshardTrainer) -> None:
        self.trainer = trainer

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        sampler = self.trainer.train_sampler
        if sampler is not None:
            # state.epoch is the fractional epoch: k at the start of epoch k, k + f in a
            # run resumed f of the way into epoch k.
            sampler.set_epoch(int(state.epoch or 0))


class FastshardTrainer(transformers.Trainer):
    """A ``transformers.Trainer`` whose training order is a fastshard sampler.

    Every epoch each item is trained on once (accelerate pads the last global batches with
    items from the start of the order when the batches do not divide evenly over the
    processes, as it does for any sampler), each epoch in a fresh order, and
    ``resume_from_checkpoint`` from a mid-epoch checkpoint continues the interrupted epoch.

    Parameters
    ----------
    *args, **kwargs
        As for ``transformers.Trainer``.
    sampler_kwargs : dict, optional
        Passed to :class:`fastshard.DistributedSampler` (e.g. ``order="block"``,
        ``block_size=64``). The seed is ``args.data_seed``, else ``args.seed``.

    Raises
    ------
    ValueError
        When training starts: ``args.train_sampling_strategy`` is not ``"random"`` or
        ``"sequential"``, or :meth:`make_train_sampler` returned something other than a
        fastshard sampler with ``num_replicas=1``.

    Notes
    -----
    Override :meth:`make_train_sampler` for another sampler (e.g. a
    :class:`fastshard.WeightedDistributedSampler`); it must have ``num_replicas=1``.
    Run it as any Trainer, on one process or under ``torchrun`` / ``accelerate launch``.

    Examples
    --------
    ::

        from transformers import TrainingArguments
        from fastshard.transformers import FastshardTrainer

        args = TrainingArguments("out", per_device_train_batch_size=8, num_train_epochs=3)
        trainer = FastshardTrainer(
            model=model,
            args=args,
            train_dataset=dataset,
            sampler_kwargs={"order": "block", "block_size": 64},  # local reads
        )
        trainer.train()  # or trainer.train(resume_from_checkpoint=True)

    Weighted sampling, by overriding the sampler::

        class WeightedTrainer(FastshardTrainer):
            def make_train_sampler(self, dataset):
                return fastshard.WeightedDistributedSampler(
                    weights, num_replicas=1, rank=0, seed=self.args.seed
                )
    """

    def __init__(self, *args: Any, sampler_kwargs: dict[str, Any] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.sampler_kwargs = dict(sampler_kwargs or {})
        self.train_sampler: _ShardSampler | None = None
        self.add_callback(_EpochToSampler(self))

    def make_train_sampler(self, dataset: Any) -> _ShardSampler:
        """The epoch's global order over ``dataset``: one for all processes (num_replicas=1),
        which accelerate splits by batches.

        ``args.train_sampling_strategy``: ``"random"`` (the default) shuffles,
        ``"sequential"`` takes the items in order (``shuffle=False``). The length-based
        strategies (``"group_by_length"``, ``"batch_rebalance"``) are transformers' own
        samplers, which this Trainer does not replace: they raise ValueError here rather than
        train in a plain shuffled order.

        Parameters
        ----------
        dataset : Sized
            The training dataset.

        Returns
        -------
        DistributedSampler
            ``DistributedSampler(dataset, num_replicas=1, rank=0, seed=..., **sampler_kwargs)``.

        Raises
        ------
        ValueError
            An unsupported ``train_sampling_strategy``, or ``"sequential"`` with
            ``sampler_kwargs={"shuffle": True}``.

        Examples
        --------
        ::

            trainer = FastshardTrainer(model=model, args=args, train_dataset=dataset)
            trainer.make_train_sampler(dataset)
            # DistributedSampler(n=..., num_replicas=1, rank=0, shuffle=True, seed=42, ...)
        """
        strategy = getattr(self.args, "train_sampling_strategy", "random")
        if strategy not in _STRATEGIES:
            raise ValueError(
                f"FastshardTrainer: TrainingArguments(train_sampling_strategy={strategy!r}) is "
                "not a fastshard order (FastshardTrainer supports 'random' and 'sequential'). "
                "For batches grouped by length use transformers.Trainer, whose own "
                "LengthGroupedSampler honours it, or override make_train_sampler; see "
                "https://github.com/fastshard/fastshard/blob/main/docs/frameworks.md#transformers-trainer"
            )
        kwargs = dict(self.sampler_kwargs)
        if strategy == "sequential":
            if kwargs.get("shuffle", False):
                raise ValueError(
                    "FastshardTrainer: train_sampling_strategy='sequential' contradicts "
                    "sampler_kwargs={'shuffle': True}; choose one"
                )
            kwargs["shuffle"] = False
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        return DistributedSampler(dataset, num_replicas=1, rank=0, seed=seed, **kwargs)

    def _get_train_sampler(self, train_dataset: Any = None) -> _ShardSampler:
        dataset = self.train_dataset if train_dataset is None else train_dataset
        sampler = self.make_train_sampler(dataset)
        if not isinstance(sampler, _ShardSampler) or sampler.num_replicas != 1:
            raise ValueError(
                "FastshardTrainer.make_train_sampler must return a fastshard sampler with "
                "num_replicas=1 (one global order that accelerate splits over the processes), "
                f"got {sampler!r}"
            )
        self.train_sampler = sampler
        return sampler
