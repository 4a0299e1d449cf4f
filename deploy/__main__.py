"""`python -m minibroker.deploy` is the `minibroker` command."""

import sys

from minibroker.deploy.cli import main

sys.exit(main())
