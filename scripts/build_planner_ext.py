"""Compile the planner's search with Cython: `drover compile-planner` (cli/compile_planner.py),
as the Makefile and the image's build call it.

    .venv/bin/python scripts/build_planner_ext.py [--source DIR]
"""

from drover.cli import main

main(["compile-planner", *__import__("sys").argv[1:]])
