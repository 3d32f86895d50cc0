import sys

from htmqc.cli import main

sys.exit(main())
