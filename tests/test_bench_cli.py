"""`python -m fastshard bench`: the CLI runs, measures the samplers it names, and writes its files."""

import argparse
import importlib.util
import json
import subprocess
import sys

import pytest
import torch

import fastshard
from fastshard import _bench

from .conftest import linux_only

# The extended tier (`pytest -m extended`, run by .ci/run):
# `python -m fastshard bench` runs its cases in fresh processes.
pytestmark = pytest.mark.extended


def _bench_cli(cwd, *args, prelude=""):
    # Outside the source tree, so that the children and the parent import the installed package.
    code = prelude + "import sys\nfrom fastshard.__main__ import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, "bench", *args],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
    )


def _rows(table, n_label):
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if cells and cells[0] == n_label:
            rows[cells[1]] = cells
    return rows


@linux_only
def test_quick_run_prints_the_table_and_writes_its_files(tmp_path):
    out = tmp_path / "out"
    proc = _bench_cli(
        tmp_path,
        *("--quick", "--sizes", "10000", "--repeat", "1", "--only", "fastshard,torch"),
        *("--no-progress", "--out", str(out)),
    )
    assert proc.returncode == 0, proc.stderr
    rows = _rows(proc.stdout, "1e4")
    assert set(rows) == {"fastshard", "torch DistributedSampler"}
    fs, tt = rows["fastshard"], rows["torch DistributedSampler"]
    # first index, iterate ns/index, array ns/index are measured numbers; torch has no array.
    assert fs[2].endswith(("µs", "ms", " s")) and float(fs[3].replace(",", "")) > 0
    assert float(fs[5].replace(",", "")) > 0
    assert tt[5] == "—" and "no array API" in tt[8]

    assert (out / "table.md").read_text(encoding="utf-8") == proc.stdout
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    cases = {(c["sampler"], c["mode"]): c for c in results["cases"]}
    assert set(cases) == {("fastshard", "iter"), ("fastshard", "array"), ("torch", "iter")}
    assert all(c["ok"] and c["n"] == 10_000 and c["world"] == 8 for c in cases.values())

    # The children measured the samplers the table names: their first index, from
    # references computed here (torch's rank 0 starts with randperm(n)[0] under seed 0).
    ours = fastshard.DistributedSampler(10_000, num_replicas=8, rank=0)
    torch_first = torch.randperm(10_000, generator=torch.Generator().manual_seed(0))[0].item()
    assert cases["fastshard", "iter"]["first_value"] == ours[0]
    assert cases["fastshard", "array"]["first_value"] == ours[0]
    assert cases["torch", "iter"]["first_value"] == torch_first
    for c in cases.values():
        assert c["length"] == c["count"] == len(ours) == 1250
        assert not c["prefix"]
        assert len(c["cpu_s"]) == len(c["total_s"]) == 1 and c["cpu_s"][0] >= 0
        # VmHWM was read (a child with numpy imported holds megabytes), and never shrinks.
        assert c["baseline_bytes"] > 2**20 and c["peak_bytes"] >= c["baseline_bytes"]
        assert c["growth_bytes"] == c["peak_bytes"] - c["baseline_bytes"]

    png = out / "plot.png"
    if importlib.util.find_spec("matplotlib") is None:
        assert not png.exists()
    else:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_without_the_optional_extras_and_says_what_it_skipped(tmp_path):
    # A None entry in sys.modules makes both `import` and importlib.util.find_spec see the
    # package as absent, as on a machine without the `bench` extra.
    hide = "import sys\nfor m in ('grain', 'torchdata', 'matplotlib', 'tqdm'):\n    sys.modules[m] = None\n"
    out = tmp_path / "out"
    proc = _bench_cli(
        tmp_path,
        *("--quick", "--sizes", "1000", "--repeat", "1", "--only", "list,arange,grain"),
        *("--out", str(out)),
        prelude=hide,
    )
    assert proc.returncode == 0, proc.stderr
    assert "grain IndexSampler: not installed" in proc.stdout
    assert "torchdata StatefulDistributedSampler: not installed" in proc.stdout
    assert set(_rows(proc.stdout, "1e3")) == {
        "Python list (iteration floor)",
        "np.arange (write floor)",
    }
    assert "[2/2] done" in proc.stderr  # the plain progress line stands in for tqdm
    assert "matplotlib is not installed" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "table.md"]


@linux_only
def test_a_child_past_the_memory_limit_or_the_timeout_is_killed():
    # A list of 1e7 ints needs about 360 MiB; the watchdog stops it at 64 MiB.
    spec = {"sampler": "list", "mode": "iter", "n": 10**7, "world": 1, "rank": 0, "repeat": 1}
    result = _bench.run_case(spec, timeout=120, max_mem=64 * 2**20)
    assert not result["ok"] and result["error"].startswith("killed: resident memory")
    # An epoch of 1e9 through Python takes far longer than a second.
    spec = {**spec, "sampler": "fastshard", "n": 10**9}
    result = _bench.run_case(spec, timeout=1, max_mem=None)
    assert not result["ok"] and result["error"].startswith("timeout")
    result = _bench.run_case({**spec, "sampler": "nope"}, timeout=60, max_mem=None)
    assert not result["ok"] and "unknown sampler 'nope'" in result["error"]


def test_counts_and_sizes_parse_exactly():
    assert _bench.parse_count("1e9") == 10**9
    assert _bench.parse_count("2.5e7") == 25_000_000
    assert _bench.parse_count("1_000") == 1000
    assert _bench.parse_count(str(2**63 - 1)) == 2**63 - 1
    for bad in ("1.5", "0", "-3", "ten"):
        with pytest.raises(argparse.ArgumentTypeError):
            _bench.parse_count(bad)
    assert _bench.parse_bytes("6GiB") == _bench.parse_bytes("6G") == 6 * 2**30
    assert _bench.parse_bytes("512M") == 512 * 2**20
    assert _bench.parse_bytes("1.5k") == 1536
    assert _bench.parse_bytes("100") == 100


def _args(*argv):
    parser = argparse.ArgumentParser()
    _bench.add_arguments(parser)
    return parser.parse_args(["--no-progress", *argv])


def test_cases_predicted_too_big_are_skipped_and_slow_ones_take_a_prefix(monkeypatch):
    # Stand-in children: "list" grows by 100 bytes per item of n and costs 1 ms per index;
    # "arange" by 8 bytes per index at 1 ns per index.
    calls = []

    def fake_run_case(spec, timeout, max_mem):
        calls.append(spec)
        length = -(-spec["n"] // spec["world"])
        count = length if spec["prefix"] is None else min(spec["prefix"], length)
        slow = spec["sampler"] == "list"
        return {
            "ok": True,
            "length": length,
            "count": count,
            "prefix": count < length,
            "first_s": [1e-6] if spec["mode"] == "iter" else [],
            "total_s": [count * (1e-3 if slow else 1e-9)],
            "first_value": 0,
            "baseline_bytes": 50 * 2**20,
            "peak_bytes": 50 * 2**20 + (100 * spec["n"] if slow else 8 * length),
            "growth_bytes": 100 * spec["n"] if slow else 8 * length,
        }

    # run_bench (in the runner module) starts each child through its run_case.
    monkeypatch.setattr(_bench.runner, "run_case", fake_run_case)
    args = _args(
        *("--sizes", "1e4,1e5,1e6,1e7", "--world", "1", "--only", "list,arange"),
        *("--max-mem", "500MiB", "--budget", "30", "--prefix", "1000"),
    )
    cases = {(c["sampler"], c["n"]): c for c in _bench.run_bench(args)["cases"]}
    # list: 1e4 and 1e5 run whole (10 s, 100 s predicted for 1e5 > 30 s -> a prefix).
    assert calls[0]["sampler"] == "list" and calls[0]["prefix"] is None
    assert cases["list", 10**4]["ok"] and not cases["list", 10**4]["prefix"]
    assert cases["list", 10**5]["prefix_limit"] == 1000 and cases["list", 10**5]["prefix"]
    # list at 1e6 needs 50 MiB + 100 MB (prefix again); at 1e7 about 1 GB: skipped.
    assert cases["list", 10**6]["ok"]
    assert cases["list", 10**7].get("skipped")
    assert cases["list", 10**7]["error"].startswith("skipped: predicted peak")
    # arange is cheap throughout: never skipped, never a prefix.
    assert all(
        cases["arange", n]["ok"] and cases["arange", n]["prefix_limit"] is None
        for n in (10**4, 10**5, 10**6, 10**7)
    )
    # The core-target cases (fastshard, torch) were left out by --only.
    assert {s["sampler"] for s in calls} == {"list", "arange"}


def test_core_targets_take_each_ratio_the_right_way_round():
    # Synthetic results: fastshard takes 1 s per epoch, torch 30 s, the list 0.25 s; in the
    # interleaved pairs torch takes 10x and the list a half of fastshard's time per round.
    def case(sampler, mode, n, total, **kw):
        return {
            "sampler": sampler,
            "mode": mode,
            "n": n,
            "world": 8,
            "role": "peer",
            "ok": True,
            "prefix": False,
            "count": n // 8,
            "length": n // 8,
            "total_s": [total],
            "cpu_s": [total],
            "first_s": [total / 100],
            "first_cpu_s": [total / 100],
            **kw,
        }

    def pair(a, b, n, ta, tb):
        return {
            "sampler": a[0],
            "mode": "pair",
            "pair": [list(a), list(b)],
            "n": n,
            "world": 8,
            "role": "target-pair",
            "ok": True,
            "total_s": [ta, tb],
            "cpu_s": [ta, tb],
        }

    fi, ti, li = ("fastshard", "iter"), ("torch", "iter"), ("list", "iter")
    results = {
        "meta": {"world": 8, "sizes": [10**7], "fastshard_threads": 2},
        "cases": [
            case("fastshard", "iter", 10**7, 1.0),
            case("torch", "iter", 10**7, 30.0),
            case("list", "iter", 10**7, 0.25),
            case("range", "iter", 10**7, 0.8),
            pair(fi, ti, 10**7, [1.0, 2.0, 1.0], [10.0, 20.0, 30.0]),
            pair(fi, li, 10**7, [1.0, 1.0, 1.0], [0.5, 0.5, 4.0]),
            pair(fi, ("range", "iter"), 10**7, [1.0, 1.3, 1.1], [1.0, 1.0, 1.0]),
        ],
    }
    rows = {r["target"].split(":")[0] + r["goal"]: r for r in _bench.core_targets(results)}
    vs_torch = rows["iterate a rank epoch at n=1e7 (W=8)>= 20x faster"]
    assert vs_torch["ratio"] == 30.0 and vs_torch["pair_ratio"] == 10.0  # median of 10, 10, 30
    assert vs_torch["pair_rounds"] == 3 and vs_torch["met"] is False  # judged on the pairs
    vs_list = rows["iterate a rank epoch at n=1e7 (W=8)<= 3x the list"]
    assert vs_list["ratio"] == 4.0 and vs_list["pair_ratio"] == 2.0 and vs_list["met"] is True
    vs_range = rows["iterate a rank epoch at n=1e7 (W=8)<= 1.2x the range"]
    assert vs_range["ratio"] == 1.25 and vs_range["pair_ratio"] == 1.1 and vs_range["met"] is True
    first = rows["first index>= 1000x faster"]
    assert first["ratio"] == 30.0 and first["met"] is False
    # Not measured: no 1e9 array cases, no memory-target case.
    assert (
        rows["indices() of a rank epoch at n=1e9 (W=8) vs np.arange of its length<= 4x np.arange"][
            "met"
        ]
        is None
    )
    assert "| **no** |" in "\n".join(_bench.render_targets(results))


def test_weighted_n_zero_skips_the_weighted_comparison():
    # Its help says "0 skips it": the option must accept 0 (and still refuse the rest).
    assert _args("--weighted-n", "0").weighted_n == 0
    assert _args("--weighted-n", "1e3").weighted_n == 1000
    with pytest.raises(SystemExit):
        _args("--weighted-n", "-1")


@pytest.mark.parametrize(
    ("n", "weights"),
    [(1000, (0.5, 0.3, 0.2)), (997, (1, 1, 1)), (61, (0.9, 0.05, 0.05)), (50, (1, 0, 2))],
)
def test_blended_index_merges_each_datasets_points_and_keeps_every_prefix_in_proportion(n, weights):
    # The closed-form scatter against the merge it computes, built here by sorting the exact
    # points (2j + 1) / (2 m_c), ties to the lower dataset; chunk=7 crosses chunk boundaries.
    from fractions import Fraction

    m = _bench.mixture.quotas(n, weights)
    assert sum(m) == n and all(abs(mc - n * w / sum(weights)) < 1 for mc, w in zip(m, weights))
    merged = sorted(
        (Fraction(2 * j + 1, 2 * mc), c, j) for c, mc in enumerate(m) for j in range(mc)
    )
    dataset_index, sample_index = _bench.mixture.blended_index(n, weights, chunk=7)
    assert dataset_index.dtype == "int16" and sample_index.dtype == "int64"
    assert dataset_index.tolist() == [c for _, c, _ in merged]
    assert sample_index.tolist() == [j for _, _, j in merged]
    # Megatron's guarantee: every prefix holds each dataset's share to within one sample.
    counts = [0] * len(m)
    for t, c in enumerate(dataset_index.tolist(), start=1):
        counts[c] += 1
        assert all(abs(counts[d] - t * m[d] / n) <= 1 for d in range(len(m)))


def test_mixture_blend_sizes_stop_at_the_memory_limit_with_the_largest_that_fits(monkeypatch):
    # Stand-in children: a blended index grows by 10 bytes a sample over a 50 MiB baseline.
    calls = []

    def fake_run_case(spec, timeout, max_mem):
        calls.append(spec)
        growth = 10 * spec["n"] if spec["mode"] == "blend-index" else 0
        return {
            "ok": True,
            "length": spec["n"],
            "count": spec["n"],
            # mixture-indices: the best of each side (MixtureSampler, default order, np.arange).
            "total_s": [2e-3, 1e-3, 1e-4] if spec["mode"] == "mixture-indices" else [1e-3],
            "first_s": [1e-6],
            "draw_s": [1e-6],
            "rounds_s": [[2e-3], [1e-3], [1e-4]],
            "baseline_bytes": 50 * 2**20,
            "peak_bytes": 50 * 2**20 + growth,
            "growth_bytes": growth,
            "bytes_per_sample": 10,
            "first_value": 0,
        }

    monkeypatch.setattr(_bench.mixture, "run_case", fake_run_case)
    args = _args("--mixture", "--mixture-max-n", "1e9", "--timeout", "60")
    section = _bench.mixture.run_mixture(args, max_mem=500 * 2**20, repeat=1)
    blends = [c for c in section["cases"] if c["mode"] == "blend-index"]
    # 1e6 and 1e7 fit (10 MB, 100 MB); 1e8 would need 1 GB: skipped, then the largest that
    # fits, 0.9 * 450 MiB / 10 bytes = 42,467,328, rounded down to 4.2e7.
    assert [(c["n"], c["role"], c["ok"]) for c in blends] == [
        (10**6, "blend", True),
        (10**7, "blend", True),
        (10**8, "blend", False),
        (42_000_000, "blend-fit", True),
    ]
    assert blends[2]["error"].startswith("skipped: predicted peak")
    assert 10**8 not in [s["n"] for s in calls if s["mode"] == "blend-index"]
    table = _bench.mixture.render_mixture(section)
    assert "| 4.2e7 |" in table and "the largest n that fits" in table
    if _bench.mixture.has_mixture_sampler():
        assert "| 2.00x | 20.00x | 10.00x | yes |" in table


@linux_only
def test_mixture_section_runs_at_a_tiny_size_and_prints_its_rows(tmp_path):
    out = tmp_path / "out"
    proc = _bench_cli(
        tmp_path,
        *("--quick", "--sizes", "1000", "--only", "list", "--weighted-n", "0", "--no-progress"),
        *("--mixture", "--mixture-max-n", "2e4", "--mixture-draws", "1000"),
        *("--mixture-indices-n", "1e4", "--out", str(out)),
    )
    assert proc.returncode == 0, proc.stderr
    rows = {}
    for line in proc.stdout.split("\nMixtures of three datasets")[1].splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if cells and cells[0] not in ("case", "---", "n") and not cells[0].startswith("-"):
            rows.setdefault(cells[0], []).append(cells)
    blend = rows["Megatron-style blended index (NumPy: int16 + int64 arrays)"]
    assert [r[1] for r in blend] == ["1e4", "2e4"]
    assert all(r[2].endswith(("µs", "ms", " s")) and r[5].startswith("10 bytes") for r in blend)
    mixture = json.loads((out / "results.json").read_text(encoding="utf-8"))["mixture"]
    cases = {(c["mode"], c["n"]): c for c in mixture["cases"]}
    assert all(cases["blend-index", n]["ok"] for n in (10**4, 2 * 10**4))
    # The first sample goes to the heaviest dataset (0), as Megatron's first choice does.
    assert cases["blend-index", 10**4]["first_value"] == 0
    if importlib.util.find_spec("torchdata") is not None:
        (draws,) = rows["torchdata MultiNodeWeightedSampler"]
        assert draws[1] == "1e10; 1e3 draws" and draws[3].endswith(" ns")
        assert 0 <= cases["mnws", 10**10]["first_value"] < 10**10
    if hasattr(fastshard, "MixtureSampler"):
        (first,) = rows["fastshard MixtureSampler"]
        assert first[1] == "1e10" and first[2].endswith(("µs", "ms", " s"))
        reference = fastshard.MixtureSampler(
            _bench.mixture.split_sizes(10**10), list(_bench.mixture.WEIGHTS), num_replicas=8, rank=0
        )
        assert cases["mixture-first", 10**10]["first_value"] == reference[0]
        pair = cases["mixture-indices", 10**4]
        assert pair["ok"] and len(pair["rounds_s"]) == 3
        assert all(len(r) == _bench.mixture.INDICES_ROUNDS for r in pair["rounds_s"])
        assert "| 1e4 |" in proc.stdout.split("`indices()` of rank 0")[1]
    else:
        assert "not run: this fastshard has no MixtureSampler" in proc.stdout
