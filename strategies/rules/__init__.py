"""The 43 rules, by the published levels (`graph`, `operator`, `memory`, `mathematical`). A rule
module imports the protocol (`strategies.base`, `strategies.registry`) and the analyses
(`strategies.analysis`), never another rule module; `strategies.catalog` imports them all."""
