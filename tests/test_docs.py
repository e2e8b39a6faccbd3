"""The API reference: every public name has a page entry, and the docstrings' examples run.

The examples (``>>>`` lines) of every public class, function and method are run as doctests,
so the reference cannot show output the code no longer gives. The page check needs the
checkout's docs/ (the sdist leaves it out) and skips without it.
"""

from __future__ import annotations

import doctest
import inspect
import re
from pathlib import Path

import pytest

import fastshard

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"


def _public_objects():
    """Public classes and functions, and the methods and properties classes have from their
    fastshard bases (``state_dict`` of a sampler is defined on a private base class)."""
    for name in fastshard.__all__:
        obj = getattr(fastshard, name)
        if inspect.isfunction(obj):
            yield f"fastshard.{name}", obj
        elif inspect.isclass(obj):
            yield f"fastshard.{name}", obj
            for base in obj.__mro__[1:]:
                if not base.__module__.startswith("fastshard."):
                    continue
                for attr, member in vars(base).items():
                    if isinstance(member, property):
                        member = member.fget
                    if inspect.isfunction(member) and attr not in vars(obj):
                        yield f"fastshard.{name}.{attr}", member


def _examples():
    finder = doctest.DocTestFinder()
    seen = set()
    for path, obj in _public_objects():
        for test in finder.find(obj, path, globs={"fastshard": fastshard}):
            # Methods inherited from a shared base are found once per class: run them once.
            key = (test.filename, test.lineno, test.docstring)
            if test.examples and key not in seen:
                seen.add(key)
                yield test


EXAMPLES = sorted(_examples(), key=lambda t: t.name)


@pytest.mark.parametrize("test", EXAMPLES, ids=[t.name for t in EXAMPLES])
def test_docstring_example(test):
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{test.name}: {result.failed} of {result.attempted} failed"


def test_examples_were_found():
    # the samplers' own examples at least: a broken finder must not pass by finding nothing
    names = {t.name for t in EXAMPLES}
    assert "fastshard.DistributedSampler" in names
    assert "fastshard.BatchSampler" in names


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="docs/ is not part of the sdist")
def test_every_public_name_has_a_reference_entry():
    documented = set()
    for page in REFERENCE.glob("*.md"):
        documented |= set(re.findall(r"^::: ([\w.]+)", page.read_text(), re.M))
    public = {f"fastshard.{name}" for name in fastshard.__all__}
    public.add("fastshard.transformers.FastshardTrainer")
    assert public - documented == set()


def _requirement(line: str) -> str:
    return re.sub(r"\s+", "", line.split("#")[0])


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="docs/ is not part of the sdist")
def test_the_docs_requirements_are_the_docs_extra():
    # The pages tell a reader to `pip install -r docs/requirements.txt` (no torch, no compile);
    # .ci/run installs the `docs` extra's pins. Both must be the same packages at the same pins.
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pytest's own TOML parser
        import tomli as tomllib
    with open(ROOT / "pyproject.toml", "rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["docs"]
    lines = (ROOT / "docs" / "requirements.txt").read_text(encoding="utf-8").splitlines()
    assert sorted(filter(None, map(_requirement, lines))) == sorted(map(_requirement, extra))
    for page in (ROOT / "README.md", ROOT / "docs" / "getting-started.md"):
        text = page.read_text(encoding="utf-8")
        assert "pip install -r docs/requirements.txt && mkdocs serve" in text, page.name


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="docs/ is not part of the sdist")
def test_the_guides_speak_of_versions_not_issues():
    # A reader has the releases and CHANGELOG.md, not the project's issue tracker: "before 0.3
    # (issue 24)" named a version that does not exist. Say it as the CHANGELOG does.
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    versions = set(re.findall(r"^## .*?(\d+\.\d+\.\d+(?:\.dev\d+)?)", changelog, re.M))
    assert "0.1.0" in versions
    for page in [*(ROOT / "docs").glob("*.md"), ROOT / "README.md"]:
        if page.name == "changelog.md":
            continue
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"\bissues?\s+\d", text), page.name
        # the project's versions (0.x) where a page dates a change by one
        when = r"\b(?:[Bb]efore|[Ss]ince|[Uu]ntil|builds of|fastshard) "
        for version in re.findall(when + r"(0\.\d+(?:\.\d+)?(?:\.dev\d+)?)(?![\w.])", text):
            assert version in versions, f"{page.name}: {version}"


# The site's content column is about 690 px wide: a wider figure is scaled down, and the
# benchmarks figure, 1870 px wide, had 5 px tall labels there.
SITE_WIDTH = 690


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", path
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_the_benchmarks_figure_fits_the_page():
    plot = ROOT / "bench" / "plot.png"
    if not plot.is_file():
        pytest.skip("bench/ is not part of the sdist")
    assert _png_size(plot)[0] <= SITE_WIDTH


def test_the_bench_plot_is_drawn_to_fit_the_page(tmp_path):
    # What `python -m fastshard bench --out DIR` writes as plot.png, from a run's results.
    pytest.importorskip("matplotlib", reason="needs matplotlib (the bench extra)")
    from fastshard._bench.adapters import SAMPLERS
    from fastshard._bench.plot import plot

    cases = [
        {
            "ok": True,
            "role": "peer",
            "sampler": key,
            "mode": mode,
            "n": n,
            "first_s": [1e-5 * (k + 1)],
            "total_s": [n * 1e-9 * (k + 1)],
            "count": n // 8,
            "length": n // 8,
            "growth_bytes": n * k,
            "prefix": None,
        }
        for k, (key, _, modes, _) in enumerate(SAMPLERS)
        for mode in modes
        for n in (10**6, 10**7)
    ]
    meta = {"world": 8, "machine": {"cpu": "test", "cores": 2}}
    assert plot({"cases": cases, "meta": meta}, str(tmp_path / "plot.png"))
    width, height = _png_size(tmp_path / "plot.png")
    assert width <= SITE_WIDTH < height
