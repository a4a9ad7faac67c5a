"""Multi-step search over program states: chain, greedy, beam, BFS, DFS and MCTS drivers.

A *state* is a program reached from the root by a sequence of actions (strategy, site, params), each
proposed by a policy (`search.policies`). Every new state is verified against the ROOT
program (not only its parent) and, when it passes, timed against the root in the same session:
its reward is root time / state time. TVM stays out of this module: the caller passes

- `verify(root, state) -> status` (`exact`, `close`, or a failure status), and
- `measure(root, state) -> (root_us, state_us)` or `(root_us, state_us, spread)`, or None when the
  state cannot be timed;
- optionally `verify_many(root, states) -> statuses`, verifying states side by side: each state is
  then verified together with the state the policy would propose next if it learned nothing more
  (`Policy.upcoming`, or a macro's next step), on another core, and that verdict is kept for the
  state's turn. Timing stays alone on the machine; the search takes the same path with or without
  it, since a verdict does not depend on when it was computed.

A *macro* action (`Action.steps`, `search.macros`) is several atomic actions offered as one
proposal: each step becomes a state of its own, verified against the root and recorded in the tree
(the trajectory stays step-level); its last state is timed (every one with
`DriverConfig.time_macro_steps`) and counts as one successor of the state the macro started from.

Budgets: `Budget.states` counts states sent to verification (duplicates and rejected proposals cost
nothing; each new step of a macro counts), `Budget.wall_s` the wall time. States are de-duplicated
by alpha hash. A run is
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
VerifyManyFn = Callable[[Program, list[Program]], list[str]]
MeasureFn = Callable[[Program, Program], "tuple | None"]
# Verdicts of a state verified ahead of its turn that are not kept: the worker's time limit for such a
# state is shorter, and a crash may be the machine's, so its turn verifies it again.
UNSETTLED = ("timeout", "crash")


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
    # A macro action (search.macros): its atomic steps in order, each an Action of one strategy; the
    # search verifies and records every one of them as a state. Empty for an atomic action.
    steps: tuple[Action, ...] = field(default=(), repr=False, compare=False)

    @property
    def move(self) -> str:
        """What kind of move this is (a macro's name, else the strategy): proposals of one kind are
        spread out by the ranking, and a beam keeps one state per kind and origin."""
        return self.strategy


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
    # States one proposal made from this node reached and timed: its accepted children, and the last
    # state of each macro started here (whose intermediate states are children of each other).
    successors: list[Node] = field(default_factory=list, repr=False)
    origin: Node | None = field(default=None, repr=False)  # the state the proposal was made from
    move: str = ""           # the proposal's kind (strategy or macro name)
    proposals: int = 0       # proposals evaluated from this state (a macro counts one)
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
    """`depth`: longest trajectory (in atomic steps; a macro's steps count one each); `branching`:
    new proposals evaluated per expanded node; `width`: beam width; `ucb_c`, `iterations`: MCTS;
    `widen`: how many times greedy expands one state (`branching` proposals each time) before it
    restarts from the next-best state; `time_macro_steps`: time every intermediate state of a macro
    too (by default only its last state is timed; every one is verified)."""

    depth: int = 64
    branching: int = 4
    width: int = 2
    ucb_c: float = 1.4
    iterations: int = 64
    widen: int = 2
    time_macro_steps: bool = False


class Policy:
    """Proposes actions for a state, best first (lazily: the search takes what it needs)."""

    name = "policy"

    def actions(self, ctx: Context, node: Node, want: int) -> Iterator[Action]:
        raise NotImplementedError

    def observe(self, node: Node) -> None:
        """Told about every evaluated state (a learned ranking trains on the measured ones)."""

    def upcoming(self) -> Action | None:
        """The proposal the iterator `actions` advanced last would give next if nothing more were
        observed (the search verifies it ahead, on an idle core), or None when unknown."""
        return None


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
    verified_ahead: int = 0   # states verified ahead of their turn (verify_many), and of those
    used_ahead: int = 0       # the ones the search then reached

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
            "duplicates": self.duplicates, "stopped": self.stopped, "verified_ahead": self.verified_ahead,
            "used_ahead": self.used_ahead,
            "states": [{"id": n.id, "parent": n.parent.id if n.parent else None, "depth": n.depth,
                        "strategy": n.action.strategy if n.action else None, "status": n.status,
                        "speedup": n.speedup} for n in self.nodes],
        }


class Search:
    """The state space of one root program: evaluation, de-duplication, budgets, the best state."""

    def __init__(self, program: Program, signature: Signature, policy: Policy, verify: VerifyFn,
                 measure: MeasureFn, *, target: str = "llvm", budget: Budget = Budget(), seed: int = 0,
                 clock: Callable[[], float] = time.monotonic, time_macro_steps: bool = False,
                 extensions: tuple[str, ...] | None = None, verify_many: VerifyManyFn | None = None):
        self.signature, self.policy, self.target = signature, policy, target
        self.extensions = extensions
        self.time_macro_steps = time_macro_steps
        self._verify, self._measure, self._verify_many = verify, measure, verify_many
        self._ahead: dict[str, str] = {}  # program text -> verdict of a state verified ahead of its turn
        self.verified_ahead = self.used_ahead = 0
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
            ctx = Context(node.program, self.signature, self.target,
                          **({} if self.extensions is None else {"extensions": tuple(self.extensions)}))
            proposals = self._proposals[node.id] = iter(self.policy.actions(ctx, node, 0))
        while not self.out_of_budget():
            action = next(proposals, None)
            if action is None:
                self._exhausted.add(node.id)
                return None
            child = self.evaluate(node, action)
            if child is not None:
                node.proposals += 1
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

    def _alpha(self, program: Program) -> str | None:
        try:
            return alpha_hash(program, self.signature)
        except Exception:  # a proposal the canonicaliser cannot read is not a state
            return None

    def evaluate(self, parent: Node, action: Action) -> Node | None:
        """Verify the action's state against the root and time it; None for a duplicate state. A
        macro's steps are evaluated one by one (`_evaluate_macro`)."""
        if action.steps:
            return self._evaluate_macro(parent, action)
        alpha = self._alpha(action.after)
        if alpha is None:
            self.rejected += 1
            return None
        if alpha in self.seen:
            self.duplicates += 1
            return None
        node = self._new_state(parent, action, alpha, parent, action.move, timed=True)
        if node.accepted:
            parent.successors.append(node)
        return node

    def _new_state(self, parent: Node, action: Action, alpha: str, origin: Node, move: str, timed: bool,
                   then: Program | None = None) -> Node:
        """A new state: verified against the root, timed against it when it passes and `timed`.
        `then`: the state that comes next if the current proposal goes on (a macro's next step);
        otherwise the policy's upcoming proposal is verified ahead."""
        node = Node(len(self.nodes), action.after, format_program(action.after), alpha, parent, action,
                    parent.depth + 1, origin=origin, move=move)
        self.seen[alpha] = node.id
        self.nodes.append(node)
        parent.children.append(node)
        self.states_verified += 1
        node.status = self._status(node, then)
        if node.status in PASSING and timed:
            timed_us = self._measure(self.root.program, node.program)
            if timed_us is None:
                node.error = "timing failed"
            else:
                node.root_us, node.state_us = float(timed_us[0]), float(timed_us[1])
                node.spread = float(timed_us[2]) if len(timed_us) > 2 and timed_us[2] is not None else None
                node.speedup = node.root_us / node.state_us if node.state_us > 0 else math.inf
        observe = getattr(self.policy, "observe", None)
        if observe is not None:
            observe(node)
        return node

    def _status(self, node: Node, then: Program | None) -> str:
        """The node's verdict: kept from a verification ahead of its turn, or verified now, together
        with the state most likely asked for next when there is one and `verify_many`."""
        known = self._ahead.pop(node.text, None)
        if known is not None:
            self.used_ahead += 1
            return known
        ahead = self._next_state(then) if self._verify_many is not None else None
        if ahead is None:
            return self._verify(self.root.program, node.program)
        status, ahead_status = self._verify_many(self.root.program, [node.program, ahead[1]])
        self.verified_ahead += 1
        if ahead_status not in UNSETTLED:
            self._ahead[ahead[0]] = ahead_status
        return status

    def _next_state(self, then: Program | None) -> tuple[str, Program] | None:
        """(text, program) of the new state to verify ahead: `then`, else the policy's upcoming
        proposal (a macro's first new step); None when there is none or the budget has no room."""
        if self.states_verified >= self.budget.states:
            return None
        if then is None:
            peek = getattr(self.policy, "upcoming", None)
            action = peek() if peek is not None else None
            if action is None:
                return None
            steps = action.steps or (action,)
            then = next((s.after for s in steps if self._alpha(s.after) not in self.seen), None)
        alpha = self._alpha(then) if then is not None else None
        if alpha is None or alpha in self.seen:
            return None
        text = format_program(then)
        return None if text in self._ahead else (text, then)

    def _evaluate_macro(self, start: Node, macro: Action) -> Node | None:
        """Each step of the macro as a state of its own, verified against the root and recorded (a
        step that reaches a state seen before continues from it at no cost); the last state is
        timed (every one with `time_macro_steps`). Stops at the first step that fails. None when the
        macro reaches nothing new, or needs more states than the budget has left."""
        alphas = [self._alpha(step.after) for step in macro.steps]
        if any(a is None for a in alphas):
            self.rejected += 1
            return None
        new = sum(a not in self.seen for a in dict.fromkeys(alphas))
        if new == 0 or alphas[-1] in self.seen:
            self.duplicates += 1
            return None
        if self.budget.states - self.states_verified < new:
            return None
        node = start
        for k, (step, alpha) in enumerate(zip(macro.steps, alphas, strict=True)):
            if alpha in self.seen:
                seen = self.nodes[self.seen[alpha]]
                if seen.status not in PASSING or seen.text != format_program(step.after):
                    # failed before, or the same state under other names: the next step's record would
                    # not start from the recorded text
                    self.duplicates += 1
                    return None
                node = seen
                continue
            if self.out_of_budget():
                return node if node is not start else None   # wall time spent inside the macro
            last = k == len(macro.steps) - 1
            then = None if last else macro.steps[k + 1].after
            node = self._new_state(node, step, alpha, start, macro.move, timed=last or self.time_macro_steps,
                                   then=then)
            if node.status not in PASSING:
                return node
        if node.accepted:
            start.successors.append(node)
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
                            self.clock() - self.started, stopped or self.out_of_budget() or "done",
                            self.verified_ahead, self.used_ahead)


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
    """Hill climbing with restarts: evaluate `branching` proposals of the current state and move to
    the fastest state reached if it beats the current one. A state whose proposals bring nothing
    better is widened (its next `branching` proposals, `widen` expansions in all); then the climb
    restarts from the fastest state that still has proposals left (best first), until the budget
    is spent or no state has anything left to propose."""
    node: Node | None = search.root
    expansions: dict[int, int] = {}
    while node is not None and not search.out_of_budget():
        if node.depth < cfg.depth and not search.exhausted(node):
            search.expand(node, cfg.branching)
            expansions[node.id] = expansions.get(node.id, 0) + 1
        ranked = _rank(node.successors)
        if ranked and ranked[0].speedup > node.speedup:
            node = ranked[0]
            continue
        node = _restart(search, cfg, expansions)


def _restart(search: Search, cfg: DriverConfig, expansions: dict[int, int]) -> Node | None:
    """The fastest accepted state that can still be expanded (fewer than `widen` expansions)."""
    for n in _rank(search.nodes):
        if n.depth < cfg.depth and not search.exhausted(n) and expansions.get(n.id, 0) < cfg.widen:
            return n
    return None


def diverse(ranked: list[Node], k: int) -> list[Node]:
    """The first `k` of `ranked` (fastest first) taking one state per (origin, move) before a second
    one: four tilings of one state do not fill a beam while a parallelised state waits."""
    picked, later, kinds = [], [], set()
    for n in ranked:
        key = (n.origin.id if n.origin is not None else -1, n.move)
        (later if key in kinds else picked).append(n)
        kinds.add(key)
    return (picked + later)[:k]


def beam(search: Search, cfg: DriverConfig) -> None:
    """Keep the `width` fastest states, diverse in their last move (`diverse`); each gets `branching`
    proposals evaluated. A state of the beam whose children are all slower stays in it (with its next
    proposals), so the beam never stalls while states have proposals left."""
    frontier = [search.root]
    while frontier and not search.out_of_budget():
        reached = []
        for node in frontier:
            reached += search.expand(node, cfg.branching)
            if search.out_of_budget():
                return
        pool = [n for n in {n.id: n for n in frontier + reached}.values()
                if n.accepted and n.depth < cfg.depth and not search.exhausted(n)]
        frontier = diverse(_rank(pool), cfg.width)


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
    """UCB1 tree search: select by mean reward + c*sqrt(ln N / n) among the states each proposal
    reached (a macro's last state counts as one successor), expand one new proposal, reward it with
    log2(1 + speedup) (0 when it fails), back the reward up to the root. A subtree with nothing
    left to expand is dead and never selected again."""
    dead: set[int] = set()  # node ids (membership only)
    for _ in range(cfg.iterations):
        if search.out_of_budget() or search.root.id in dead:
            return
        node = search.root
        while _can_expand(search, node, cfg) is False:
            live = [c for c in node.successors if c.id not in dead]
            if not live:
                break
            node = max(live, key=lambda c: (_ucb(c, node, cfg.ucb_c), -c.id))
        child = search.next_child(node) if _can_expand(search, node, cfg) else None
        if child is None:
            _mark_dead(search, node, cfg, dead)
        leaf = child or node
        reward = math.log2(1.0 + leaf.speedup) if leaf.accepted else 0.0
        for n in _tree_path(leaf):
            n.visits += 1
            n.value += reward


def _tree_path(node: Node) -> list[Node]:
    """The states from the root to `node` as MCTS sees them: through each proposal's origin (a
    macro's intermediate states are not decisions of the tree)."""
    out = []
    while node is not None:
        out.append(node)
        node = node.origin if node.origin is not None else node.parent
    return out[::-1]


def _can_expand(search: Search, node: Node, cfg: DriverConfig) -> bool:
    return node.depth < cfg.depth and not search.exhausted(node) and node.proposals < cfg.branching


def _ucb(child: Node, parent: Node, c: float) -> float:
    if child.visits == 0:
        return math.inf
    return child.value / child.visits + c * math.sqrt(math.log(max(parent.visits, 1)) / child.visits)


def _mark_dead(search: Search, node: Node | None, cfg: DriverConfig, dead: set[int]) -> None:
    """`node` and every ancestor left with nothing to expand and no live successor."""
    while node is not None and not _can_expand(search, node, cfg) and not any(
            c.id not in dead for c in node.successors):
        dead.add(node.id)
        node = node.origin if node.origin is not None else node.parent


DRIVER_FUNCS = {"chain": chain, "greedy": greedy, "beam": beam, "bfs": bfs, "dfs": dfs, "mcts": mcts}


def run(program: Program, signature: Signature, driver: str, policy: Policy, verify: VerifyFn,
        measure: MeasureFn, *, budget: Budget = Budget(), seed: int = 0, config: DriverConfig = DriverConfig(),
        target: str = "llvm", clock: Callable[[], float] = time.monotonic,
        extensions: tuple[str, ...] | None = None, verify_many: VerifyManyFn | None = None) -> SearchResult:
    """One search from `program` with `driver` ("chain", "greedy", "beam", "bfs", "dfs", "mcts").
    `extensions`: the LEIR extensions a state may use (None: all of them, as `steptp apply`; the
    pipeline passes the profile's, so that its trajectories stay in the published format)."""
    if driver not in DRIVER_FUNCS:
        raise ValueError(f"unknown driver {driver!r}; drivers: {', '.join(DRIVERS)}")
    search = Search(program, signature, policy, verify, measure, target=target, budget=budget, seed=seed,
                    clock=clock, time_macro_steps=config.time_macro_steps, extensions=extensions,
                    verify_many=verify_many)
    DRIVER_FUNCS[driver](search, config)
    return search.result(driver)
