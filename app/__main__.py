"""`python -m app <command>`."""

import sys

from app.cli import main

sys.exit(main())
