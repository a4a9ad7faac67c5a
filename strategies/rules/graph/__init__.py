"""Graph-level rules: which statements and nests exist, what they compute and in which order."""
