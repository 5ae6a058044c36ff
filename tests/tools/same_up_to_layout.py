"""Compares two folders of kernel sources (KILN_DIGEST_SOURCES of
codegen_digest) up to layout: each line's leading whitespace removed, then
compared (the proof for a change of CodeWriter::lay_out, or for generators
that stop counting spaces). Exit 0 when every kernel is equal so.

    python3 tests/tools/same_up_to_layout.py BASE_DIR TREE_DIR"""
import pathlib
import sys


def unlaid(text):
    return "\n".join(line.lstrip(" \t") for line in text.split("\n"))


def main():
    base, tree = map(pathlib.Path, sys.argv[1:3])
    files = sorted(p.name for p in base.iterdir())
    missing = [f for f in files if not (tree / f).exists()]
    differ = [f for f in files if f not in missing and unlaid((base / f).read_text()) != unlaid((tree / f).read_text())]
    print(f"{len(files)} kernels: {len(files) - len(differ) - len(missing)} equal up to layout, "
          f"{len(differ)} differ, {len(missing)} missing")
    for f in (differ + missing)[:10]:
        print("  ", f)
    return 1 if differ or missing else 0


if __name__ == "__main__":
    sys.exit(main())
