"""The workloads of `workloads.mathematical`: registered, distinct, translated and verified, and each
group has the sites it was added for (the rare strategies of the release profile)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from leir.frontend import translate
from strategies.base import Context
from strategies.registry import get
from workloads.mathematical import mathematical_workloads
from workloads.registry import all_workloads, get_workload
from workloads.sampling import build, sample_instance

NEW = [w.name for w in mathematical_workloads()]
# At default shapes these verify in float16 too; the others accumulate long float16 sums (projections,
# per-sample reductions over the features), as the catalogue's own linear and softmax do, or are the
# naive forms that under- or overflow float16 on the wide-range draw (log of an underflowed sigmoid).
FLOAT16_CLEAN = ["poisson_nll_loss", "poisson_nll_loss_full", "gaussian_kl_divergence", "gan_discriminator_loss",
                 "gan_generator_loss", "augmix_jsd_loss", "log_sigmoid_explicit", "megatron_bias_gelu",
                 "pade_activation", "log_softmax_temperature", "softmax_from_log_softmax", "smooth_max_logsumexp",
                 "rotary_embedding", "clip_logits", "maxout", "min_max_scaling", "softmax_confidence",
                 "textcnn_max_over_time", "pointnet_global_max", "chamfer_distance", "multiclass_hinge_loss"]


def test_registered_distinct_and_described():
    names = [w.name for w in all_workloads()]
    assert set(NEW) <= set(names) and len(NEW) == len(set(NEW)) >= 45
    classes = set()
    for name in NEW:
        w = get_workload(name)
        assert w.kind == "composite" and w.family and w.description, name
        assert all(p.role or p.choices for p in w.params), name
        module, _ = build(w, sample_instance(w, 0, 0, "tiny"))
        classes.add(type(module).__name__)
    assert len(classes) == len(NEW)  # one module class per workload


def _verify(name: str, dtype: str, profile: str = "default"):
    from gpu_tasks.verify import verify_against_reference

    w = get_workload(name)
    inst = replace(sample_instance(w, 0, 0, profile), dtype=dtype)
    module, inputs = build(w, inst)
    t = translate(module, inputs, dtype)
    return t, verify_against_reference(t.program, t.signature, t.reference)


@pytest.mark.parametrize("name", NEW[::6])
def test_a_spread_translates_and_verifies_at_tiny_shapes(name):
    pytest.importorskip("tvm")
    _, v = _verify(name, "float64", "tiny")
    assert v.status in ("exact", "close"), (name, v)


@pytest.mark.slow
@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_every_new_workload_verifies_at_default_shapes(name, dtype):
    pytest.importorskip("tvm")
    _, v = _verify(name, dtype)
    assert v.status in ("exact", "close"), (name, dtype, v)


@pytest.mark.slow
@pytest.mark.parametrize("name", FLOAT16_CLEAN)
def test_float16_where_the_formula_allows(name):
    pytest.importorskip("tvm")
    _, v = _verify(name, "float16")
    assert v.status in ("exact", "close"), (name, v)


# Each group of workloads was added for sites of a rare strategy: the original program has them, or a
# state after one or two compute_inline steps (as the release profile's transform stage tries them).
SITES = [
    ("tensor_split_to_decouple_operators", ["gru_cell", "lstm_cell", "geglu_fused_projection", "vit_attention_timm",
                                            "dit_adaln_zero_mlp", "mixture_density_head", "realnvp_coupling"]),
    ("dead_code_elimination", ["maxout", "min_max_scaling", "chamfer_distance", "pointnet_global_max",
                               "multiclass_hinge_loss", "textcnn_max_over_time"]),
    ("expand_log", ["log_sigmoid_explicit", "bpr_loss", "gan_generator_loss", "laplace_nll_loss",
                    "log_softmax_explicit"]),
    ("additive_split", ["vae_kl_divergence"]),
    ("multiplicative_split", ["clip_logits", "vit_attention_timm"]),
    ("tensor_concat_to_fuse_operators", ["swiglu_ffn", "highway_layer", "pade_activation"]),
    ("set_storage_scope", ["lstm_cell", "gru_cell", "megatron_bias_gelu"]),
]


def _states(name: str) -> list[Context]:
    w = get_workload(name)
    inst = replace(sample_instance(w, 0, 0, "tiny"), dtype="float32")
    module, inputs = build(w, inst)
    t = translate(module, inputs, "float32")
    root = Context(t.program, t.signature)
    inline = get("compute_inline")
    first = [root.with_program(s.after) for s in inline.transformations(root, limit=8)]
    return [root] + first + [c.with_program(s.after) for c in first for s in inline.transformations(c, limit=8)]


@pytest.mark.parametrize("strategy,names", SITES)
def test_the_rare_strategies_have_their_sites(strategy, names):
    s = get(strategy)
    missing = [n for n in names
               if not any(next(iter(s.transformations(c, limit=1)), None) for c in _states(n))]
    assert missing == []
