import sys

from transformer.cli import main

sys.exit(main())
