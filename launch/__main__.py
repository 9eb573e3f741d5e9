"""``python -m launch``."""

import sys

from launch.cli import main

sys.exit(main())
