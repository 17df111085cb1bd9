"""A kernel benchmark's outputs: its rows as JSON beside the markdown table RESULTS.md quotes."""

from __future__ import annotations

import json
import os


def write_outputs(out: str, stem: str, info: dict, rows: list[dict], md: str | None) -> None:
    """``OUT/STEM.json`` ({info, rows}) and, with ``md``, ``OUT/STEM.md`` (also printed)."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{stem}.json"), "w") as f:
        json.dump({"info": info, "rows": rows}, f, indent=1)
    if md is not None:
        with open(os.path.join(out, f"{stem}.md"), "w") as f:
            f.write(md)
        print(md)
