"""dtype codes of LEIR superscripts and their PyTorch names (docs/leir.md §2, §4.2)."""

# Codes the project lowers and runs, in the order of docs/leir.md §2.
CODE_TO_TORCH = {
    "f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16",
    "i64": "int64", "i32": "int32", "i16": "int16", "i8": "int8",
    "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64", "bool": "bool",
}
# Codes of the reference format that parse but do not lower.
UNLOWERABLE_CODE_TO_TORCH = {
    "c64": "complex64", "c128": "complex128", "f8e4m3fn": "float8_e4m3fn",
    "f8e4m3fnuz": "float8_e4m3fnuz", "f8e5m2": "float8_e5m2", "f8e5m2fnu": "float8_e5m2fnuz",
    "u4": "uint4", "i4": "int4",
}
ALL_CODE_TO_TORCH = {**CODE_TO_TORCH, **UNLOWERABLE_CODE_TO_TORCH}
TORCH_TO_CODE = {v: k for k, v in ALL_CODE_TO_TORCH.items()}
DTYPE_CODES = tuple(ALL_CODE_TO_TORCH)
LOWERABLE_CODES = tuple(CODE_TO_TORCH)

FLOAT_CODES = ("f64", "f32", "f16", "bf16", "f8e4m3fn", "f8e4m3fnuz", "f8e5m2", "f8e5m2fnu")
INT_CODES = ("i64", "i32", "i16", "i8", "u8", "u16", "u32", "u64", "u4", "i4")


def torch_name(code: str) -> str:
    return ALL_CODE_TO_TORCH[code]


def code_of(torch_dtype: str) -> str:
    """`"float32"` or `"torch.float32"` -> `"f32"`."""
    name = torch_dtype.removeprefix("torch.")
    if name not in TORCH_TO_CODE:
        raise ValueError(f"unknown dtype {torch_dtype!r}; expected one of {', '.join(TORCH_TO_CODE)}")
    return TORCH_TO_CODE[name]


def is_float(code: str) -> bool:
    return code in FLOAT_CODES
