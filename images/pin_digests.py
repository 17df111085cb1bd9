"""Record pushed image digests in components/images.py, so compiled YAML names ``repo:tag@sha256:...``.

    python images/pin_digests.py cpu=sha256:<64 hex> cuda=sha256:<64 hex>
    quarl compile --all        # then re-compile: components and pipelines now pin the digests

Run by CI after `docker buildx build --push` (.github/workflows/images.yml); the digest is the
one the registry returned for the pushed manifest. Only the ``DIGESTS`` literal is rewritten.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

IMAGES_PY = Path(__file__).resolve().parent.parent / "components" / "images.py"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def pin(pairs: dict[str, str], path: Path = IMAGES_PY) -> str:
    text = path.read_text()
    for kind, digest in pairs.items():
        if not DIGEST.fullmatch(digest):
            raise SystemExit(f"{kind}: {digest!r} is not a sha256:<64 hex> digest")
        pat = re.compile(rf'^(\s*"{re.escape(kind)}":\s*)(None|"sha256:[0-9a-f]{{64}}"),\s*$', re.MULTILINE)
        if not pat.search(text):
            raise SystemExit(f"{path}: no DIGESTS entry for image kind {kind!r}")
        text = pat.sub(lambda m, d=digest: f'{m.group(1)}"{d}",', text, count=1)
    path.write_text(text)
    return text


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    pairs = dict(a.split("=", 1) for a in argv)
    pin(pairs)
    print(f"pinned {', '.join(f'{k}={v[:19]}...' for k, v in pairs.items())} in {IMAGES_PY}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
