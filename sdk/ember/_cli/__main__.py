import sys

from ember._cli import main

sys.exit(main())
