import sys

from pqloader.cli import main

sys.exit(main())
