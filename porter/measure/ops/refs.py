"""Built-in references and baselines for declared ops: name them in space.toml as
`reference = "porter.measure.ops.refs:softmax"`, `baseline = "porter.measure.ops.refs:torch_softmax"`.

The contract (docs/TEMPLATES.md, "Declaring your op"):

- a reference is called as `fn(*inputs, **scalars)`: the input buffers (every buffer not marked
  output, plus in-out buffers) as float32 arrays (float64 kept) in kernel order, on the device
  where the job is measured (CuPy; NumPy in CPU tests), and every scalar by name. It returns
  the outputs in fp32: one array, a tuple in kernel order, or a dict by name. Any array type
  with DLPack or the CUDA array interface will do (torch tensors too).
- a baseline is called once per problem size as `fn(*buffers, **scalars)` with every buffer as
  the kernel sees it (CuPy arrays in the declared dtype; bf16 as uint16 bits: `torch_view`
  views it as torch.bfloat16), and returns a function of no arguments that computes the same
  outputs; that function is what is timed, next to ours, in the same process.

References here work on NumPy and CuPy alike; baselines need torch (or cuBLAS through CuPy).
"""
from __future__ import annotations


def xp_of(a):
    """cupy for a CuPy array, numpy otherwise."""
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy
        return cupy
    import numpy
    return numpy


# ---- references (fp32 in, fp32 out) -------------------------------------------------------
def softmax(x, **_):
    """Softmax over the last axis."""
    xp = xp_of(x)
    e = xp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def log_softmax(x, **_):
    xp = xp_of(x)
    s = x - x.max(axis=-1, keepdims=True)
    return s - xp.log(xp.exp(s).sum(axis=-1, keepdims=True))


def layernorm(x, w=None, b=None, eps=1e-5, **_):
    """LayerNorm over the last axis, with optional weight and bias (broadcast)."""
    xp = xp_of(x)
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    y = (x - mu) / xp.sqrt(var + eps)
    if w is not None:
        y = y * w.reshape(-1)
    if b is not None:
        y = y + b.reshape(-1)
    return y


def rmsnorm(x, w=None, eps=1e-6, **_):
    """x * rsqrt(mean(x^2) + eps) * w over the last axis."""
    xp = xp_of(x)
    y = x / xp.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    return y if w is None else y * w.reshape(-1)


def gemm(a, b, **_):
    """C = A @ B.T (porter's gemm layout: A M x K, B N x K, both row-major)."""
    return a @ b.T


def matmul(a, b, **_):
    return a @ b


def transpose(x, **_):
    """The transpose of a 2-D buffer."""
    return x.T.copy()


def sum_rows(x, **_):
    return x.sum(axis=-1)


def max_rows(x, **_):
    return x.max(axis=-1)


def mean_rows(x, **_):
    return x.mean(axis=-1)


def sum_all(x, **_):
    return x.sum().reshape(1)


def add(a, b, **_):
    return a + b


def mul(a, b, **_):
    return a * b


def axpy(x, y, alpha=1.0, **_):
    return alpha * x + y


def relu(x, **_):
    return xp_of(x).maximum(x, 0)


def silu(x, **_):
    xp = xp_of(x)
    return x / (1 + xp.exp(-x))


def gelu_tanh(x, **_):
    xp = xp_of(x)
    return 0.5 * x * (1 + xp.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


# ---- baselines (return the function to time) ------------------------------------------------
def torch_view(a):
    """A torch view of a CuPy array without a copy; uint16 arrays are read as bf16."""
    import torch
    t = torch.from_dlpack(a)
    return t.view(torch.bfloat16) if t.dtype == torch.uint16 else t


def torch_softmax(x, y=None, **_):
    import torch
    tx = torch_view(x)
    return lambda: torch.softmax(tx, dim=-1)


def torch_layernorm(x, w, b, y, eps=1e-5, **_):
    """For kernels taking (x, w, b, y, ...)."""
    import torch
    tx, tw, tb = torch_view(x), torch_view(w).reshape(-1), torch_view(b).reshape(-1)
    shape = (tx.shape[-1],)
    return lambda: torch.nn.functional.layer_norm(tx, shape, tw, tb, eps)


def torch_rmsnorm(x, w, y=None, eps=1e-6, **_):
    """For kernels taking (x, w, y, ...)."""
    import torch
    tx, tw = torch_view(x), torch_view(w).reshape(-1)
    shape = (tx.shape[-1],)
    return lambda: torch.nn.functional.rms_norm(tx, shape, tw, eps)


def torch_gemm(a, b, c, **_):
    import torch
    ta, tb, tc = torch_view(a), torch_view(b), torch_view(c)
    return lambda: torch.matmul(ta, tb.T, out=tc)


def torch_transpose(x, y, **_):
    tx, ty = torch_view(x), torch_view(y)
    return lambda: ty.copy_(tx.T)


def torch_sum_rows(x, y, **_):
    import torch
    tx, ty = torch_view(x), torch_view(y)
    return lambda: torch.sum(tx, dim=-1, out=ty)


def cupy_copy(x, y, **_):
    """A device-to-device copy of x into y (same size): the bandwidth a memory-bound kernel
    is held against."""
    return lambda: y.ravel().__setitem__(slice(None), x.ravel())
