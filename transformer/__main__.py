import sys

from transformer.console import main

sys.exit(main())
