import sys

from kvcheck.cli import main

sys.exit(main())
