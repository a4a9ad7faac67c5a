"""Composite moves as data: a recipe is a sequence of atomic steps, each a registered strategy, the
loops of its site named by their *role* in the recipe, and its parameters.

A role names a loop by what it is for ("rows", "cols", "red" for the reduction loops), never by its
index name: the runner follows each role's loop through the steps that rename or split it
(`Plan.follow`): a parallel loop made of a bound one gets a new index name in the same place; a
split keeps the inner loop's name and puts a new loop outside it, which the role `"<role>.outer"`
then names. So a recipe does not find its loops again by a name predicate, and nothing tracks
renames by hand.

A step may depend on the program it meets (`when`, on the plan; parameters computed from it, or
several variants tried in order, the first legal one made); a step that applies nowhere ends the
recipe, whose steps so far are then not a proposal, unless it is `optional`. An entry may also be a
check or a small step of its own, a function of the plan that says whether to go on.

The nest a plan works on is followed too: a step that adds nests before it (a re-laid copy, an index
table) moves it back by as many; one that adds nests after it (the combining nest of partial
results) leaves it where it is.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from leir.ast import Program, Var, accesses, walk_expr
from strategies.analysis.legality import body_statements
from strategies.base import Context, Site, Transformation
from strategies.registry import get


@dataclass
class Plan:
    """A recipe being applied: the program so far, the steps made, the nest it works on and the loop
    each role names there."""

    ctx: Context
    nest: int
    roles: dict[str, str]
    facts: dict = field(default_factory=dict)   # what the recipe's conditions and parameters read
    steps: list[Transformation] = field(default_factory=list)

    @property
    def program(self) -> Program:
        return self.ctx.program

    def loops(self) -> list:
        return list(self.program.nests[self.nest].loops)

    def names(self) -> list[str]:
        return [lp.var for lp in self.loops()]

    def var(self, role: str) -> str | None:
        return self.roles.get(role)

    def kind(self, role: str) -> str | None:
        return next((lp.kind for lp in self.loops() if lp.var == self.roles.get(role)), None)

    def role_of(self, var: str) -> str | None:
        return next((r for r, v in self.roles.items() if v == var), None)

    def apply(self, strategy: str, params: dict, where: Callable[[Site], bool]) -> bool:
        """The first site `where` accepts at which `strategy` with `params` is a legal step: made,
        and each role follows its loop; False when there is none."""
        s = get(strategy)
        before_nests, before = len(self.program.nests), self.names()
        for site in s.sites(self.ctx):
            if not where(site):
                continue
            t = s.apply(self.ctx, site, params)
            if t is None:
                continue
            self.steps.append(t)
            self.ctx = self.ctx.with_program(t.after)
            added = len(self.program.nests) - before_nests
            if added > 0 and site.nest < self.nest:
                self.nest += added
            elif added > 0 and site.nest == self.nest:
                self.nest += self._moved_by(added, before)
            self.follow(before)
            return True
        return False

    def _moved_by(self, added: int, before: list[str]) -> int:
        """After a step at our nest that added `added` nests: how many of them stand before ours (a
        copy or a table, whose loops have fresh names) rather than after it (partial results'
        combining nest): our nest is the one of the places it can be that holds most of its loops'
        names; on a tie, the earliest."""
        def held(i: int) -> int:
            return len(set(before) & {lp.var for lp in self.program.nests[i].loops})
        places = range(self.nest, min(self.nest + added, len(self.program.nests) - 1) + 1)
        return max(places, key=lambda i: (held(i), -i)) - self.nest

    def follow(self, before: list[str]) -> None:
        """Each role's loop after a step: the same name where it kept it; the same place where the
        loops were renamed (as many loops as before); a split's new outer loop is `<role>.outer`."""
        after = self.names()
        if len(after) == len(before):
            for role, var in list(self.roles.items()):
                if var not in after and var in before:
                    self.roles[role] = after[before.index(var)]
            return
        for var in after:
            if var not in before:
                inner = next((r for v in self._split_partners(var) if (r := self.role_of(v)) is not None), None)
                if inner is not None:
                    self.roles[f"{inner}.outer"] = var

    def _split_partners(self, var: str) -> list[str]:
        """The loop indices that share a subscript with `var` in the nest (a split writes its loop v
        as `outer*f + v`: the new outer loop's partner is the loop it was split from)."""
        out: list[str] = []
        for stmt, _ in body_statements(self.program.nests[self.nest]):
            for access in [stmt.lhs, *accesses(stmt.rhs)]:
                for ix in access.indices:
                    names = [n.name for n in walk_expr(ix) if isinstance(n, Var)]
                    if var in names:
                        out += [n for n in names if n != var and n not in out]
        return out


@dataclass(frozen=True)
class Step:
    """One step of a recipe: `strategy` at the site of the nest that names the loops of `loops`
    (roles; none: any site of the nest), with `params` (a dict, or computed from the plan) or the
    first legal one of `variants` (computed from the plan), made only where `when` holds. A step that
    applies nowhere ends the recipe, unless it is `optional`."""

    strategy: str
    loops: tuple[str, ...] = ()
    params: dict | Callable[[Plan], dict] = field(default_factory=dict)
    when: Callable[[Plan], bool] | None = None
    variants: Callable[[Plan], Iterable[dict]] | None = None
    optional: bool = False

    def run(self, plan: Plan) -> bool:
        if self.when is not None and not self.when(plan):
            return True
        loops = tuple(plan.var(r) for r in self.loops)
        if None in loops:
            return self.optional
        nest = _in_nest(plan.nest)

        def where(s: Site) -> bool:
            return nest(s) and (not loops or tuple(s.loops) == loops)
        if self.variants is not None:
            made = any(plan.apply(self.strategy, params, where) for params in self.variants(plan))
        else:
            made = plan.apply(self.strategy, self.params(plan) if callable(self.params) else dict(self.params), where)
        return made or self.optional


@dataclass(frozen=True)
class Arrange:
    """Loop reorders (one-loop moves, each an atomic `loop_reorder` step) that bring the nest's
    loops into the order `order` gives: a list of roles, where `"*"` stands for every loop that no
    other entry names, in its current order, and a role of several loops (`"red"`: `red.0`,
    `red.1`, ...) for all of them in their current order."""

    order: tuple[str, ...]

    def run(self, plan: Plan) -> bool:
        for k, var in enumerate(self.target(plan)):
            names = plan.names()
            i = names.index(var)
            if i == k:
                continue
            params = {"swap": [names[k], var]} if i - k == 1 else {"move": var, "to": k}
            if not plan.apply("loop_reorder", params, _in_nest(plan.nest)):
                return False
        return True

    def target(self, plan: Plan) -> list[str]:
        names = plan.names()
        roles = {v: r for r, v in plan.roles.items()}

        def of(entry: str) -> list[str]:
            return [v for v in names if v in roles and (roles[v] == entry or (
                roles[v].startswith(entry + ".") and roles[v].split(".", 1)[1].isdigit()))]

        named = {v for entry in self.order if entry != "*" for v in of(entry)}
        rest = [v for v in names if v not in named]
        return [v for entry in self.order for v in (rest if entry == "*" else of(entry))]


def _in_nest(nest: int) -> Callable[[Site], bool]:
    return lambda s: s.nest == nest and s.path == ()


Recipe = tuple["Step | Arrange | Callable[[Plan], bool]", ...]


def run(recipe: Recipe, plan: Plan) -> bool:
    """Apply the recipe's steps in order; False (the plan part-way) when a required step has no site.
    An entry may also be a check on the plan (a callable): False ends the recipe."""
    for entry in recipe:
        ok = entry.run(plan) if isinstance(entry, Step | Arrange) else entry(plan)
        if not ok:
            return False
    return True
