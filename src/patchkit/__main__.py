"""`python -m patchkit`: the command line."""

from patchkit.cli import main

main()
