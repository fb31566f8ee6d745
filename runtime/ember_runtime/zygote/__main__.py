"""``python -m ember_runtime.zygote ...``: a zygote process, started by the node agent."""

import sys

from ember_runtime.zygote.process import main

sys.exit(main())
