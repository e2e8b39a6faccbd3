"""MkDocs hooks of the documentation site (mkdocs.yml, ``hooks:``).

``bench/plot.png`` is published as ``assets/plot.png`` from where it is, so the benchmarks page
shows the figure the benchmark writes without a second copy in docs/.
"""

from __future__ import annotations

import os
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def on_files(files: Files, config: Any) -> Files:
    files.append(
        File.generated(
            config, "assets/plot.png", abs_src_path=os.path.join(ROOT, "bench", "plot.png")
        )
    )
    return files
