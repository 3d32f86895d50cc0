"""``python -m proofs``: run every Z3 proof and mutant (see :mod:`proofs`)."""

import sys

from proofs.run import main

sys.exit(main())
