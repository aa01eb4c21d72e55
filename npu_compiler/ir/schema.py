"""ATen schemas of the ops the compiler knows: which positional args are tensors (the IR lists those, in
order, under `inputs`, dropping `None` optionals) and the defaults of the rest (the IR omits args at their
default, so the reader fills them in).

The table holds the schema strings as ATen declares them; `parse_schema` turns each into an `OpSchema`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

MISSING = object()


@dataclass(frozen=True)
class Arg:
    name: str
    type: str
    default: object = MISSING

    @property
    def is_tensor(self) -> bool:
        return self.type.startswith("Tensor")

    @property
    def is_tensor_list(self) -> bool:
        return self.type.startswith(("Tensor[]", "Tensor?[]"))

    @property
    def optional(self) -> bool:
        return "?" in self.type


@dataclass(frozen=True)
class OpSchema:
    op: str  # "add.Tensor"
    args: tuple[Arg, ...]
    num_outputs: int = 1

    @property
    def tensor_args(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if a.is_tensor)

    @property
    def attr_args(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if not a.is_tensor)

    def defaults(self) -> dict[str, object]:
        return {a.name: a.default for a in self.attr_args if a.default is not MISSING}


def _split_top(s: str) -> list[str]:
    out, depth, cur = [], 0, []
    for ch in s:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def _parse_default(text: str) -> object:
    text = text.strip()
    if text in ("None",):
        return None
    if text == "True":
        return True
    if text == "False":
        return False
    if text.startswith('"'):
        return text.strip('"')
    return ast.literal_eval(text)


def parse_schema(decl: str) -> OpSchema:
    head, _, ret = decl.partition(") -> ")
    name, _, argtext = head.partition("(")
    args: list[Arg] = []
    for part in _split_top(argtext):
        if part == "*":
            continue
        typ_name, eq, default = part.partition("=")
        typ, _, aname = typ_name.strip().rpartition(" ")
        typ = typ.replace("(a!)", "").replace("(a)", "")
        d = _parse_default(default) if eq else MISSING
        # ATen writes `int[2] padding=0` for "0 in every position".
        if isinstance(d, int) and not isinstance(d, bool) and "[" in typ:
            n = int(typ[typ.index("[") + 1 : typ.index("]")] or 1)
            d = [d] * n
        args.append(Arg(aname, typ, d))
    num_outputs = len(_split_top(ret.strip("()"))) if ret.strip().startswith("(") and ret.strip() != "()" else 1
    if ret.strip() == "()" or ret.strip() == "Tensor[]":
        num_outputs = 0  # none, or as many as the node lists (split, chunk): not checked
    return OpSchema(name.strip(), tuple(args), num_outputs)


# One line per supported ATen overload, as ATen declares it (`Tensor(a)` alias annotations left out).
_DECLS = """
conv2d.default(Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=[1, 1], int[2] padding=[0, 0], int[2] dilation=[1, 1], int groups=1) -> Tensor
batch_norm.default(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, Tensor? running_var, bool training, float momentum, float eps, bool cudnn_enabled) -> Tensor
_native_batch_norm_legit_no_training.default(Tensor input, Tensor? weight, Tensor? bias, Tensor running_mean, Tensor running_var, float momentum, float eps) -> (Tensor, Tensor, Tensor)
relu.default(Tensor self) -> Tensor
relu_.default(Tensor self) -> Tensor
add.Tensor(Tensor self, Tensor other, *, float alpha=1) -> Tensor
add_.Tensor(Tensor self, Tensor other, *, float alpha=1) -> Tensor
sub.Tensor(Tensor self, Tensor other, *, float alpha=1) -> Tensor
sub_.Tensor(Tensor self, Tensor other, *, float alpha=1) -> Tensor
rsub.Scalar(Tensor self, float other, float alpha=1) -> Tensor
rsub.Tensor(Tensor self, Tensor other, *, float alpha=1) -> Tensor
mul.Tensor(Tensor self, Tensor other) -> Tensor
mul_.Tensor(Tensor self, Tensor other) -> Tensor
div.Tensor(Tensor self, Tensor other) -> Tensor
div_.Tensor(Tensor self, Tensor other) -> Tensor
div.Tensor_mode(Tensor self, Tensor other, *, str? rounding_mode) -> Tensor
pow.Tensor_Scalar(Tensor self, float exponent) -> Tensor
pow.Tensor_Tensor(Tensor self, Tensor exponent) -> Tensor
maximum.default(Tensor self, Tensor other) -> Tensor
minimum.default(Tensor self, Tensor other) -> Tensor
neg.default(Tensor self) -> Tensor
rsqrt.default(Tensor self) -> Tensor
sqrt.default(Tensor self) -> Tensor
exp.default(Tensor self) -> Tensor
log.default(Tensor self) -> Tensor
sin.default(Tensor self) -> Tensor
cos.default(Tensor self) -> Tensor
tanh.default(Tensor self) -> Tensor
sigmoid.default(Tensor self) -> Tensor
silu.default(Tensor self) -> Tensor
silu_.default(Tensor self) -> Tensor
gelu.default(Tensor self, *, str approximate="none") -> Tensor
erf.default(Tensor self) -> Tensor
abs.default(Tensor self) -> Tensor
reciprocal.default(Tensor self) -> Tensor
hardtanh.default(Tensor self, float min_val=-1, float max_val=1) -> Tensor
hardtanh_.default(Tensor self, float min_val=-1, float max_val=1) -> Tensor
clamp.default(Tensor self, float? min=None, float? max=None) -> Tensor
where.self(Tensor condition, Tensor self, Tensor other) -> Tensor
masked_fill.Scalar(Tensor self, Tensor mask, float value) -> Tensor
eq.Scalar(Tensor self, float other) -> Tensor
eq.Tensor(Tensor self, Tensor other) -> Tensor
ne.Scalar(Tensor self, float other) -> Tensor
ne.Tensor(Tensor self, Tensor other) -> Tensor
lt.Scalar(Tensor self, float other) -> Tensor
lt.Tensor(Tensor self, Tensor other) -> Tensor
le.Scalar(Tensor self, float other) -> Tensor
le.Tensor(Tensor self, Tensor other) -> Tensor
gt.Scalar(Tensor self, float other) -> Tensor
gt.Tensor(Tensor self, Tensor other) -> Tensor
ge.Scalar(Tensor self, float other) -> Tensor
ge.Tensor(Tensor self, Tensor other) -> Tensor
logical_not.default(Tensor self) -> Tensor
to.dtype(Tensor self, ScalarType dtype, bool non_blocking=False, bool copy=False, MemoryFormat? memory_format=None) -> Tensor
to.device(Tensor self, Device device, ScalarType dtype, bool non_blocking=False, bool copy=False, MemoryFormat? memory_format=None) -> Tensor
to.dtype_layout(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, bool non_blocking=False, bool copy=False, MemoryFormat? memory_format=None) -> Tensor
_to_copy.default(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, bool non_blocking=False, MemoryFormat? memory_format=None) -> Tensor
type_as.default(Tensor self, Tensor other) -> Tensor
_assert_tensor_metadata.default(Tensor a, int[]? size=None, int[]? stride=None, ScalarType? dtype=None, *, Device? device=None, Layout? layout=None) -> ()
alias.default(Tensor self) -> Tensor
detach.default(Tensor self) -> Tensor
contiguous.default(Tensor self, *, MemoryFormat memory_format=0) -> Tensor
clone.default(Tensor self, *, MemoryFormat? memory_format=None) -> Tensor
dropout.default(Tensor input, float p, bool train) -> Tensor
lift_fresh_copy.default(Tensor self) -> Tensor
view.default(Tensor self, int[] size) -> Tensor
reshape.default(Tensor self, int[] shape) -> Tensor
_unsafe_view.default(Tensor self, int[] size) -> Tensor
flatten.using_ints(Tensor self, int start_dim=0, int end_dim=-1) -> Tensor
unsqueeze.default(Tensor self, int dim) -> Tensor
squeeze.default(Tensor self) -> Tensor
squeeze.dim(Tensor self, int dim) -> Tensor
squeeze.dims(Tensor self, int[] dim) -> Tensor
transpose.int(Tensor self, int dim0, int dim1) -> Tensor
t.default(Tensor self) -> Tensor
permute.default(Tensor self, int[] dims) -> Tensor
expand.default(Tensor self, int[] size, *, bool implicit=False) -> Tensor
slice.Tensor(Tensor self, int dim=0, int? start=None, int? end=None, int step=1) -> Tensor
select.int(Tensor self, int dim, int index) -> Tensor
cat.default(Tensor[] tensors, int dim=0) -> Tensor
split.Tensor(Tensor self, int split_size, int dim=0) -> Tensor[]
split_with_sizes.default(Tensor self, int[] split_sizes, int dim=0) -> Tensor[]
chunk.default(Tensor self, int chunks, int dim=0) -> Tensor[]
getitem(Tensor self, int index) -> Tensor
linear.default(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor
matmul.default(Tensor self, Tensor other) -> Tensor
mm.default(Tensor self, Tensor mat2) -> Tensor
bmm.default(Tensor self, Tensor mat2) -> Tensor
addmm.default(Tensor self, Tensor mat1, Tensor mat2, *, float beta=1, float alpha=1) -> Tensor
mean.default(Tensor self, *, ScalarType? dtype=None) -> Tensor
mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor
sum.default(Tensor self, *, ScalarType? dtype=None) -> Tensor
sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor
amax.default(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor
softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor
_softmax.default(Tensor self, int dim, bool half_to_float) -> Tensor
log_softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor
max_pool2d.default(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, int[2] dilation=1, bool ceil_mode=False) -> Tensor
avg_pool2d.default(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, bool ceil_mode=False, bool count_include_pad=True, int? divisor_override=None) -> Tensor
adaptive_avg_pool2d.default(Tensor self, int[2] output_size) -> Tensor
embedding.default(Tensor weight, Tensor indices, int padding_idx=-1, bool scale_grad_by_freq=False, bool sparse=False) -> Tensor
index_copy.default(Tensor self, int dim, Tensor index, Tensor source) -> Tensor
index_copy_.default(Tensor self, int dim, Tensor index, Tensor source) -> Tensor
scaled_dot_product_attention.default(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, float dropout_p=0.0, bool is_causal=False, *, float? scale=None, bool enable_gqa=False) -> Tensor
arange.default(float end, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor
arange.start(float start, float end, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor
arange.start_step(float start, float end, float step=1, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor
full.default(int[] size, float fill_value, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor
zeros.default(int[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor
rand.default(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor
randn.default(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor
rand_like.default(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor
randn_like.default(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor
ones.default(int[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor
full_like.default(Tensor self, Scalar fill_value, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor
zeros_like.default(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor
ones_like.default(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor
new_ones.default(Tensor self, SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor
new_zeros.default(Tensor self, SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor
new_full.default(Tensor self, SymInt[] size, Scalar fill_value, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor
scalar_tensor.default(Scalar s, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor
layer_norm.default(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, Tensor? bias=None, float eps=1e-05, bool cudnn_enable=True) -> Tensor
group_norm.default(Tensor input, int num_groups, Tensor? weight=None, Tensor? bias=None, float eps=1e-05, bool cudnn_enabled=True) -> Tensor
index.Tensor(Tensor self, Tensor?[] indices) -> Tensor
gather.default(Tensor self, int dim, Tensor index, *, bool sparse_grad=False) -> Tensor
index_select.default(Tensor self, int dim, Tensor index) -> Tensor
repeat.default(Tensor self, SymInt[] repeats) -> Tensor
repeat_interleave.self_int(Tensor self, SymInt repeats, int? dim=None, *, SymInt? output_size=None) -> Tensor
stack.default(Tensor[] tensors, int dim=0) -> Tensor
pad.default(Tensor self, SymInt[] pad, str mode="constant", float? value=None) -> Tensor
constant_pad_nd.default(Tensor self, SymInt[] pad, Scalar value=0) -> Tensor
roll.default(Tensor self, SymInt[1] shifts, int[1] dims=[]) -> Tensor
flip.default(Tensor self, int[] dims) -> Tensor
diff.default(Tensor self, int n=1, int dim=-1, Tensor? prepend=None, Tensor? append=None) -> Tensor
cumsum.default(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor
topk.default(Tensor self, SymInt k, int dim=-1, bool largest=True, bool sorted=True) -> (Tensor values, Tensor indices)
conv1d.default(Tensor input, Tensor weight, Tensor? bias=None, SymInt[1] stride=[1], SymInt[1] padding=[0], SymInt[1] dilation=[1], SymInt groups=1) -> Tensor
conv1d.padding(Tensor input, Tensor weight, Tensor? bias=None, SymInt[1] stride=[1], str padding="valid", SymInt[1] dilation=[1], SymInt groups=1) -> Tensor
conv2d.padding(Tensor input, Tensor weight, Tensor? bias=None, SymInt[2] stride=[1, 1], str padding="valid", SymInt[2] dilation=[1, 1], SymInt groups=1) -> Tensor
baddbmm.default(Tensor self, Tensor batch1, Tensor batch2, *, Scalar beta=1, Scalar alpha=1) -> Tensor
upsample_bilinear2d.vec(Tensor input, SymInt[]? output_size, bool align_corners, float[]? scale_factors) -> Tensor
upsample_bilinear2d.default(Tensor self, SymInt[2] output_size, bool align_corners, float? scales_h=None, float? scales_w=None) -> Tensor
upsample_nearest2d.vec(Tensor input, SymInt[]? output_size, float[]? scale_factors) -> Tensor
upsample_nearest2d.default(Tensor self, SymInt[2] output_size, float? scales_h=None, float? scales_w=None) -> Tensor
adaptive_avg_pool1d.default(Tensor self, int[1] output_size) -> Tensor
_adaptive_avg_pool2d.default(Tensor self, SymInt[2] output_size) -> Tensor
avg_pool1d.default(Tensor self, int[1] kernel_size, int[1] stride=[], int[1] padding=0, bool ceil_mode=False, bool count_include_pad=True) -> Tensor
_log_softmax.default(Tensor self, int dim, bool half_to_float) -> Tensor
reflection_pad1d.default(Tensor self, SymInt[2] padding) -> Tensor
reflection_pad2d.default(Tensor self, SymInt[4] padding) -> Tensor
reflection_pad3d.default(Tensor self, SymInt[6] padding) -> Tensor
replication_pad2d.default(Tensor self, SymInt[4] padding) -> Tensor
replication_pad3d.default(Tensor self, SymInt[6] padding) -> Tensor
amin.default(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor
any.default(Tensor self) -> Tensor
any.dim(Tensor self, int dim, bool keepdim=False) -> Tensor
any.dims(Tensor self, int[1]? dim=None, bool keepdim=False) -> Tensor
var.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor
var.dim(Tensor self, int[1]? dim, bool unbiased=True, bool keepdim=False) -> Tensor
argmax.default(Tensor self, int? dim=None, bool keepdim=False) -> Tensor
argmin.default(Tensor self, int? dim=None, bool keepdim=False) -> Tensor
max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)
min.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)
diagonal.default(Tensor self, int offset=0, int dim1=0, int dim2=1) -> Tensor
fill.Scalar(Tensor self, Scalar value) -> Tensor
feature_dropout.default(Tensor input, float p, bool train) -> Tensor
alpha_dropout.default(Tensor input, float p, bool train) -> Tensor
feature_alpha_dropout.default(Tensor input, float p, bool train) -> Tensor
native_dropout.default(Tensor input, float p, bool? train) -> (Tensor, Tensor)
detach_copy.default(Tensor self) -> Tensor
_assert_async.default(Tensor self) -> ()
_assert_async.msg(Tensor self, str assert_msg) -> ()
_assert_scalar.default(Scalar self, str assert_msg) -> ()
_functional_assert_async.msg(Tensor self, str assert_msg, Tensor dep_token) -> Tensor
_functional_assert_scalar.default(Scalar self, str assert_msg, Tensor dep_token) -> Tensor
unflatten.int(Tensor self, int dim, SymInt[] sizes) -> Tensor
expand_as.default(Tensor self, Tensor other) -> Tensor
unbind.int(Tensor self, int dim=0) -> Tensor[]
numpy_T.default(Tensor self) -> Tensor
mT.default(Tensor self) -> Tensor
mH.default(Tensor self) -> Tensor
adjoint.default(Tensor self) -> Tensor
matrix_H.default(Tensor self) -> Tensor
meshgrid.default(Tensor[] tensors) -> Tensor[]
meshgrid.indexing(Tensor[] tensors, *, str indexing) -> Tensor[]
fill.Tensor(Tensor self, Tensor value) -> Tensor
prelu.default(Tensor self, Tensor weight) -> Tensor
linalg_vector_norm.default(Tensor self, Scalar ord=2, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor
norm_except_dim.default(Tensor v, int pow=2, int dim=0) -> Tensor
_weight_norm.default(Tensor v, Tensor g, int dim=0) -> Tensor
_weight_norm_interface.default(Tensor v, Tensor g, int dim=0) -> (Tensor, Tensor)
index_add.default(Tensor self, int dim, Tensor index, Tensor source, *, Scalar alpha=1) -> Tensor
einsum.default(str equation, Tensor[] tensors, *, int[]? path=None) -> Tensor
lstm.input(Tensor input, Tensor[] hx, Tensor[] params, bool has_biases, int num_layers, float dropout, bool train, bool bidirectional, bool batch_first) -> (Tensor, Tensor, Tensor)
gru.input(Tensor input, Tensor hx, Tensor[] params, bool has_biases, int num_layers, float dropout, bool train, bool bidirectional, bool batch_first) -> (Tensor, Tensor)
rnn_tanh.input(Tensor input, Tensor hx, Tensor[] params, bool has_biases, int num_layers, float dropout, bool train, bool bidirectional, bool batch_first) -> (Tensor, Tensor)
rnn_relu.input(Tensor input, Tensor hx, Tensor[] params, bool has_biases, int num_layers, float dropout, bool train, bool bidirectional, bool batch_first) -> (Tensor, Tensor)
lstm_cell.default(Tensor input, Tensor[] hx, Tensor w_ih, Tensor w_hh, Tensor? b_ih=None, Tensor? b_hh=None) -> (Tensor, Tensor)
gru_cell.default(Tensor input, Tensor hx, Tensor w_ih, Tensor w_hh, Tensor? b_ih=None, Tensor? b_hh=None) -> Tensor
rnn_tanh_cell.default(Tensor input, Tensor hx, Tensor w_ih, Tensor w_hh, Tensor? b_ih=None, Tensor? b_hh=None) -> Tensor
rnn_relu_cell.default(Tensor input, Tensor hx, Tensor w_ih, Tensor w_hh, Tensor? b_ih=None, Tensor? b_hh=None) -> Tensor
select_scatter.default(Tensor self, Tensor src, int dim, SymInt index) -> Tensor
slice_scatter.default(Tensor self, Tensor src, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) -> Tensor
diagonal_scatter.default(Tensor self, Tensor src, int offset=0, int dim1=0, int dim2=1) -> Tensor
zero.default(Tensor self) -> Tensor
cdist.default(Tensor x1, Tensor x2, float p=2., int? compute_mode=None) -> Tensor
pdist.default(Tensor self, float p=2.) -> Tensor
embedding_bag.default(Tensor weight, Tensor indices, Tensor offsets, bool scale_grad_by_freq=False, int mode=0, bool sparse=False, Tensor? per_sample_weights=None, bool include_last_offset=False) -> (Tensor, Tensor, Tensor, Tensor)
embedding_bag.padding_idx(Tensor weight, Tensor indices, Tensor offsets, bool scale_grad_by_freq, int mode, bool sparse, Tensor? per_sample_weights, bool include_last_offset, int? padding_idx) -> (Tensor, Tensor, Tensor, Tensor)
grid_sampler.default(Tensor input, Tensor grid, int interpolation_mode, int padding_mode, bool align_corners) -> Tensor
grid_sampler_2d.default(Tensor input, Tensor grid, int interpolation_mode, int padding_mode, bool align_corners) -> Tensor
as_strided.default(Tensor self, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None) -> Tensor
_cdist_forward.default(Tensor x1, Tensor x2, float p, int? compute_mode) -> Tensor
_pdist_forward.default(Tensor self, float p=2.) -> Tensor
_embedding_bag.default(Tensor weight, Tensor indices, Tensor offsets, bool scale_grad_by_freq=False, int mode=0, bool sparse=False, Tensor? per_sample_weights=None, bool include_last_offset=False, int padding_idx=-1) -> (Tensor, Tensor, Tensor, Tensor)
scatter.src(Tensor self, int dim, Tensor index, Tensor src) -> Tensor
scatter.value(Tensor self, int dim, Tensor index, Scalar value) -> Tensor
scatter_add.default(Tensor self, int dim, Tensor index, Tensor src) -> Tensor
scatter_reduce.two(Tensor self, int dim, Tensor index, Tensor src, str reduce, *, bool include_self=True) -> Tensor
masked_scatter.default(Tensor self, Tensor mask, Tensor source) -> Tensor
index_put.default(Tensor self, Tensor?[] indices, Tensor values, bool accumulate=False) -> Tensor
convolution.default(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt groups) -> Tensor
col2im.default(Tensor self, SymInt[2] output_size, int[2] kernel_size, int[2] dilation, int[2] padding, int[2] stride) -> Tensor
conv3d.default(Tensor input, Tensor weight, Tensor? bias=None, SymInt[3] stride=[1, 1, 1], SymInt[3] padding=[0, 0, 0], SymInt[3] dilation=[1, 1, 1], SymInt groups=1) -> Tensor
conv_transpose1d.default(Tensor input, Tensor weight, Tensor? bias=None, SymInt[1] stride=[1], SymInt[1] padding=[0], SymInt[1] output_padding=[0], SymInt groups=1, SymInt[1] dilation=[1]) -> Tensor
conv_transpose2d.input(Tensor input, Tensor weight, Tensor? bias=None, SymInt[2] stride=[1, 1], SymInt[2] padding=[0, 0], SymInt[2] output_padding=[0, 0], SymInt groups=1, SymInt[2] dilation=[1, 1]) -> Tensor
conv_transpose3d.input(Tensor input, Tensor weight, Tensor? bias=None, SymInt[3] stride=[1, 1, 1], SymInt[3] padding=[0, 0, 0], SymInt[3] output_padding=[0, 0, 0], SymInt groups=1, SymInt[3] dilation=[1, 1, 1]) -> Tensor
max_pool2d_with_indices.default(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, int[2] dilation=1, bool ceil_mode=False) -> (Tensor, Tensor)
max_pool3d_with_indices.default(Tensor self, int[3] kernel_size, int[3] stride=[], int[3] padding=0, int[3] dilation=1, bool ceil_mode=False) -> (Tensor, Tensor)
avg_pool3d.default(Tensor self, int[3] kernel_size, int[3] stride=[], int[3] padding=0, bool ceil_mode=False, bool count_include_pad=True, int? divisor_override=None) -> Tensor
_adaptive_avg_pool3d.default(Tensor self, SymInt[3] output_size) -> Tensor
adaptive_avg_pool3d.default(Tensor self, SymInt[3] output_size) -> Tensor
native_layer_norm.default(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)
native_group_norm.default(Tensor input, Tensor? weight, Tensor? bias, SymInt N, SymInt C, SymInt HxW, int group, float eps) -> (Tensor, Tensor, Tensor)
_native_batch_norm_legit.default(Tensor input, Tensor? weight, Tensor? bias, Tensor running_mean, Tensor running_var, bool training, float momentum, float eps) -> (Tensor, Tensor, Tensor)
_native_batch_norm_legit.no_stats(Tensor input, Tensor? weight, Tensor? bias, bool training, float momentum, float eps) -> (Tensor, Tensor, Tensor)
prod.default(Tensor self, *, ScalarType? dtype=None) -> Tensor
prod.dim_int(Tensor self, int dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor
sort.default(Tensor self, int dim=-1, bool descending=False) -> (Tensor values, Tensor indices)
sort.stable(Tensor self, *, bool? stable, int dim=-1, bool descending=False) -> (Tensor values, Tensor indices)
empty.memory_format(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor
empty_like.default(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor
new_empty.default(Tensor self, SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor
empty_strided.default(SymInt[] size, SymInt[] stride, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor
new_empty_strided.default(Tensor self, SymInt[] size, SymInt[] stride, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor
movedim.int(Tensor self, int source, int destination) -> Tensor
narrow.default(Tensor self, int dim, int start, int length) -> Tensor
view_as.default(Tensor self, Tensor other) -> Tensor
reshape_as.default(Tensor self, Tensor other) -> Tensor
ravel.default(Tensor self) -> Tensor
positive.default(Tensor self) -> Tensor
square.default(Tensor self) -> Tensor
glu.default(Tensor self, int dim=-1) -> Tensor
rms_norm.default(Tensor input, int[] normalized_shape, Tensor? weight=None, float? eps=None) -> Tensor
instance_norm.default(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, Tensor? running_var, bool use_input_stats, float momentum, float eps, bool cudnn_enabled) -> Tensor
std.dim(Tensor self, int[1]? dim, bool unbiased=True, bool keepdim=False) -> Tensor
std.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor
logsumexp.default(Tensor self, int[1] dim, bool keepdim=False) -> Tensor
tril.default(Tensor self, int diagonal=0) -> Tensor
triu.default(Tensor self, int diagonal=0) -> Tensor
all.default(Tensor self) -> Tensor
all.dim(Tensor self, int dim, bool keepdim=False) -> Tensor
all.dims(Tensor self, int[]? dim=None, bool keepdim=False) -> Tensor
max.default(Tensor self) -> Tensor
min.default(Tensor self) -> Tensor
argsort.default(Tensor self, int dim=-1, bool descending=False) -> Tensor
argsort.stable(Tensor self, *, bool stable, int dim=-1, bool descending=False) -> Tensor
one_hot.default(Tensor self, int num_classes=-1) -> Tensor
pixel_shuffle.default(Tensor self, int upscale_factor) -> Tensor
pixel_unshuffle.default(Tensor self, int downscale_factor) -> Tensor
channel_shuffle.default(Tensor self, int groups) -> Tensor
im2col.default(Tensor self, int[2] kernel_size, int[2] dilation, int[2] padding, int[2] stride) -> Tensor
count_nonzero.default(Tensor self, int? dim=None) -> Tensor
count_nonzero.dim_IntList(Tensor self, int[] dim) -> Tensor
cosine_similarity.default(Tensor x1, Tensor x2, int dim=1, float eps=1e-08) -> Tensor
pairwise_distance.default(Tensor x1, Tensor x2, float p=2., float eps=9.9999999999999995e-07, bool keepdim=False) -> Tensor
outer.default(Tensor self, Tensor vec2) -> Tensor
var_mean.dim(Tensor self, int[1]? dim, bool unbiased=True, bool keepdim=False) -> (Tensor, Tensor)
var_mean.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> (Tensor, Tensor)
std_mean.dim(Tensor self, int[1]? dim, bool unbiased=True, bool keepdim=False) -> (Tensor, Tensor)
std_mean.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> (Tensor, Tensor)
aminmax.default(Tensor self, *, int? dim=None, bool keepdim=False) -> (Tensor min, Tensor max)
upsample_nearest1d.vec(Tensor input, int[]? output_size, float[]? scale_factors) -> Tensor
upsample_nearest3d.vec(Tensor input, int[]? output_size, float[]? scale_factors) -> Tensor
_upsample_nearest_exact1d.vec(Tensor input, int[]? output_size, float[]? scale_factors) -> Tensor
_upsample_nearest_exact2d.vec(Tensor input, int[]? output_size, float[]? scale_factors) -> Tensor
_upsample_nearest_exact3d.vec(Tensor input, int[]? output_size, float[]? scale_factors) -> Tensor
upsample_linear1d.vec(Tensor input, int[]? output_size, bool align_corners, float[]? scale_factors) -> Tensor
max_pool1d.default(Tensor self, int[1] kernel_size, int[1] stride=[], int[1] padding=[0], int[1] dilation=[1], bool ceil_mode=False) -> Tensor
adaptive_max_pool2d.default(Tensor self, int[2] output_size) -> (Tensor, Tensor)
adaptive_max_pool1d.default(Tensor self, int[1] output_size) -> (Tensor, Tensor)
"""

# Tensor arguments for which ATen takes a Python number (`x + 0.5`): the IR then records the number in attrs under
# the argument's name. Every other Tensor argument must be an input (ATen refuses a number there).
SCALAR_OPERANDS: dict[str, tuple[str, ...]] = {op: ("other",) for op in ("add.Tensor", "sub.Tensor", "mul.Tensor",
                                                                          "div.Tensor", "div.Tensor_mode",
                                                                          "floor_divide.default")}

SCHEMAS: dict[str, OpSchema] = {}
for _line in _DECLS.strip().splitlines():
    _s = parse_schema(_line.strip())
    SCHEMAS[_s.op] = _s


def _declare_elementwise() -> None:
    """The schemas the elementwise table declares beside its expressions (`expr.aten_table._op`)."""
    from ..expr.aten_table import ELEMENTWISE_SCHEMAS

    for decl in ELEMENTWISE_SCHEMAS.values():
        s = parse_schema(decl)
        SCHEMAS.setdefault(s.op, s)


_declare_elementwise()


def _declare_quantized() -> None:
    """PT2E's quantize/dequantize ops, which a quantized IR is written in (`ir/quant_ops.py`)."""
    from .quant_ops import DECLS

    for decl in DECLS:
        s = parse_schema(decl)
        SCHEMAS.setdefault(s.op, s)


_declare_quantized()


def _declare_aliases() -> None:
    from .aliases import ALIAS_DECLS

    for line in ALIAS_DECLS.strip().splitlines():
        s = parse_schema(line.strip())
        SCHEMAS.setdefault(s.op, s)


_declare_aliases()


def short_op(op_type: str) -> str:
    """'aten.add.Tensor' -> 'add.Tensor'; 'getitem' and '<built-in function getitem>' -> 'getitem'."""
    if "getitem" in op_type:
        return "getitem"
    s = op_type.removeprefix("aten.")
    if "." not in s:
        s += ".default"
    return s


def scalar_operands(op: str) -> tuple[str, ...]:
    """The Tensor arguments of `op` that may be a number in attrs (an in-place overload has its base op's)."""
    from .aliases import ALIASES

    base, dot, overload = op.partition(".")
    base_op = f"{base.rstrip('_')}{dot}{overload}"
    if base_op in ALIASES:  # `multiply(x, 2)`: the alias takes numbers where its target does
        target, names = ALIASES[base_op]
        back = {v: k for k, v in names.items()}
        return tuple(back.get(n, n) for n in scalar_operands(target))
    return SCALAR_OPERANDS.get(op) or SCALAR_OPERANDS.get(base_op, ())


def lookup(op_type: str) -> OpSchema | None:
    """The schema of an op; an in-place overload (`relu_.default`) not declared on its own has its out-of-place
    form's (the reader fills defaults before normalisation turns it into that form)."""
    op = short_op(op_type)
    hit = SCHEMAS.get(op)
    if hit is None:
        base, dot, overload = op.partition(".")
        if base.endswith("_") and not base.startswith("_"):
            hit = SCHEMAS.get(f"{base[:-1]}{dot}{overload}")
    return hit

