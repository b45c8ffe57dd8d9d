"""`python -m cairn ...`: the cairn command (cairn._command)."""

from ._command import main

main()
