"""What the transform stage proposes: no reassociating step on a program whose own rounding (the
generate stage's `rounding_share`, measured against its float64 reference) leaves no room for one
(issue 18), and no step outside the published LEIR format unless the profile admits the extension."""
from collections import Counter

from flows.config import load_params
from flows.transform import transform_shard
from leir import Signature

SIG = Signature.from_json({"tensors": [{"name": "A", "shape": [4, 64], "dtype": "float32", "role": "input"},
                                       {"name": "C", "shape": [4], "dtype": "float32", "role": "output"}]})
ROW_SUMS = "B^{4}_{tx=0}L^{64}_{a=0}[C^{f32,g}_{tx}=C^{f32,g}_{tx}+A^{f32,g}_{tx,a};];"


def _program(share):
    return {"program_id": "p", "verification_status": "close", "signature": SIG.dumps(), "leir": ROW_SUMS,
            "rounding_share": share}


def test_rounding_share_of_the_original_decides_reassociating_steps():
    params = load_params()
    healthy = Counter(r["exactness"] for r in transform_shard([_program(0.01)], params))
    touchy = Counter(r["exactness"] for r in transform_shard([_program(0.9)], params))
    unmeasured = Counter(r["exactness"] for r in transform_shard([_program(None)], params))
    assert healthy["reassociating"] > 0 and touchy["reassociating"] == 0
    assert touchy["exact"] == healthy["exact"] > 0
    assert unmeasured == healthy


SOFTMAX_SIG = Signature.from_json({"tensors": [
    {"name": "A", "shape": [4, 16], "dtype": "float32", "role": "input"},
    {"name": "C", "shape": [4, 16], "dtype": "float32", "role": "output"}]})
SOFTMAX = ("B^{4}_{tx=0}L^{16}_{a=0}[D^{f32,g}_{tx}=max(D^{f32,g}_{tx},A^{f32,g}_{tx,a});];"
           "B^{4}_{tx=0}L^{16}_{a=0}[E^{f32,g}_{tx}=E^{f32,g}_{tx}+exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx});];"
           "B^{4}_{tx=0}L^{16}_{a=0}[C^{f32,g}_{tx,a}=exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx})/E^{f32,g}_{tx};];")


def test_fast_exp_steps_only_where_the_profile_admits_the_extension():
    row = {"program_id": "s", "verification_status": "close", "signature": SOFTMAX_SIG.dumps(), "leir": SOFTMAX,
           "rounding_share": 0.0}
    published = transform_shard([row], load_params())
    assert load_params().profile["leir_extensions"] == []
    assert published and not any("fast_exp" in r["after_leir"] for r in published)
    opted = transform_shard([row], load_params(overrides={"profiles": {"default": {"leir_extensions": ["fast_exp"]}}}))
    assert any("fast_exp" in r["after_leir"] and r["exactness"] == "reassociating" for r in opted)
    # a left-out variant leaves its place in the per-strategy budget to a variant in the published format
    assert len(published) >= len([r for r in opted if "fast_exp" not in r["after_leir"]])


def test_a_programs_steps_are_made_for_its_own_target():
    """Issue 25: a GPU program is offered binding and never P or V loops, a CPU program the other way
    round; a program row without a target (an older lake) is the verify stage's target."""
    def strategies(target):
        row = {"program_id": "s", "verification_status": "close", "signature": SOFTMAX_SIG.dumps(), "leir": SOFTMAX,
               "rounding_share": 0.0, **({"target": target} if target else {})}
        # a 4x16 softmax: the default profile's bound on parallel work would refuse every P loop
        unbounded = load_params(overrides={"profiles": {"default": {"min_parallel_work": 0}}})
        return {r["strategy"] for r in transform_shard([row], unbounded)}

    gpu, cpu, older = strategies("cuda"), strategies("llvm"), strategies(None)
    assert "loop_binding" in gpu and not gpu & {"loop_parallelization", "loop_vectorization"}
    assert "loop_binding" not in cpu and {"loop_parallelization", "loop_vectorization"} <= cpu
    assert older == cpu and (gpu & cpu) >= {"loop_split", "loop_unrolling"}


def test_verify_targets_add_cuda_for_gpu_programs_only_with_a_gpu():
    from flows.verify import step_key, verify_targets

    params = load_params()
    assert verify_targets("cuda", params, gpu=False) == ["llvm"]
    assert verify_targets("cuda", params, gpu=True) == ["llvm", "cuda"]
    assert verify_targets("llvm", params, gpu=True) == verify_targets(None, params, gpu=True) == ["llvm"]
    step = {"step_id": "s", "before_leir": ROW_SUMS, "after_leir": ROW_SUMS}
    assert step_key(step, SIG.dumps(), params) == step_key(step, SIG.dumps(), params, "llvm") \
        != step_key(step, SIG.dumps(), params, "cuda")
