"""Golden vectors: the "feistel" and "block" orders and the weighted draws (with and without
replacement) for fixed (n, seed, epoch, parameters) are public contracts.

These literals were generated once from the order as released and pasted here; they are not
derived by the test. If one of them changes, the order changed: a different order is a new
order name (see docs/DESIGN.md, "Versioning"), never an edit of these vectors.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import fastshard
from fastshard import DistributedSampler, WeightedDistributedSampler


def sampler(n: int, seed: int, epoch: int, world: int = 1, rank: int = 0) -> DistributedSampler:
    s = DistributedSampler(n, world, rank, seed=seed)
    s.set_epoch(epoch)
    return s


# DistributedSampler(n, 1, 0, seed=seed).set_epoch(epoch): every index.
SMALL = {
    (10, 0, 0): [4, 3, 1, 9, 0, 8, 7, 2, 5, 6],
    (10, 1234567, 7): [3, 7, 9, 2, 1, 4, 5, 6, 8, 0],
}
# The first 16 and the last 16 indices.
HEAD_TAIL = {
    (1024, 0, 0): (
        [508, 901, 159, 32, 144, 367, 251, 862, 123, 333, 575, 332, 503, 864, 68, 466],
        [951, 967, 246, 544, 863, 821, 308, 26, 107, 567, 209, 498, 398, 811, 584, 97],
    ),
    (1024, 1234567, 7): (
        [373, 139, 366, 204, 801, 116, 28, 230, 871, 704, 655, 996, 64, 981, 440, 742],
        [758, 222, 925, 785, 16, 793, 962, 965, 293, 616, 447, 383, 156, 457, 4, 698],
    ),
    (1025, 0, 0): (
        [793, 633, 495, 238, 591, 655, 96, 991, 117, 386, 534, 581, 557, 761, 694, 359],
        [314, 47, 433, 635, 55, 77, 424, 754, 162, 304, 675, 745, 517, 647, 327, 997],
    ),
    (1025, 1234567, 7): (
        [242, 737, 777, 1014, 554, 294, 350, 771, 970, 615, 128, 659, 768, 537, 266, 883],
        [378, 354, 661, 5, 138, 459, 213, 375, 889, 449, 779, 30, 17, 489, 957, 717],
    ),
    (1000000, 0, 0): (
        [
            632002,
            405059,
            876351,
            626738,
            609994,
            299681,
            706871,
            299251,
            884821,
            711104,
            137665,
            513872,
            368491,
            393160,
            124801,
            429942,
        ],
        [
            214845,
            472382,
            242619,
            765196,
            558385,
            638199,
            916035,
            870711,
            844698,
            145113,
            587491,
            216585,
            373862,
            947525,
            972822,
            718416,
        ],
    ),
    (1000000, 1234567, 7): (
        [
            175538,
            933035,
            674381,
            571908,
            849250,
            676912,
            399248,
            767186,
            379469,
            394044,
            323287,
            273463,
            436328,
            1561,
            598901,
            970480,
        ],
        [
            395507,
            362910,
            897183,
            699636,
            198374,
            771437,
            82347,
            497449,
            987487,
            935627,
            803786,
            695022,
            555945,
            508150,
            347860,
            306806,
        ],
    ),
}
# indices(0, 16) and sampler[k] for a few k.
HUGE = {
    (1000000000000, 0, 0): (
        [
            516406192890,
            871699413129,
            402001437464,
            647070163838,
            67000846429,
            417168551706,
            381364904359,
            837411689929,
            651010433672,
            433569719471,
            412152155887,
            253340365066,
            288313529522,
            180962301889,
            148214788378,
            650388351040,
        ],
        {1000000: 653040289428, 500000000000: 991182918151, 999999999999: 95263238856},
    ),
    (1000000000000, 1234567, 7): (
        [
            715190230745,
            865342037470,
            453713529966,
            313732360612,
            441496911824,
            711107390328,
            801489346588,
            921355376085,
            184215122388,
            50368770651,
            19281168336,
            405723340671,
            723828871896,
            574100204277,
            241267182590,
            999593175003,
        ],
        {1000000: 872714943104, 500000000000: 782168674550, 999999999999: 799997622101},
    ),
    (2**63 - 1, 0, 0): (
        [
            5030280788811785945,
            4037505670707718151,
            3809339732210746023,
            1986673996852530931,
            2459500471641624267,
            3181857914248318328,
            3652675550119162709,
            1419691477462519543,
            3432524768422646460,
            4108818018342755830,
            7355107284116634722,
            2405821605393349936,
            3579289279784041947,
            8808300524324880342,
            7386484805448317696,
            5439888114581858803,
        ],
        {
            1000000: 2195883901653437903,
            4611686018427387903: 2301825949701835785,
            9223372036854775806: 2193070616036918288,
        },
    ),
    (2**63 - 1, 1234567, 7): (
        [
            9106710614682640210,
            3544748003134449693,
            2993114530116766713,
            8200525993707893982,
            3965809984476803145,
            4735492308699687609,
            6303674400840520436,
            7231406026164915544,
            850120327265485273,
            5445892776805574468,
            3363531100042070332,
            3067621478323219464,
            6135091576793528944,
            5242033747358334315,
            7014099397521911869,
            7692832907595228424,
        ],
        {
            1000000: 7819544026644642715,
            4611686018427387903: 659162460866689474,
            9223372036854775806: 7216758697103008662,
        },
    ),
}
# DistributedSampler(10**9, 8, 3, seed=42).set_epoch(3).indices(0, 16): the plan on top.
RANK = [
    15349770,
    310489117,
    711594352,
    570146489,
    732341132,
    356426164,
    206614429,
    141704790,
    954433010,
    242501802,
    841785734,
    649366732,
    622432638,
    80474974,
    306486959,
    306094072,
]


@pytest.mark.parametrize("key", list(SMALL))
def test_small(key):
    s = sampler(*key)
    assert s.indices().tolist() == SMALL[key]
    assert list(s) == SMALL[key]


@pytest.mark.parametrize("key", list(HEAD_TAIL))
def test_head_and_tail(key):
    head, tail = HEAD_TAIL[key]
    s = sampler(*key)
    assert s.indices(0, 16).tolist() == head
    assert s.indices(-16).tolist() == tail
    assert [s[k] for k in range(16)] == head and [s[k] for k in range(-16, 0)] == tail


@pytest.mark.parametrize("key", list(HUGE))
def test_huge(key):
    head, points = HUGE[key]
    s = sampler(*key)
    assert s.indices(0, 16).tolist() == head
    assert {k: s[k] for k in points} == points


def test_rank_of_many():
    assert sampler(10**9, 42, 3, world=8, rank=3).indices(0, 16).tolist() == RANK


# -- the block order ----------------------------------------------------------------------------
# DistributedSampler(n, W, rank, seed=seed, order="block", block_size=B, window=K,
# shuffle=shuffle).set_epoch(epoch): the first 16 and the last 8 indices.
BLOCK = {
    (1000, 0, 0, 16, 1, 1, 0, True): (
        [206, 192, 195, 207, 204, 198, 194, 205, 201, 200, 202, 193, 196, 199, 197, 203],
        [345, 348, 349, 350, 346, 344, 351, 347],
    ),
    (1000, 1234567, 7, 10, 4, 1, 0, True): (
        [284, 46, 842, 280, 840, 289, 282, 844, 47, 544, 545, 41, 843, 548, 44, 540],
        [161, 153, 155, 237, 160, 508, 152, 504],
    ),
    (100_003, 42, 3, 64, 8, 4, 3, True): (
        [
            7564,
            1768,
            46069,
            55758,
            1743,
            4292,
            97954,
            4325,
            1773,
            97927,
            58701,
            58747,
            97963,
            7569,
            55763,
            58692,
        ],
        [87906, 63029, 47681, 63602, 20633, 63005, 87883, 52914],
    ),
    (1000, 5, 1, 7, 3, 2, 1, False): (
        list(range(21, 37)),  # unshuffled: rank 1 reads the second window of 21 items
        list(range(992, 1000)),
    ),
}
# The same at n = 2**63 - 1 (B = 2**20, K = 64, rank 5 of 8, seed 9, epoch 2): the first 16
# indices and a few far positions.
BLOCK_HUGE = (
    [
        7293731896174746032,
        2148269213337947091,
        7002261828070229126,
        2545685005041775558,
        3581881060566625367,
        7846387162872044229,
        6419618593864878351,
        7652653435075255275,
        4698397245928336158,
        9189961947620746146,
        4925520691801863678,
        7768796745235541182,
        7652653435075158718,
        230735263443731358,
        6333155358311255628,
        1453221423928251747,
    ],
    {
        10**6: 4136420970723450736,
        2**40: 7952675847086270504,
        2**60 - 1: 6251850863406295072,
    },
)


def block_sampler(n, seed, epoch, B, K, world, rank, shuffle=True):
    s = DistributedSampler(
        n, world, rank, seed=seed, order="block", block_size=B, window=K, shuffle=shuffle
    )
    s.set_epoch(epoch)
    return s


@pytest.mark.parametrize("key", list(BLOCK))
def test_block_head_and_tail(key):
    head, tail = BLOCK[key]
    s = block_sampler(*key)
    assert s.indices(0, 16).tolist() == head and s.indices(-8).tolist() == tail
    assert [s[k] for k in range(16)] == head


def test_block_huge():
    head, points = BLOCK_HUGE
    s = block_sampler(2**63 - 1, 9, 2, 2**20, 64, 8, 5)
    assert s.indices(0, 16).tolist() == head
    assert {k: s[k] for k in points} == points


# -- weighted draws -------------------------------------------------------------------------------
# Ordinary weights at n < 2**19: "ramp" is 1, 2, ..., n; "pattern" is i % 7 (zero at every
# multiple of 7). WeightedDistributedSampler(weights, num_samples, replacement, W, rank,
# seed=seed).set_epoch(epoch).
WEIGHTS = {
    "ramp": lambda n: np.arange(1.0, n + 1.0),
    "pattern": lambda n: (np.arange(n) % 7).astype(np.float64),
}
# With replacement: the first 16 and the last 8 draws of the rank.
WITH_REPLACEMENT = {
    ("ramp", 1000, 1000, 0, 0, 1, 0): (
        [610, 981, 655, 404, 265, 790, 855, 562, 610, 420, 740, 931, 445, 838, 894, 751],
        [728, 995, 971, 793, 585, 604, 229, 837],
    ),
    ("ramp", 1000, 1000, 1234567, 7, 1, 0): (
        [742, 964, 842, 867, 714, 883, 762, 263, 976, 278, 666, 442, 302, 961, 959, 855],
        [563, 656, 138, 830, 695, 692, 839, 959],
    ),
    ("pattern", 500, 10**6, 3, 2, 3, 2): (
        [139, 176, 307, 307, 201, 361, 377, 87, 83, 407, 260, 493, 382, 439, 265, 326],
        [4, 153, 354, 212, 363, 55, 214, 146],
    ),
}
# Without replacement: the whole selection of 20 of the 1000 ramp items, in order; for the
# pattern, rank 0 of 2 over all 428 positive items: its first 16 and last 8.
SELECTED = {
    ("ramp", 1000, 20, 0, 0, 1, 0): [
        235,
        937,
        659,
        238,
        621,
        769,
        883,
        546,
        993,
        233,
        688,
        593,
        866,
        813,
        927,
        821,
        877,
        783,
        362,
        724,
    ],
    ("ramp", 1000, 20, 1234567, 7, 1, 0): [
        523,
        671,
        109,
        894,
        302,
        802,
        783,
        465,
        402,
        531,
        600,
        624,
        368,
        654,
        867,
        462,
        908,
        711,
        861,
        904,
    ],
}
WITHOUT_REPLACEMENT = {
    ("pattern", 500, None, 3, 2, 2, 0): (
        [346, 397, 423, 307, 20, 285, 212, 494, 67, 440, 309, 178, 355, 26, 88, 286],
        [435, 15, 50, 106, 22, 71, 239, 43],
    ),
}


def weighted_sampler(kind, n, num_samples, seed, epoch, world, rank, replacement):
    w = WEIGHTS[kind](n)
    s = WeightedDistributedSampler(w, num_samples, replacement, world, rank, seed=seed)
    s.set_epoch(epoch)
    return s


@pytest.mark.parametrize("key", list(WITH_REPLACEMENT))
def test_weighted_with_replacement(key):
    head, tail = WITH_REPLACEMENT[key]
    s = weighted_sampler(*key, replacement=True)
    assert s.indices(0, 16).tolist() == head and s.indices(-8).tolist() == tail
    assert [s[k] for k in range(16)] == head


@pytest.mark.parametrize("key", list(SELECTED))
def test_weighted_selection_without_replacement(key):
    s = weighted_sampler(*key, replacement=False)
    assert s.indices().tolist() == SELECTED[key] and list(s) == SELECTED[key]


@pytest.mark.parametrize("key", list(WITHOUT_REPLACEMENT))
def test_weighted_order_without_replacement(key):
    head, tail = WITHOUT_REPLACEMENT[key]
    s = weighted_sampler(*key, replacement=False)
    assert len(s) == 214  # ceil(428 / 2): every positive weight once over the two ranks
    assert s.indices(0, 16).tolist() == head and s.indices(-8).tolist() == tail


# -- alias tables, fused multiply-adds ruled out ----------------------------------------------------
# The alias tables of two kinds of full-mantissa weights, built in sweep segments of 4096 items
# (the segment states are where a rounding shows first). A build whose compiler fused `a * b - c`
# into one FMA gave other tables here (GCC contracts wherever the target has FMA: every aarch64,
# and -march=native through FASTSHARD_NATIVE), until CMakeLists.txt passed -ffp-contract=off.
# .ci/run builds with FASTSHARD_NATIVE=ON and runs this file against that build too.
ALIAS_TABLES = {
    "skew": "4466c21c5a9b26aa2c4f891fb06f61b9befa639a5a23b919ef3c7f95dd797ed0",
    "uniform": "be190c923b92a1f6af8ba649aac2b821dc5630102ab8171b633f6a4c95a8385e",
}


def _unit_floats(n):
    """n floats in [0, 1) with full 53-bit mantissas, from a SplitMix-style integer hash."""
    i = np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = (i + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        x ^= x >> np.uint64(31)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(29)
    return (x >> np.uint64(11)).astype(np.float64) * 2.0**-53


@pytest.mark.parametrize("kind", list(ALIAS_TABLES))
def test_alias_tables_do_not_depend_on_fused_multiply_add(kind):
    u = _unit_floats(1_000_003)
    w = np.where(u < 0.1, 0.0, u * u * u * 100) if kind == "skew" else u + 2.0**-30
    threshold, alias = fastshard._core.AliasTable(w, _segment=4096)._buckets()
    raw = threshold.astype("<u8").tobytes() + alias.astype("<u8").tobytes()
    assert hashlib.sha256(raw).hexdigest() == ALIAS_TABLES[kind]
