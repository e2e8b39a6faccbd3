"""fastshard.transformers.FastshardTrainer in this process: the sampler it builds.

The default tier's check of FastshardTrainer; training under the Trainer's own launchers, with
every item audited, is tests/test_integrations.py (the extended tier).
"""

from __future__ import annotations

import pytest

import fastshard

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


def _trainer(tmp_path, **kwargs):
    from fastshard.transformers import FastshardTrainer

    args = transformers.TrainingArguments(
        str(tmp_path), per_device_train_batch_size=4, use_cpu=True, report_to=[], seed=7
    )
    return FastshardTrainer(
        model=torch.nn.Linear(2, 1), args=args, train_dataset=list(range(10)), **kwargs
    )


def test_the_training_sampler_is_one_global_fastshard_order(tmp_path):
    trainer = _trainer(tmp_path, sampler_kwargs={"order": "block", "block_size": 2})
    sampler = trainer._get_train_sampler()
    assert isinstance(sampler, fastshard.DistributedSampler)
    assert (sampler.num_replicas, sampler.rank, sampler.seed) == (1, 0, 7)
    assert sampler.order == "block" and sampler.shuffle
    assert sorted(sampler) == list(range(10))
    assert trainer.train_sampler is sampler


def test_sequential_strategy_and_refused_strategies(tmp_path):
    trainer = _trainer(tmp_path)
    trainer.args.train_sampling_strategy = "sequential"
    assert list(trainer.make_train_sampler(list(range(5)))) == [0, 1, 2, 3, 4]
    trainer.args.train_sampling_strategy = "group_by_length"
    with pytest.raises(ValueError, match="not a fastshard order"):
        trainer.make_train_sampler(list(range(5)))
