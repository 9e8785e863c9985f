import sys

from dlscale.cli import main

sys.exit(main())
