from __future__ import annotations

import ctypes

from porter.errors import TemplateError
from porter.measure.ops._bf16 import from_bf16, rel_error, to_bf16, torch_view
from porter.measure.ops.base import Op

_CUDA_R_16BF, _CUDA_R_16F, _CUDA_R_32F, _COMPUTE_32F, _GEMM_DEFAULT = 14, 2, 0, 68, -1


class GemmOp(Op):
    """C = A @ B.T: A M x K, B N x K, C M x N, all row-major bf16, fp32 accumulation."""

    name = "gemm"
    dims = ("M", "N", "K")
    rtol = 1e-2
    signature = ("p", "p", "p", "s", "s", "s", "p")

    def setup(self, size, seed):
        import cupy as cp
        M, N, K = size
        rng = cp.random.default_rng(seed)
        a32 = rng.standard_normal((M, K), dtype=cp.float32)
        b32 = rng.standard_normal((N, K), dtype=cp.float32)
        A, B = to_bf16(a32), to_bf16(b32)
        ref = from_bf16(A) @ from_bf16(B).T
        C = cp.empty((M, N), dtype=cp.uint16)
        return {"A": A, "B": B, "C": C, "ref": ref, "size": size}

    def args(self, state, workspace_ptr):
        M, N, K = state["size"]
        return [ctypes.c_void_p(state["A"].data.ptr), ctypes.c_void_p(state["B"].data.ptr),
                ctypes.c_void_p(state["C"].data.ptr), ctypes.c_int(M), ctypes.c_int(N),
                ctypes.c_int(K), ctypes.c_void_p(workspace_ptr)]

    def poison(self, state):
        state["C"].fill(0xFFFF)

    def error(self, state):
        return rel_error(from_bf16(state["C"]), state["ref"])

    def baselines(self, state):
        out = {"cublas(cupy)": lambda: _cublas_gemm(state)}
        ta, tb, tc = (torch_view(state[k]) for k in "ABC")
        if ta is not None:
            import torch
            out["cublas(torch)"] = lambda: torch.matmul(ta, tb.T, out=tc)
        return out


class GemmF16Op(GemmOp):
    """gemm's fp16 twin: C = A @ B.T, A M x K, B N x K, C M x N, all row-major fp16 (CuPy
    float16 arrays), fp32 accumulation; the same kernel arguments. The reference is the fp32
    GEMM of the fp16 inputs. gemm_wgmma's variant gemm_wgmma_f16 computes it (DTYPE=1)."""

    name = "gemm_f16"
    note = "reference: fp32 GEMM of the fp16 inputs"

    def setup(self, size, seed):
        import cupy as cp
        M, N, K = size
        rng = cp.random.default_rng(seed)
        A, B = (rng.standard_normal(shape, dtype=cp.float32).astype(cp.float16)
                for shape in ((M, K), (N, K)))
        return {"A": A, "B": B, "C": cp.empty((M, N), dtype=cp.float16),
                "ref": reference_f16(A, B), "size": size}

    def poison(self, state):
        state["C"].fill(float("nan"))

    def error(self, state):
        return rel_error(state["C"].astype("float32"), state["ref"])

    def baselines(self, state):
        out = {"cublas(cupy)": lambda: _cublas_gemm(state, _CUDA_R_16F)}
        try:
            import torch
        except ImportError:
            return out
        ta, tb, tc = (torch.from_dlpack(state[k]) for k in "ABC")
        out["cublas(torch)"] = lambda: torch.matmul(ta, tb.T, out=tc)
        return out

    def tensor_map(self, state, name: str, box, swizzle: int = 128) -> bytes:
        """The 2-D CUtensorMap over A, B or C as FLOAT16 (the harness's own encoding of a
        `buffer` is bf16), box {box[0], box[1]} innermost first; a zero extent: 128 zero bytes."""
        if not all(box):
            return bytes(128)
        from porter.measure import tma
        t = state[name]
        rows, cols = t.shape
        try:
            return tma.encode_tiled(t.data.ptr, [cols, rows], [t.strides[0]],
                                    [int(b) for b in box], swizzle, dtype="float16")
        except (ValueError, tma.TmaError) as e:
            raise TemplateError(f"tensor map over {name} (box {tuple(box)}): {e}") from e


def reference_f16(A, B):
    """The fp32 GEMM A B^T of fp16 (or any) arrays, NumPy or CuPy."""
    return A.astype("float32") @ B.astype("float32").T


def _cublas_gemm(state, dtype=_CUDA_R_16BF):
    """Row-major C = A B^T is column-major C^T = B A^T: cuBLAS's 'TN' call, A, B and C of the
    cudaDataType `dtype` (bf16 or fp16), fp32 compute."""
    import cupy as cp
    import numpy as np
    from cupy_backends.cuda.libs import cublas
    M, N, K = state["size"]
    handle = cp.cuda.device.get_cublas_handle()
    one = state.setdefault("_one", np.ones(1, np.float32))
    zero = state.setdefault("_zero", np.zeros(1, np.float32))
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    cublas.gemmEx(handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, N, M, K,
                  one.ctypes.data, state["B"].data.ptr, dtype, K,
                  state["A"].data.ptr, dtype, K,
                  zero.ctypes.data, state["C"].data.ptr, dtype, N,
                  _COMPUTE_32F, _GEMM_DEFAULT)
