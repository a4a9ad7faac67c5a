"""Scoring model outputs against the published pass metrics (`steptp eval`).

`response` parses and guards a model's answer, `label` recognises the strategy it names, `harness`
builds, runs, compares and times each prediction, `inputs` reads prediction files, `published`
re-verifies published chat JSONL.
"""
