"""``python -m collectives.simulate``."""
import sys

from .cli import main

sys.exit(main())
