import sys

from cs336sys.cli import main

sys.exit(main())
