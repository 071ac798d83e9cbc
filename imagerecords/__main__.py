"""`python -m imagerecords ...` is the same as the `imagerecords` command."""

import sys

from imagerecords.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
