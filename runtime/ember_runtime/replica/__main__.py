"""``python -m ember_runtime.replica ...``: a replica process, started by the node agent."""

import sys

from ember_runtime.replica.process import main

sys.exit(main())
