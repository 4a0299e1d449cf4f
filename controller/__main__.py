"""`python -m minibroker.controller`: the same as `minibroker controller`."""

import argparse
import sys

from minibroker.controller.cli import add_arguments

parser = argparse.ArgumentParser(prog="python -m minibroker.controller")
add_arguments(parser)
args = parser.parse_args()
sys.exit(args.func(args))
