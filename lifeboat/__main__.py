import sys

from lifeboat.cli import main

sys.exit(main())
