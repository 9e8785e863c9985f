"""``python -m dlscale.monitor``: the live table, or the sampler process (``--worker``)."""

import sys

from dlscale.monitor.cli import main

sys.exit(main())
