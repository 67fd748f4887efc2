#!/usr/bin/env python3
"""Functions longer than a limit (default 100 lines) in the C and C++ sources.

    scripts/long_functions.py [--limit N] [DIR ...]     (default DIRS: src mpi python/src)

A function is counted from the first line of its signature to its closing brace, both
included, as the house style writes one: the signature from column 0, the opening and
closing braces alone on their lines at column 0 (/work/shared/STYLE.md; clang-format's
Linux braces). Prints "file:line: name N lines" per offender, longest first, and exits 1
when there is any (0 otherwise), so that it can run as a test.
"""
import argparse
import os
import re
import sys

EXTS = (".c", ".h", ".cpp", ".cc", ".hpp")
# a name, or a macro that makes one (FA_AMX_FN(fwd_bf16)), before its parameters
NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_:~]*(?:\([A-Za-z0-9_]+\))?)\s*\(")


def functions(path):
    lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
    i = 0
    while i < len(lines):
        if lines[i] == "{" and i > 0:
            # the signature: the lines above, back to one at column 0 that is not a
            # continuation (a blank line, a comment, a preprocessor line or a ';' end it)
            s = i - 1
            while s > 0 and lines[s][:1] in (" ", "\t") and lines[s].strip():
                s -= 1
            sig = " ".join(l.strip() for l in lines[s:i])
            m = NAME.search(sig)
            end = i + 1
            while end < len(lines) and lines[end] != "}" and not lines[end].startswith("};"):
                end += 1
            if m and not sig.rstrip().endswith(";") and not re.match(r"(struct|union|enum|typedef)\b", sig) \
                    and "=" not in sig.split("(")[0]:
                yield m.group(1), s + 1, end - s + 1
            i = end
        i += 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("dirs", nargs="*", default=["src", "mpi", "python/src"])
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = []
    for d in args.dirs:
        top = d if os.path.isabs(d) else os.path.join(root, d)
        for dirpath, _, files in os.walk(top):
            for f in sorted(files):
                if f.endswith(EXTS):
                    path = os.path.join(dirpath, f)
                    for name, line, n in functions(path):
                        if n > args.limit:
                            found.append((n, os.path.relpath(path, root), line, name))
    for n, path, line, name in sorted(found, reverse=True):
        print(f"{path}:{line}: {name} {n} lines")
    print(f"{len(found)} function(s) over {args.limit} lines")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
