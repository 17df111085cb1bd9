"""Where the tests find real datasets that are never committed (GSM8K).

``$QUARL_GSM8K_DIR`` if set, else ``shared/data/gsm8k`` beside the checkout (the project's
layout: a checkout at ``<root>/<name>`` shares ``<root>/shared``). Tests needing it skip
when it is absent; no absolute path is written into a test.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GSM8K_DIR = Path(os.environ.get("QUARL_GSM8K_DIR") or REPO.parent / "shared" / "data" / "gsm8k")
