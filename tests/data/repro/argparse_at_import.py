"""A target module that parses the command line at import time (kvtool's argv is not its own)."""

import argparse

parser = argparse.ArgumentParser()
parser.add_argument("--ckpt")
args = parser.parse_args()


def make():
    raise AssertionError("never reached: the import exits")
