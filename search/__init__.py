"""Multi-step search over verified and timed program states.

`drivers` (chain, greedy, beam, bfs, dfs, mcts) and `policies` (library, random, llm) are pure: they
take `verify` and `measure` callables. `runner` backs those with TVM through `gpu_tasks` (worker
pools, interleaved timing) and is the entry point: `run_search(program, signature, driver, ...)`.
"""
