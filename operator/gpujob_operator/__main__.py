"""Allow ``python -m gpujob_operator``."""

import sys

from gpujob_operator.cli import main

sys.exit(main())
