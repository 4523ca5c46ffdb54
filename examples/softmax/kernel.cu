// Row-wise softmax, fp32: y[r, c] = exp(x[r, c] - max_r) / sum_c exp(x[r, c] - max_r).
// One block per row. A row that fits the block's registers (THREADS * VEC * ITEMS values) is
// read once and written once; a wider one is read twice (the second read mostly hits L2).
// Tunables: THREADS (block size), VEC (floats per load: 1, 2, 4), ITEMS (loads held per thread).

#define NWARPS (THREADS / 32)
#define NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// the block-wide max (OP = 0) or sum (OP = 1) of v, returned to every thread
template <int OP>
__device__ __forceinline__ float block_reduce(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = OP == 0 ? warp_max(v) : warp_sum(v);
    if (NWARPS == 1) return v;
    __syncthreads();                      // red[] may still be read by the last reduction
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < NWARPS ? red[lane] : (OP == 0 ? NEG_INF : 0.0f);
    return OP == 0 ? warp_max(v) : warp_sum(v);
}

template <int N> struct Vec;
template <> struct Vec<1> { typedef float T; };
template <> struct Vec<2> { typedef float2 T; };
template <> struct Vec<4> { typedef float4 T; };

__device__ __forceinline__ void unpack(float v, float* o) { o[0] = v; }
__device__ __forceinline__ void unpack(float2 v, float* o) { o[0] = v.x; o[1] = v.y; }
__device__ __forceinline__ void unpack(float4 v, float* o) { o[0] = v.x; o[1] = v.y; o[2] = v.z; o[3] = v.w; }
__device__ __forceinline__ void pack(const float* i, float& v) { v = i[0]; }
__device__ __forceinline__ void pack(const float* i, float2& v) { v = make_float2(i[0], i[1]); }
__device__ __forceinline__ void pack(const float* i, float4& v) { v = make_float4(i[0], i[1], i[2], i[3]); }

extern "C" __global__ void __launch_bounds__(THREADS)
softmax_rows(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    typedef typename Vec<VEC>::T V;
    __shared__ float red[32];
    const long long row = blockIdx.x;
    const V* xr = reinterpret_cast<const V*>(x + row * cols);
    V* yr = reinterpret_cast<V*>(y + row * cols);
    const int nv = cols / VEC;                  // cols % VEC == 0 (a constraint)

    if (nv <= THREADS * ITEMS) {
        float v[ITEMS * VEC];
        float m = NEG_INF;
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            const int j = i * THREADS + threadIdx.x;
            if (j < nv) {
                unpack(__ldg(xr + j), v + i * VEC);
            } else {
#pragma unroll
                for (int k = 0; k < VEC; ++k) v[i * VEC + k] = NEG_INF;
            }
        }
#pragma unroll
        for (int k = 0; k < ITEMS * VEC; ++k) m = fmaxf(m, v[k]);
        m = block_reduce<0>(m, red);
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < ITEMS * VEC; ++k) { v[k] = __expf(v[k] - m); s += v[k]; }
        s = block_reduce<1>(s, red);
        const float inv = 1.0f / s;
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            const int j = i * THREADS + threadIdx.x;
            if (j < nv) {
                float o[VEC];
#pragma unroll
                for (int k = 0; k < VEC; ++k) o[k] = v[i * VEC + k] * inv;
                V out;
                pack(o, out);
                __stcs(yr + j, out);           // streaming: y is not read again
            }
        }
        return;
    }
    // wider rows: an online max and sum over the row, then a second pass that writes
    float m = NEG_INF, s = 0.0f;
    for (int j = threadIdx.x; j < nv; j += THREADS) {
        float t[VEC];
        unpack(__ldg(xr + j), t);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            const float mn = fmaxf(m, t[k]);
            s = s * __expf(m - mn) + __expf(t[k] - mn);
            m = mn;
        }
    }
    const float bm = block_reduce<0>(m, red);
    s = block_reduce<1>(m == NEG_INF ? 0.0f : s * __expf(m - bm), red);
    const float inv = 1.0f / s;
    for (int j = threadIdx.x; j < nv; j += THREADS) {
        float t[VEC];
        unpack(__ldg(xr + j), t);
#pragma unroll
        for (int k = 0; k < VEC; ++k) t[k] = __expf(t[k] - bm) * inv;
        V out;
        pack(t, out);
        __stcs(yr + j, out);
    }
}
