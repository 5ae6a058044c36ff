"""Compares two folders of kernel sources (KILN_DIGEST_SOURCES of
codegen_digest) up to layout: each line's leading whitespace removed, then
compared (the proof for a change of CodeWriter::lay_out, or for generators
that stop counting spaces). Exit 0 when every kernel is equal so.

    python3 tests/tools/same_up_to_layout.py BASE_DIR TREE_DIR"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from same_up_to_names import compare  # noqa: E402


def unlaid(text):
    return "\n".join(line.lstrip(" \t") for line in text.split("\n"))


if __name__ == "__main__":
    sys.exit(compare(*map(pathlib.Path, sys.argv[1:3]), unlaid, "layout"))
