import sys

from .info import main

sys.exit(main())
