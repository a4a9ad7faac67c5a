"""The analyses the rules share, owned by no rule: tree addressing and edits (`tree`), dependences and
iteration counts (`legality`), loop transformations several rules build on (`loops`), the final
checks on a rewritten program (`gates`), what a dtype can hold (`numerics`, `ranges`, `magnitudes`),
the sympy bridge and what algebra may touch (`sympy_bridge`, `algebra`), the dataflow patterns over
nests (`reductions`, `stacked`) and the prose helpers (`prose`). Nothing here imports a rule."""
