"""Reading a prepared dataset artifact (for the RL and eval stages).

    df = read_split(uri, "train")          # pandas DataFrame, schema of quarl.data.schema
    tables = read_dataset(uri)             # {"train": df, "eval": df}

Goes through ``quarl.artifacts.open_artifact`` so an incomplete or corrupt
dataset (or the wrong kind of artifact) fails with the artifact's own error
before a single row is used.
"""

from __future__ import annotations

import pandas as pd
import pyarrow.parquet as pq

from quarl.data.schema import COLUMNS, SCHEMA_VERSION

__all__ = ["read_dataset", "read_split"]

SPLITS = ("train", "eval")


def read_split(uri: str, split: str = "train", verify: bool = True) -> pd.DataFrame:
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: a quarl dataset has {', '.join(SPLITS)}")
    return read_dataset(uri, verify=verify, splits=(split,))[split]


def read_dataset(uri: str, verify: bool = True, splits: tuple[str, ...] = SPLITS) -> dict[str, pd.DataFrame]:
    from quarl.artifacts import ArtifactError, open_artifact

    art = open_artifact(uri, kind="dataset", verify=verify)
    version = art.manifest.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ArtifactError(
            f"{uri} has dataset schema version {version}, this quarl reads {SCHEMA_VERSION}; "
            "re-run data-prep with this version"
        )
    out = {}
    for split in splits:
        df = pq.read_table(art.file(f"{split}.parquet")).to_pandas()
        missing = [c for c in COLUMNS if c not in df.columns]
        if missing:
            raise ArtifactError(f"{uri}: {split}.parquet lacks columns {missing}; re-run data-prep")
        out[split] = df
    return out
