"""``python -m benchmarks.peers``: see :mod:`benchmarks.peers.runner`."""

import sys

from benchmarks.peers.runner import main

sys.exit(main())
