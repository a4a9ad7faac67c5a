"""Multi-step search over verified and timed program states.

`drivers` (chain, greedy, beam, bfs, dfs, mcts) and `policies` (library, random, llm) are pure: they
take `verify` and `measure` callables. `analysis` estimates a state's time from the tree (parallel
extent, innermost strides, reuse), `macros` builds composite proposals out of atomic strategy steps
(micro-kernel, row kernel), `cost_model` ranks proposals (the lake's offline model and the analysis,
refined online). `runner` backs the callables with TVM through `gpu_tasks` (worker pools,
interleaved timing) and is the entry point: `run_search(program, signature, driver, ...)`.
"""
