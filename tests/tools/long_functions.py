"""Lists the functions of compiler/, codegen/ and runtime/ longer than a
limit (default 80 lines), longest first: a definition opens at column 0
(or 2 inside a class) with a line ending in `{` and closes at the `}` of the
same indent. Exit 1 when any is over the limit.

    python3 tests/tools/long_functions.py [LIMIT]"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONTROL = ("if ", "if(", "for ", "while ", "switch ", "} else", "else", "do ", "case ", "return ", "namespace", "struct ",
           "class ", "enum ", "union ", "extern ", "template")


def functions(path):
    """(lines, where, name) of each function definition in `path`."""
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.rstrip().endswith("{") or "=" in line.split("(")[0]:
            i += 1
            continue
        start = i  # the signature may begin lines earlier (a continued parameter list)
        while start > 0 and lines[start - 1].rstrip().endswith((",", "(")):
            start -= 1
        head = lines[start]
        indent = len(head) - len(head.lstrip())
        if indent not in (0, 2) or "(" not in head or head.lstrip().startswith(CONTROL) or not re.match(r"\s*[A-Za-z_]", head):
            i += 1
            continue
        close = " " * indent + "}"
        j = i + 1
        while j < len(lines) and not (lines[j] == close or lines[j].startswith(close + ";")):
            j += 1
        name = re.search(r"([\w:~]+)\s*\(", head)
        yield j - start + 1, f"{path.relative_to(ROOT)}:{start + 1}", name[1] if name else head.strip()
        i = j + 1


def main():
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 80
    found = []
    for layer in ("compiler", "codegen", "runtime"):
        for path in sorted((ROOT / layer).rglob("*.cpp")) + sorted((ROOT / layer).rglob("*.h")):
            found += [f for f in functions(path) if f[0] > limit]
    for length, where, name in sorted(found, reverse=True):
        print(f"{length:5d}  {name}  ({where})")
    print(f"{len(found)} functions over {limit} lines")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
