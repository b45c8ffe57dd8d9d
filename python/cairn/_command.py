"""The `cairn` command of an installed package: runs the program installed beside this
module (cairn/bin/cairn), with the same arguments, in this process's place."""

import os
import sys


def program() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "cairn")


def main() -> None:
    path = program()
    if not os.access(path, os.X_OK):
        sys.exit(f"cairn: the program {path} is missing from this installation of the cairn "
                 "package (reinstall it: pip install --force-reinstall cairn)")
    os.execv(path, ["cairn"] + sys.argv[1:])


if __name__ == "__main__":
    main()
