"""MkDocs hooks of the documentation site (mkdocs.yml, ``hooks:``).

- ``bench/plot.png`` is published as ``assets/plot.png`` from where it is, so the benchmarks
  page shows the figure the benchmark writes without a second copy in docs/.
- ``docs/streams.md`` (the ShardedStream guide) is written on another branch. Until it is
  merged, a short stand-in page is generated in its place, so that the nav entry and the links
  to it resolve and ``mkdocs build --strict`` keeps failing on every other broken link. Once the
  file exists this hook does nothing for it.
"""

from __future__ import annotations

import os
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STREAMS_STAND_IN = """# Sharded streams

The guide to `fastshard.ShardedStream` (shards of records streamed by every rank and
DataLoader worker, with resume) is being written. Until it is published here, see the
[API reference](reference/streams.md) and, for Lightning, accelerate and the transformers
`Trainer`, [the frameworks guide](frameworks.md#sharded-streams-shardedstream).
"""


def on_files(files: Files, config: Any) -> Files:
    files.append(
        File.generated(
            config, "assets/plot.png", abs_src_path=os.path.join(ROOT, "bench", "plot.png")
        )
    )
    if files.get_file_from_path("streams.md") is None:
        files.append(File.generated(config, "streams.md", content=STREAMS_STAND_IN))
    return files
