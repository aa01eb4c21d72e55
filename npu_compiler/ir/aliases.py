"""ATen's alias ops: another name for an op the compiler knows, its arguments perhaps renamed (`multiply` is `mul`,
`swapaxes(axis0, axis1)` is `transpose(dim0, dim1)`). One entry each: the shape rule (`infer/`) and the rewrite
(`decompose/`) both follow the target."""

from __future__ import annotations

# alias -> (target, {alias argument: target argument})
ALIASES: dict[str, tuple[str, dict[str, str]]] = {
    "multiply.Tensor": ("mul.Tensor", {}),
    "divide.Tensor": ("div.Tensor", {}),
    "true_divide.Tensor": ("div.Tensor", {}),
    "subtract.Tensor": ("sub.Tensor", {}),
    "negative.default": ("neg.default", {}),
    "absolute.default": ("abs.default", {}),
    "clip.default": ("clamp.default", {}),
    "greater.Tensor": ("gt.Tensor", {}),
    "greater.Scalar": ("gt.Scalar", {}),
    "greater_equal.Tensor": ("ge.Tensor", {}),
    "greater_equal.Scalar": ("ge.Scalar", {}),
    "less.Tensor": ("lt.Tensor", {}),
    "less.Scalar": ("lt.Scalar", {}),
    "less_equal.Tensor": ("le.Tensor", {}),
    "less_equal.Scalar": ("le.Scalar", {}),
    "not_equal.Tensor": ("ne.Tensor", {}),
    "not_equal.Scalar": ("ne.Scalar", {}),
    "arctan.default": ("atan.default", {}),
    "arcsin.default": ("asin.default", {}),
    "arccos.default": ("acos.default", {}),
    "arctanh.default": ("atanh.default", {}),
    "arcsinh.default": ("asinh.default", {}),
    "arccosh.default": ("acosh.default", {}),
    "arctan2.default": ("atan2.default", {}),
    "swapaxes.default": ("transpose.int", {"axis0": "dim0", "axis1": "dim1"}),
    "swapdims.default": ("transpose.int", {}),
    "moveaxis.int": ("movedim.int", {}),
    "sgn.default": ("sign.default", {}),
    "fix.default": ("trunc.default", {}),
}

ALIAS_DECLS = """
multiply.Tensor(Tensor self, Tensor other) -> Tensor
divide.Tensor(Tensor self, Tensor other) -> Tensor
true_divide.Tensor(Tensor self, Tensor other) -> Tensor
subtract.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor
negative.default(Tensor self) -> Tensor
absolute.default(Tensor self) -> Tensor
clip.default(Tensor self, Scalar? min=None, Scalar? max=None) -> Tensor
greater.Tensor(Tensor self, Tensor other) -> Tensor
greater.Scalar(Tensor self, Scalar other) -> Tensor
greater_equal.Tensor(Tensor self, Tensor other) -> Tensor
greater_equal.Scalar(Tensor self, Scalar other) -> Tensor
less.Tensor(Tensor self, Tensor other) -> Tensor
less.Scalar(Tensor self, Scalar other) -> Tensor
less_equal.Tensor(Tensor self, Tensor other) -> Tensor
less_equal.Scalar(Tensor self, Scalar other) -> Tensor
not_equal.Tensor(Tensor self, Tensor other) -> Tensor
not_equal.Scalar(Tensor self, Scalar other) -> Tensor
arctan.default(Tensor self) -> Tensor
arcsin.default(Tensor self) -> Tensor
arccos.default(Tensor self) -> Tensor
arctanh.default(Tensor self) -> Tensor
arcsinh.default(Tensor self) -> Tensor
arccosh.default(Tensor self) -> Tensor
arctan2.default(Tensor self, Tensor other) -> Tensor
swapaxes.default(Tensor self, int axis0, int axis1) -> Tensor
swapdims.default(Tensor self, int dim0, int dim1) -> Tensor
moveaxis.int(Tensor self, int source, int destination) -> Tensor
sgn.default(Tensor self) -> Tensor
fix.default(Tensor self) -> Tensor
"""


def renamed(attrs: dict, names: dict[str, str]) -> dict:
    """An alias node's attributes under the target's argument names (torch_ir's list sizes and masks dropped)."""
    return {names.get(k, k): v for k, v in attrs.items() if not k.startswith("_")}
