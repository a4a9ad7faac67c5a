"""Operator-level rules: loop transformations on one nest (or two adjacent nests)."""
