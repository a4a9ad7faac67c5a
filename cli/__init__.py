"""The `steptp` command line: `cli.main:app`, one module per command group. Nothing imports it."""
