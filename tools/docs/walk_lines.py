#!/usr/bin/python3
"""Re-points docs/walk.md's `file:line` hops at the lines that now define their functions.

    tools/docs/walk_lines.py [--check]

Each table row "| n | `file:line` | `Name` | ..." names a function (or macro); after code
moves, this finds the line of Name's definition in the same file (a line holding
"Last(" that is not indented — a definition at namespace scope — else the first line
holding it) and rewrites the row. With --check it only reports rows it would change
(tests/test_coverage.cpp's Coverage.TheWalkPagePointsAtItsFunctions fails on the same rows).
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROW = re.compile(r"^(\| [^|]* \| `)([^`:]+):(\d+)(` \| `)([^`]+)(`.*)$")


def find_line(lines, name):
    last = name.split("::")[-1]
    token = last if re.fullmatch(r"[A-Z_]+", last) else last + "("
    qualified = name + "(" if token.endswith("(") else token
    for pick in (lambda l: l.startswith(qualified) or (qualified in l and not l[:1].isspace()),
                 lambda l: token in l and not l[:1].isspace(),
                 lambda l: token in l):
        for k, l in enumerate(lines):
            if pick(l):
                return k + 1
    return None


def main():
    check = "--check" in sys.argv[1:]
    path = os.path.join(ROOT, "docs", "walk.md")
    out, changed = [], 0
    for row in open(path).read().split("\n"):
        m = ROW.match(row)
        if m:
            file, line, name = m.group(2), int(m.group(3)), m.group(5)
            lines = open(os.path.join(ROOT, file)).read().split("\n")
            last = name.split("::")[-1]
            token = last if re.fullmatch(r"[A-Z_]+", last) else last + "("
            if not (0 < line <= len(lines) and token in lines[line - 1]):
                new = find_line(lines, name)
                if new is None:
                    sys.exit(f"docs/walk.md: {name} is no longer in {file}")
                print(f"{file}:{line} -> {file}:{new}  {name}")
                row = f"{m.group(1)}{file}:{new}{m.group(4)}{name}{m.group(6)}"
                changed += 1
        out.append(row)
    if changed and not check:
        with open(path + ".tmp", "w") as f:
            f.write("\n".join(out))
        os.replace(path + ".tmp", path)
    sys.exit(1 if changed and check else 0)


if __name__ == "__main__":
    main()
