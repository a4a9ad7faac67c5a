"""Multi-step search over program states (issue 8): chain, greedy, beam, BFS, DFS and MCTS drivers.

A *state* is a program reached from the root by a sequence of actions (strategy, site, params), each
proposed by a policy (`search.policies`). Every new state is verified against the ROOT
program (not only its parent) and, when it passes, timed against the root in the same session:
its reward is root time / state time. TVM stays out of this module: the caller passes

- `verify(root, state) -> status` (`exact`, `close`, or a failure status), and
- `measure(root, state) -> (root_us, state_us)` or `(root_us, state_us, spread)`, or None when the
  state cannot be timed.

Budgets: `Budget.states` counts states sent to verification (duplicates and rejected proposals cost
nothing), `Budget.wall_s` the wall time. States are de-duplicated by alpha hash. A run is
deterministic for a seed given deterministic callables: every random choice draws from
`random.Random(f"{seed}:...")` (in the policies), never the global RNG, never set order, and ties
between equal rewards break by creation order.
"""
from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from leir.ast import Program
from leir.canon import alpha_hash
from leir.printer import format_program
from leir.signature import Signature
from strategies.base import Context, Transformation

PASSING = ("exact", "close")
DRIVERS = ("chain", "greedy", "beam", "bfs", "dfs", "mcts")

VerifyFn = Callable[[Program, Program], str]
MeasureFn = Callable[[Program, Program], "tuple | None"]


@dataclass(frozen=True)
class Action:
    """One proposed step: the strategy, where and how, and the program it produces."""

    strategy: str
    params: dict
    after: Program = field(repr=False)
    site: dict = field(default_factory=dict)
    prior: float = 0.0
    source: str = "library"
    transformation: Transformation | None = field(default=None, repr=False, compare=False)


@dataclass
class Node:
    """A program state in the search tree. `speedup` is None unless it passed and was timed."""

    id: int
    program: Program = field(repr=False)
    text: str = field(repr=False)
    alpha: str
    parent: Node | None = field(default=None, repr=False)
    action: Action | None = None
    depth: int = 0
    status: str = "exact"
    root_us: float | None = None
    state_us: float | None = None
    spread: float | None = None
    speedup: float | None = None
    error: str = ""
    children: list[Node] = field(default_factory=list, repr=False)
    visits: int = 0          # MCTS statistics
    value: float = 0.0

    @property
    def accepted(self) -> bool:
        return self.status in PASSING and self.speedup is not None

    def path(self) -> list[Node]:
        """Root first, this node last."""
        out, node = [], self
        while node is not None:
            out.append(node)
            node = node.parent
        return out[::-1]


@dataclass(frozen=True)
class Budget:
    states: int = 24        # states sent to verification
    wall_s: float = 600.0


@dataclass(frozen=True)
class DriverConfig:
    """`depth`: longest trajectory; `branching`: new children evaluated per expanded node (greedy,
    bfs, dfs, mcts) or proposals per node (beam); `width`: beam width; `ucb_c`, `iterations`: MCTS."""

    depth: int = 4
    branching: int = 4
    width: int = 2
    ucb_c: float = 1.4
    iterations: int = 64


class Policy:
    """Proposes actions for a state, best first (lazily: the search takes what it needs)."""

    name = "policy"

    def actions(self, ctx: Context, node: Node, want: int) -> Iterator[Action]:
        raise NotImplementedError

    def observe(self, node: Node) -> None:
        """Told about every evaluated state (a learned ranking trains on the measured ones)."""


@dataclass
class SearchResult:
    driver: str
    policy: str
    seed: int
    root: Node
    best: Node
    nodes: list[Node]
    states_verified: int
    rejected: int
    duplicates: int
    wall_s: float
    stopped: str

    @property
    def trajectory(self) -> list[Node]:
        """The best state's path, without the root."""
        return self.best.path()[1:]

    def strategies(self) -> list[str]:
        return [n.action.strategy for n in self.trajectory]

    def to_json(self) -> dict:
        return {
            "best_speedup": self.best.speedup, "best_leir": self.best.text,
            "trajectory": [{"strategy": n.action.strategy, "params": n.action.params, "leir": n.text,
                            "status": n.status, "speedup": n.speedup, "spread": n.spread,
                            "root_us": n.root_us, "state_us": n.state_us, "source": n.action.source}
                           for n in self.trajectory],
            "states_verified": self.states_verified, "wall_s": round(self.wall_s, 3),
            "driver": self.driver, "policy": self.policy, "seed": self.seed, "rejected": self.rejected,
            "duplicates": self.duplicates, "stopped": self.stopped,
            "states": [{"id": n.id, "parent": n.parent.id if n.parent else None, "depth": n.depth,
                        "strategy": n.action.strategy if n.action else None, "status": n.status,
                        "speedup": n.speedup} for n in self.nodes],
        }


class Search:
    """The state space of one root program: evaluation, de-duplication, budgets, the best state."""

    def __init__(self, program: Program, signature: Signature, policy: Policy, verify: VerifyFn,
                 measure: MeasureFn, *, target: str = "llvm", budget: Budget = Budget(), seed: int = 0,
                 clock: Callable[[], float] = time.monotonic):
        self.signature, self.policy, self.target = signature, policy, target
        self._verify, self._measure = verify, measure
        self.budget, self.seed, self.clock = budget, seed, clock
        self.started = clock()
        self.root = Node(0, program, format_program(program), alpha_hash(program, signature),
                         speedup=1.0)
        self.nodes: list[Node] = [self.root]
        self.seen: dict[str, int] = {self.root.alpha: 0}
        self.states_verified = self.rejected = self.duplicates = 0
        self._proposals: dict[int, Iterator[Action]] = {}
        self._exhausted: set[int] = set()  # node ids (membership only, never iterated)

    # --- budgets ------------------------------------------------------------------------------

    def out_of_budget(self) -> str:
        if self.states_verified >= self.budget.states:
            return "states"
        if self.clock() - self.started >= self.budget.wall_s:
            return "wall_time"
        return ""

    # --- expansion ----------------------------------------------------------------------------

    def next_child(self, node: Node) -> Node | None:
        """Evaluate the node's next new proposal (duplicates skipped for free); None when the policy
        has nothing new or the budget is spent."""
        if node.id in self._exhausted:
            return None
        proposals = self._proposals.get(node.id)
        if proposals is None:
            ctx = Context(node.program, self.signature, self.target)
            proposals = self._proposals[node.id] = iter(self.policy.actions(ctx, node, 0))
        while not self.out_of_budget():
            action = next(proposals, None)
            if action is None:
                self._exhausted.add(node.id)
                return None
            child = self.evaluate(node, action)
            if child is not None:
                return child
        return None

    def expand(self, node: Node, k: int) -> list[Node]:
        """Up to `k` new children of `node` (passing or not), in proposal order."""
        out = []
        while len(out) < k:
            child = self.next_child(node)
            if child is None:
                break
            out.append(child)
        return out

    def exhausted(self, node: Node) -> bool:
        return node.id in self._exhausted

    def evaluate(self, parent: Node, action: Action) -> Node | None:
        """Verify the action's state against the root and time it; None for a duplicate state."""
        try:
            alpha = alpha_hash(action.after, self.signature)
        except Exception:  # a proposal the canonicaliser cannot read is not a state
            self.rejected += 1
            return None
        if alpha in self.seen:
            self.duplicates += 1
            return None
        node = Node(len(self.nodes), action.after, format_program(action.after), alpha, parent, action,
                    parent.depth + 1)
        self.seen[alpha] = node.id
        self.nodes.append(node)
        parent.children.append(node)
        self.states_verified += 1
        node.status = self._verify(self.root.program, node.program)
        if node.status in PASSING:
            timed = self._measure(self.root.program, node.program)
            if timed is None:
                node.error = "timing failed"
            else:
                node.root_us, node.state_us = float(timed[0]), float(timed[1])
                node.spread = float(timed[2]) if len(timed) > 2 and timed[2] is not None else None
                node.speedup = node.root_us / node.state_us if node.state_us > 0 else math.inf
        observe = getattr(self.policy, "observe", None)
        if observe is not None:
            observe(node)
        return node

    # --- results ------------------------------------------------------------------------------

    def best(self) -> Node:
        """Highest speedup among accepted states; earliest on ties (the root has 1.0)."""
        best = self.root
        for n in self.nodes:
            if n.accepted and n.speedup > best.speedup:
                best = n
        return best

    def result(self, driver: str, stopped: str = "") -> SearchResult:
        return SearchResult(driver, getattr(self.policy, "name", "policy"), self.seed, self.root, self.best(),
                            list(self.nodes), self.states_verified, self.rejected, self.duplicates,
                            self.clock() - self.started, stopped or self.out_of_budget() or "done")


def _rank(nodes: list[Node]) -> list[Node]:
    """Accepted nodes, fastest first; creation order breaks ties."""
    return sorted((n for n in nodes if n.accepted), key=lambda n: (-n.speedup, n.id))


# --- drivers ---------------------------------------------------------------------------------------

def chain(search: Search, cfg: DriverConfig) -> None:
    """Follow the policy: at each depth the first proposal that passes becomes the next state."""
    node = search.root
    for _ in range(cfg.depth):
        nxt = None
        while nxt is None:
            child = search.next_child(node)
            if child is None:
                return
            if child.accepted:
                nxt = child
        node = nxt


def greedy(search: Search, cfg: DriverConfig) -> None:
    """Hill climbing: evaluate `branching` children, move to the fastest if it beats the current."""
    node = search.root
    for _ in range(cfg.depth):
        ranked = _rank(search.expand(node, cfg.branching))
        if not ranked or ranked[0].speedup <= node.speedup:
            return
        node = ranked[0]


def beam(search: Search, cfg: DriverConfig) -> None:
    """Keep the `width` fastest states of each depth; each gets `branching` proposals evaluated."""
    frontier = [search.root]
    for _ in range(cfg.depth):
        children = []
        for node in frontier:
            children += search.expand(node, cfg.branching)
            if search.out_of_budget():
                break
        frontier = _rank(children)[:cfg.width]
        if not frontier or search.out_of_budget():
            return


def bfs(search: Search, cfg: DriverConfig) -> None:
    """Level by level up to `depth`, `branching` children per state."""
    queue = deque([search.root])
    while queue and not search.out_of_budget():
        node = queue.popleft()
        if node.depth >= cfg.depth:
            continue
        queue.extend(c for c in search.expand(node, cfg.branching) if c.accepted)


def dfs(search: Search, cfg: DriverConfig) -> None:
    """Depth first up to `depth`: each passing child is explored before its next sibling."""
    stack = [(search.root, 0)]  # (node, children evaluated so far)
    while stack and not search.out_of_budget():
        node, done = stack.pop()
        if node.depth >= cfg.depth or done >= cfg.branching:
            continue
        child = search.next_child(node)
        if child is None:
            continue
        stack.append((node, done + 1))
        if child.accepted:
            stack.append((child, 0))


def mcts(search: Search, cfg: DriverConfig) -> None:
    """UCB1 tree search: select by mean reward + c*sqrt(ln N / n), expand one new child, reward it
    with its speedup (0 when it fails), back the reward up to the root. A subtree with nothing left
    to expand is dead and never selected again."""
    dead: set[int] = set()  # node ids (membership only)
    for _ in range(cfg.iterations):
        if search.out_of_budget() or search.root.id in dead:
            return
        node = search.root
        while _can_expand(search, node, cfg) is False:
            live = [c for c in node.children if c.accepted and c.id not in dead]
            if not live:
                break
            node = max(live, key=lambda c: (_ucb(c, node, cfg.ucb_c), -c.id))
        child = search.next_child(node) if _can_expand(search, node, cfg) else None
        if child is None:
            _mark_dead(search, node, cfg, dead)
        leaf = child or node
        reward = leaf.speedup if leaf.accepted else 0.0
        for n in leaf.path():
            n.visits += 1
            n.value += reward


def _can_expand(search: Search, node: Node, cfg: DriverConfig) -> bool:
    return node.depth < cfg.depth and not search.exhausted(node) and len(node.children) < cfg.branching


def _ucb(child: Node, parent: Node, c: float) -> float:
    if child.visits == 0:
        return math.inf
    return child.value / child.visits + c * math.sqrt(math.log(max(parent.visits, 1)) / child.visits)


def _mark_dead(search: Search, node: Node | None, cfg: DriverConfig, dead: set[int]) -> None:
    """`node` and every ancestor left with nothing to expand and no live child."""
    while node is not None and not _can_expand(search, node, cfg) and not any(
            c.accepted and c.id not in dead for c in node.children):
        dead.add(node.id)
        node = node.parent


DRIVER_FUNCS = {"chain": chain, "greedy": greedy, "beam": beam, "bfs": bfs, "dfs": dfs, "mcts": mcts}


def run(program: Program, signature: Signature, driver: str, policy: Policy, verify: VerifyFn,
        measure: MeasureFn, *, budget: Budget = Budget(), seed: int = 0, config: DriverConfig = DriverConfig(),
        target: str = "llvm", clock: Callable[[], float] = time.monotonic) -> SearchResult:
    """One search from `program` with `driver` ("chain", "greedy", "beam", "bfs", "dfs", "mcts")."""
    if driver not in DRIVER_FUNCS:
        raise ValueError(f"unknown driver {driver!r}; drivers: {', '.join(DRIVERS)}")
    search = Search(program, signature, policy, verify, measure, target=target, budget=budget, seed=seed,
                    clock=clock)
    DRIVER_FUNCS[driver](search, config)
    return search.result(driver)
