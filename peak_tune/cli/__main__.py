"""`python -m peak_tune.cli`."""

import sys

from peak_tune.cli.main import main

sys.exit(main())
