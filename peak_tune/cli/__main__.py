"""`python -m peak_tune.cli`."""

import sys

from peak_tune.cli.app import main

sys.exit(main())
