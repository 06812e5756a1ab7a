"""A keeper with no engine, for specbuild.engines.keepers' tests: it serves until idle or asked to
stop, and says so in its log."""

import sys
from pathlib import Path

from specbuild.engines import keepers

if __name__ == "__main__":
    keepers.serve_until_idle(
        Path(sys.argv[1]),
        float(sys.argv[2]),
        tick=lambda: None,
        stop=lambda: print("stopped", flush=True),
    )
