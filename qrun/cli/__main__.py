"""`python -m qrun.cli FILE.tmpl ...`: the `qrun` command."""

import sys

from qrun.cli.command import main

sys.exit(main())
