"""``python -m collectives.simulator``: the launcher of the simulator's command-line tool."""
import sys

from ..tools.simulate_cli import main

sys.exit(main())
