"""Deterministic instances: `(workload, seed, k, profile)` always gives the same shapes and dtype.

Every choice draws from `random.Random(key)` with a string key built from the identity of the
instance (never the global RNG, never `hash()`); module weights and example inputs come from a torch
generator seeded from the same key, inside `fork_rng` so the caller's RNG state is untouched.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

import torch

from workloads.shapes import ODD_SHARE, PROFILES, fit_to_budget
from workloads.spec import Workload

MAX_TRIES = 200


@dataclass(frozen=True)
class Instance:
    workload: str
    seed: int
    k: int
    profile: str
    params: dict
    dtype: str
    shape_source: str = "model-dims"  # or "odd-extents", "tiny-ranges" (workloads.shapes)

    @property
    def key(self) -> str:
        return stable_key(self.workload, self.seed, self.k, self.profile)

    def to_json(self) -> dict:
        return {"workload": self.workload, "seed": self.seed, "k": self.k, "profile": self.profile,
                "params": dict(self.params), "dtype": self.dtype, "shape_source": self.shape_source}


def stable_key(name: str, seed: int, k: int, profile: str) -> str:
    return f"{name}|seed={seed}|k={k}|profile={profile}"


def key_int(key: str) -> int:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


def sample_instance(workload: Workload, seed: int, k: int, profile: str = "default") -> Instance:
    """The k-th instance: `tiny` draws each parameter from its small range; the model profiles draw
    from the parameters' roles (odd extents for a seeded minority) and fit the work budget."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; expected one of {', '.join(PROFILES)}")
    rng = random.Random(stable_key(workload.name, seed, k, profile))
    odd = profile != "tiny" and rng.random() < ODD_SHARE
    source = "tiny-ranges" if profile == "tiny" else ("odd-extents" if odd else "model-dims")
    for attempt in range(MAX_TRIES):
        if odd and attempt == MAX_TRIES // 2:  # the operator needs even extents (groups, heads)
            odd, source = False, "model-dims"
        params = {p.name: rng.choice(p.values(profile, odd)) for p in workload.params}
        if profile != "tiny":
            params.update({p.name: params[p.same_as] for p in workload.params if p.same_as is not None})
        if workload.constraint(params):
            params = fit_to_budget(workload, params, profile, odd)
            return Instance(workload.name, seed, k, profile, params, rng.choice(workload.dtypes), source)
    raise ValueError(f"workload {workload.name}: no parameters satisfy its constraint after {MAX_TRIES} draws")


def sample_instances(workload: Workload, seed: int, count: int, profile: str = "default") -> list[Instance]:
    return [sample_instance(workload, seed, k, profile) for k in range(count)]


def build(workload: Workload, instance: Instance) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    """The module (weights seeded from the instance key) and example inputs in the instance dtype."""
    seed = key_int(instance.key)
    dtype = getattr(torch, instance.dtype)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = workload.module(instance.params)
    gen = torch.Generator().manual_seed(seed)
    inputs = [spec.make(instance.params, dtype, gen) for spec in workload.inputs]
    return module.to(dtype), inputs
