"""Bucket planning and its economics: the planner (pure numpy), grids over two varying dimensions, and what
a compile costs on each target."""
