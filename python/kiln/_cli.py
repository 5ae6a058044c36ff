"""The `kiln` console script: runs the command-line tool installed with the package."""
import os
import sys

from ._warm import binary


def main() -> None:
    os.execv(binary(), [binary(), *sys.argv[1:]])
