"""The signature: ordered known tensors (name, shape, dtype, role), docs/leir.md §4.2."""
from __future__ import annotations

import json
from dataclasses import dataclass

from leir.dtypes import TORCH_TO_CODE
from leir.errors import SignatureError
from leir.names import is_tensor_name

ROLES = ("input", "output")


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # PyTorch name without the `torch.` prefix
    role: str

    @property
    def code(self) -> str:
        return TORCH_TO_CODE[self.dtype]

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "role": self.role}

    def describe(self) -> str:
        """The published prompt wording of one tensor."""
        return f"'{self.name}' with the dtype torch.{self.dtype} and shape torch.Size({list(self.shape)})"


@dataclass(frozen=True, slots=True)
class Signature:
    tensors: tuple[TensorSpec, ...]

    def __post_init__(self):
        names = [t.name for t in self.tensors]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise SignatureError(f"tensor names appear twice in the signature: {', '.join(dup)}")
        if not self.outputs:
            raise SignatureError("the signature has no tensor with role 'output'")

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return tuple(t for t in self.tensors if t.role == "input")

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return tuple(t for t in self.tensors if t.role == "output")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tensors)

    def get(self, name: str) -> TensorSpec | None:
        for t in self.tensors:
            if t.name == name:
                return t
        return None

    def __contains__(self, name: str) -> bool:
        return self.get(name) is not None

    def to_json(self) -> dict:
        return {"tensors": [t.to_json() for t in self.tensors]}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"))

    def describe(self) -> str:
        """`'A' with the dtype torch.float32 and shape torch.Size([16, 64]), ... and 'D' with ...`."""
        parts = [t.describe() for t in self.tensors]
        return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]

    @classmethod
    def from_json(cls, obj) -> Signature:
        if isinstance(obj, str):
            try:
                obj = json.loads(obj)
            except json.JSONDecodeError as e:
                raise SignatureError(f"signature is not JSON: {e}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("tensors"), list):
            raise SignatureError('a signature is an object {"tensors": [...]}')
        return cls(tuple(_spec(i, t) for i, t in enumerate(obj["tensors"])))


def _spec(i: int, t) -> TensorSpec:
    where = f"signature tensor #{i + 1}"
    if not isinstance(t, dict):
        raise SignatureError(f"{where}: expected an object with name, shape, dtype, role")
    missing = [k for k in ("name", "shape", "dtype", "role") if k not in t]
    if missing:
        raise SignatureError(f"{where}: missing {', '.join(missing)}")
    name, shape, dtype, role = t["name"], t["shape"], t["dtype"], t["role"]
    if not isinstance(name, str) or not is_tensor_name(name):
        raise SignatureError(f"{where}: {name!r} is not a LEIR tensor name (upper-case letter, then lower-case; "
                             "not starting with L P V B U T)")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1
                                              for d in shape):
        raise SignatureError(f"{where} ({name}): shape must be a list of positive integers, got {shape!r}")
    dtype = str(dtype).removeprefix("torch.")
    if dtype not in TORCH_TO_CODE:
        raise SignatureError(f"{where} ({name}): unknown dtype {t['dtype']!r}")
    if role not in ROLES:
        raise SignatureError(f"{where} ({name}): role must be 'input' or 'output', got {role!r}")
    return TensorSpec(name, tuple(shape), dtype, role)
