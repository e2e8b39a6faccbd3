"""order="torch" follows the installed torch: torch 2.6 changed its shuffle for large n.

torch <= 2.5 shuffles every n with Fisher-Yates over 32-bit draws; torch >= 2.6 switches to the
inside-out shuffle over 64-bit draws from n = 214,748,364 on. The golden vectors below were
recorded from real torch 2.5.1 and 2.13.0 by .ci/torch-goldens.py (rank 0 of 8, the
permutation of torch.randperm seeded as DistributedSampler seeds it), so both choices are
tested against torch without installing an old torch; .ci/matrix runs the suite on real
old torch releases.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from fastshard import DistributedSampler, _core, _torch_shuffle

from .torch_goldens import GOLDEN


@pytest.mark.parametrize(
    "version, shuffle",
    [
        ("2.0.1", "fisher_yates"),
        ("2.1.2+cu121", "fisher_yates"),
        ("2.5.1", "fisher_yates"),
        ("2.5.1+cpu", "fisher_yates"),
        ("2.5.0a0+git32f585d", "fisher_yates"),
        # a pre-release of 2.6 is read as 2.5: such builds were cut from main before the change
        ("2.6.0a0+ecf3bae40a", "fisher_yates"),
        ("2.6.0rc9", "fisher_yates"),
        ("2.6.0.dev20241112+cpu", "fisher_yates"),
        ("2.6.0", "inside_out"),
        ("2.6.0+cu124", "inside_out"),
        ("2.6.0.post1", "inside_out"),
        ("2.7.0a0+79aa17489c.nv25.04", "inside_out"),
        ("2.7.0.dev20250301", "inside_out"),
        ("2.13.0+cpu", "inside_out"),
        ("2.15.0", "inside_out"),
        ("3.0.0", "inside_out"),
        ("10.1", "inside_out"),
        ("1.13.1", "fisher_yates"),
    ],
)
def test_version_picks_the_shuffle(version, shuffle):
    assert _torch_shuffle.shuffle_for(version) == shuffle


@pytest.mark.parametrize("version", ["", "two.six", "2", "2.6.0-weird build"])
def test_unreadable_version_is_refused(version):
    with pytest.raises(ValueError, match="torch version"):
        _torch_shuffle.shuffle_for(version)


def test_installed_torch_is_read(monkeypatch):
    monkeypatch.delenv(_torch_shuffle.ENV, raising=False)
    assert _torch_shuffle.installed_shuffle() == _torch_shuffle.shuffle_for(torch.__version__)
    monkeypatch.setattr(torch, "__version__", "2.5.1+cu124")
    assert _torch_shuffle.installed_shuffle() == "fisher_yates"
    assert _torch_shuffle.shard_argument() == "fisher_yates"
    monkeypatch.setattr(torch, "__version__", "2.6.0")
    assert _torch_shuffle.installed_shuffle() == "inside_out"
    assert _torch_shuffle.shard_argument() == "auto"


def test_environment_overrides_the_version(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.6.0a0+local")
    monkeypatch.setenv(_torch_shuffle.ENV, "inside_out")
    assert _torch_shuffle.shard_argument() == "auto"
    monkeypatch.setattr(torch, "__version__", "2.13.0")
    monkeypatch.setenv(_torch_shuffle.ENV, "fisher_yates")
    assert _torch_shuffle.shard_argument() == "fisher_yates"
    monkeypatch.setenv(_torch_shuffle.ENV, "sattolo")
    with pytest.raises(ValueError, match=_torch_shuffle.ENV):
        list(DistributedSampler(10, 2, 0, order="torch"))


def test_small_n_is_the_same_on_every_torch(monkeypatch):
    # Below the switch every torch uses Fisher-Yates, whatever the version says.
    monkeypatch.delenv(_torch_shuffle.ENV, raising=False)
    orders = []
    for version in ("2.1.2", "2.6.0"):
        monkeypatch.setattr(torch, "__version__", version)
        orders.append(DistributedSampler(10_007, 8, 3, seed=5, order="torch").indices())
    assert np.array_equal(*orders)


def test_shuffle_false_ignores_the_version(monkeypatch):
    monkeypatch.setenv(_torch_shuffle.ENV, "sattolo")  # never read: nothing is shuffled
    assert list(DistributedSampler(10, 2, 1, shuffle=False, order="torch")) == [1, 3, 5, 7, 9]


# -- golden vectors from real torch ----------------------------------------------------------------
def check_golden(version: str, n: int, seed: int, monkeypatch) -> None:
    golden = GOLDEN[version]
    case = next(c for c in golden["cases"] if c["n"] == n and c["seed"] == seed)
    monkeypatch.delenv(_torch_shuffle.ENV, raising=False)
    monkeypatch.setattr(torch, "__version__", version)
    s = DistributedSampler(n, golden["W"], golden["rank"], seed=seed, order="torch")
    got = s.indices()
    head = len(case["head"])
    assert got[:head].tolist() == case["head"]
    assert got[-head:].tolist() == case["tail"]
    assert hashlib.sha256(got.astype("<i8").tobytes()).hexdigest() == case["sha256"]


# The threshold at seed 0 for both shuffles runs by default (about 5 s and 0.9 GB each on a
# 2-core machine); the other cases are slow tests (.ci/run runs them).
@pytest.mark.parametrize("version", sorted(GOLDEN))
def test_golden_at_the_switch(version, monkeypatch):
    check_golden(version, _torch_shuffle.INSIDE_OUT_FROM, 0, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(GOLDEN))
@pytest.mark.parametrize(
    "n, seed",
    [
        (c["n"], c["seed"])
        for c in next(iter(GOLDEN.values()))["cases"]
        if (c["n"], c["seed"]) != (_torch_shuffle.INSIDE_OUT_FROM, 0)
    ],
)
def test_golden(version, n, seed, monkeypatch):
    check_golden(version, n, seed, monkeypatch)


def test_goldens_differ_between_the_shuffles():
    # Guards against recording both from the same torch.
    a, b = (GOLDEN[v]["cases"] for v in sorted(GOLDEN))
    assert [c["sha256"] for c in a] != [c["sha256"] for c in b]
    assert all(x["sha256"] != y["sha256"] for x, y in zip(a, b))


def test_core_argument_is_checked():
    with pytest.raises(ValueError, match="torch_shuffle"):
        _core.Shard(10, 1, 0, False, True, 0, "torch", 0, 0, torch_shuffle="sattolo")


def test_fisher_yates_beyond_2_to_the_32_is_refused_up_front(monkeypatch):
    # torch <= 2.5 would shuffle 2**32 items with Fisher-Yates (34 GB); fastshard refuses before
    # allocating anything, with torch >= 2.6 the same n is built.
    monkeypatch.setattr(torch, "__version__", "2.5.1")
    monkeypatch.delenv(_torch_shuffle.ENV, raising=False)
    s = DistributedSampler(2**32, 8, 0, order="torch")
    with pytest.raises(ValueError, match=r"n < 2\*\*32"):
        s.indices(0, 1)
