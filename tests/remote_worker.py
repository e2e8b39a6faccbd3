"""One rank of test_remote.py's share_counts test (not collected by pytest).

    python remote_worker.py RANK WORLD_SIZE PORT

Every rank builds the three readers over the bucket named by FASTSHARD_TEST_BUCKET with
share_counts=True (rank 0 reads the index, footers and index.json and broadcasts them) and
reads its share of one epoch with two DataLoader workers.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from fastshard import ShardedStream, readers

BUCKET = os.environ.get("FASTSHARD_TEST_BUCKET", "data")


def epoch(shards: readers.Shards) -> list[int]:
    stream = ShardedStream(shards.sizes, shards.read, batch_size=8, seed=5, pad=False)
    loader = torch.utils.data.DataLoader(
        stream, batch_size=8, num_workers=2, collate_fn=lambda x: [int(i["id"]) for i in x]
    )
    return [k for batch in loader for k in batch]


def shared() -> dict[str, Any]:
    tar = readers.tar_shards(index=f"s3://{BUCKET}/tar/index.json", share_counts=True)
    names = [f"s3://{BUCKET}/pq/part-{s:03d}.parquet" for s in range(int(os.environ["SHARDS"]))]
    parquet = readers.parquet_shards(names, share_counts=True)
    mds = readers.mds_shards(f"s3://{BUCKET}/mds/index.json", share_counts=True)
    return {"tar": epoch(tar), "parquet": epoch(parquet), "mds": epoch(mds)}


if __name__ == "__main__":
    import dist_worker  # beside this script: the same group and sentinel checks

    dist_worker.main({"shared": shared})
