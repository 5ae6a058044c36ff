"""Compares two folders of kernel sources (KILN_DIGEST_SOURCES of
codegen_digest) up to the emitter's variable names: each file's names of the
forms v7, c12, l3, row4, s5, e6, r8 renumbered in the order they first
appear, then compared. Exit 0 when every kernel is equal so.

    python3 tests/tools/same_up_to_names.py BASE_DIR TREE_DIR"""
import pathlib
import re
import sys

FRESH = re.compile(r"\b(v|c|l|row|s|e|r)(\d+)\b")


def renumbered(text):
    seen = {}

    def name(m):
        return seen.setdefault(m.group(0), f"{m.group(1)}{len(seen)}")
    return FRESH.sub(name, text)


def compare(base, tree, normalised, what):
    """Compares every kernel file of folder `base` with `tree`'s after
    `normalised`; prints the count and the first that differ. Exit status."""
    files = sorted(p.name for p in base.iterdir())
    missing = [f for f in files if not (tree / f).exists()]
    differ = [f for f in files if f not in missing and normalised((base / f).read_text()) != normalised((tree / f).read_text())]
    print(f"{len(files)} kernels: {len(files) - len(differ) - len(missing)} equal up to {what}, "
          f"{len(differ)} differ, {len(missing)} missing")
    for f in (differ + missing)[:10]:
        print("  ", f)
    return 1 if differ or missing else 0


def main():
    base, tree = map(pathlib.Path, sys.argv[1:3])
    return compare(base, tree, renumbered, "the emitter's variable names")


if __name__ == "__main__":
    sys.exit(main())
