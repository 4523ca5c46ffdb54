// flash_attention_fwd: bf16 attention forward for Hopper (sm_90a), FlashAttention-style.
//
// O = softmax(scale * Q K^T [+ causal mask]) V and LSE = log-sum-exp of each row (natural log),
// for Q, K, V, O laid out [batch, heads, seq, head_dim] bf16, K / V with HKV heads (GQA:
// H % HKV == 0, query head h reads KV head h / (H / HKV)). LSE is fp32 [batch, heads, seq].
//
// One CTA computes a tile of BM = 64 * CONSUMERS query rows of one head:
//   warpgroup 0, the producer: one thread loads the Q tile, then K and V tiles of BN rows into
//     a STAGES-deep ring (TMA over 3-D tensor maps {HD, S, heads}: rows past S read as zeros),
//     K and V with barriers of their own so that Q K^T can start before V lands.
//   warpgroups 1..CONSUMERS: 64 query rows each. S = Q K^T (wgmma, both from shared memory),
//     online softmax in registers (exp2, scale folded in), P converted in place into the
//     A-operand fragment, O += P V (wgmma, P from registers, V MN-major from shared memory).
// INTRA = 1 overlaps inside a warpgroup: Q K_j^T and P_{j-1} V_{j-1} are issued together and
// the softmax of S_j runs while P V is in flight. PINGPONG = 1 (with INTRA) orders the GEMM
// issue of the consumer warpgroups round-robin on named barriers, so one's softmax overlaps
// another's GEMMs. Causal: KV tiles wholly above the diagonal are skipped (CAUSAL_SKIP = 1) and
// tiles crossing it or the end of the sequence are masked. PERSIST = 1: at most one CTA per SM,
// each taking units of two query tiles of one head (mb and nmb - 1 - mb: equal causal work),
// the producer loading the next tile's K / V / Q while the consumers finish the last one.
// EPI = 1 stages O in shared memory and stores it by TMA (clipped at S).
// Work is ordered head by head (the CTAs running together share K / V in L2); on the plain grid
// causal runs take the heaviest (last) query tiles of a group of heads first.
#include "porter.cuh"
#include "hopper/hopper.cuh"

#ifndef HD
#define HD 128          // head dim: 64 or 128
#endif
#ifndef BN
#define BN 128          // KV tile rows (columns of S)
#endif
#ifndef STAGES
#define STAGES 2
#endif
#ifndef CONSUMERS
#define CONSUMERS 2     // consumer warpgroups, 64 query rows each
#endif
#ifndef INTRA
#define INTRA 1
#endif
#ifndef PINGPONG
#define PINGPONG 1
#endif
#ifndef PERSIST
#define PERSIST 0
#endif
#ifndef CAUSAL_SKIP
#define CAUSAL_SKIP 1
#endif
#ifndef EPI
#define EPI 0           // 0: O stored from registers; 1: staged in shared memory, stored by TMA
#endif

#define BM (64 * CONSUMERS)
#define THREADS (128 * (CONSUMERS + 1))
#define Q_BYTES (BM * HD * 2)
#define KV_BYTES (BN * HD * 2)
#define Q_BOX (BM * 128)      // one 64-column box of the Q tile
#define KV_BOX (BN * 128)
#define O_BYTES (EPI ? Q_BYTES : 0)   // EPI = 1: the O tile, laid out like Q

static_assert(HD == 64 || HD == 128, "HD must be 64 or 128");
static_assert(BN % 16 == 0 && BN >= 16 && BN <= 256, "BN: a multiple of 16 up to 256");
static_assert(CONSUMERS >= 1 && CONSUMERS <= 3, "CONSUMERS: 1..3");
static_assert(!PINGPONG || (INTRA && CONSUMERS >= 2), "PINGPONG needs INTRA and 2+ consumers");

#if CONSUMERS == 1
#define PRODUCER_REGS 56
#define CONSUMER_REGS 240
#elif CONSUMERS == 2
#define PRODUCER_REGS 24
#define CONSUMER_REGS 240
#else
#define PRODUCER_REGS 24
#define CONSUMER_REGS 160
#endif

using namespace hopper;

#define NEG_INF __int_as_float(0xff800000)

struct Tile {
  int z, zkv, m0, n_end;   // Q/O head slice, K/V head slice, first query row, KV tiles to do
};

__device__ __forceinline__ uint32_t sm_count() {
  uint32_t n;
  asm("mov.u32 %0, %%nsmid;" : "=r"(n));
  return n;
}

__device__ __forceinline__ Tile make_tile(int bh, int mb, int H, int HKV, int S, int causal) {
  Tile w;
  w.z = bh;
  w.zkv = (bh / H) * HKV + (bh % H) / (H / HKV);
  w.m0 = mb * BM;
  const int nkv = (S + BN - 1) / BN;
  w.n_end = (causal && CAUSAL_SKIP) ? min(nkv, (w.m0 + BM + BN - 1) / BN) : nkv;
  return w;
}

// Plain grid (one tile per CTA, the hardware hands out CTAs in order as SMs free up): heads in
// groups of about two waves of tiles (their K / V stay in L2), causal runs taking the heaviest
// query tiles (the last rows) of the group first.
__device__ __forceinline__ Tile decode(int t, int nmb, int BH, int H, int HKV, int S, int causal,
                                       int G) {
  const int hg = max(1, 2 * G / nmb);
  const int g = t / (hg * nmb), u = t % (hg * nmb);
  const int cnt = min(hg, BH - g * hg);       // heads in this (maybe last, smaller) group
  const int r = u / cnt;
  return make_tile(g * hg + u % cnt, causal ? nmb - 1 - r : r, H, HKV, S, causal);
}

// Persistent grid: the work comes in units of two query tiles of one head, mb and
// nmb - 1 - mb, which cost the same in causal runs; CTA i takes units i, i + G, ... (head by
// head, so the CTAs of a round share K / V) and both tiles of each. `k` counts the CTA's tiles.
// Returns false past the end; `skip` marks the second half of a middle unit (odd nmb).
__device__ __forceinline__ bool decode_persistent(int k, int nmb, int BH, int H, int HKV, int S,
                                                  int causal, Tile& w, bool& skip) {
  const int npairs = (nmb + 1) / 2;
  const int unit = (k >> 1) * (int)gridDim.x + (int)blockIdx.x;
  if (unit >= BH * npairs) return false;
  const int pr = unit % npairs;
  const int mb = (k & 1) ? pr : nmb - 1 - pr;
  skip = (k & 1) && mb == nmb - 1 - pr;
  w = make_tile(unit / npairs, mb, H, HKV, S, causal);
  return true;
}

// Masks S_j where needed, folds it into the running max / sum of the thread's two rows and
// leaves exp2(scale * log2(e) * S - m) in s. Returns the factors that rescale O's rows.
__device__ __forceinline__ void online_softmax(float* s, float* m, float* l, float* corr,
                                               bool mask, int col0, int row0, int S, int causal,
                                               float sl2) {
  if (mask) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) {
      const int col = col0 + frag::acc_col(i);
      const int row = row0 + 8 * ((i / 2) % 2);
      if (col >= S || (causal && col > row)) s[i] = NEG_INF;
    }
  }
  float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) mx[(i / 2) % 2] = fmaxf(mx[(i / 2) % 2], s[i]);
  float ms[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float mn = fmaxf(m[r], frag::quad_max(mx[r]) * sl2);
    ms[r] = mn == NEG_INF ? 0.f : mn;     // a row with nothing unmasked yet
    corr[r] = exp2f(m[r] - ms[r]);
    m[r] = mn;
  }
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) {
    const int r = (i / 2) % 2;
    s[i] = exp2f(fmaf(s[i], sl2, -ms[r]));
    sum[r] += s[i];
  }
  l[0] = l[0] * corr[0] + sum[0];
  l[1] = l[1] * corr[1] + sum[1];
}

__device__ __forceinline__ void rescale(float* o, const float* corr) {
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] *= corr[(i / 2) % 2];
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
flash_attention_fwd(const bf16_t* __restrict__ Q, const bf16_t* __restrict__ K,
                    const bf16_t* __restrict__ V, bf16_t* __restrict__ O, float* __restrict__ LSE,
                    int B, int H, int HKV, int S, int causal, float scale, void* workspace,
                    const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                    const __grid_constant__ CUtensorMap tmV, const __grid_constant__ CUtensorMap tmO) {
  (void)Q; (void)K; (void)V; (void)workspace;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023) & ~1023u;
  const uint32_t sQ = base;
  const uint32_t sK = sQ + Q_BYTES;
  const uint32_t sV = sK + STAGES * KV_BYTES;
  const uint32_t sO = sV + STAGES * KV_BYTES;
  const uint32_t bars = sO + O_BYTES;
  const Ring<STAGES> ringK(bars), ringV(bars + Ring<STAGES>::BARRIER_BYTES);
  const uint32_t fullQ = bars + 2 * Ring<STAGES>::BARRIER_BYTES, emptyQ = fullQ + 8;

  const int wg = warpgroup::index();
  if (threadIdx.x == 0) {
    ringK.init(4 * CONSUMERS);
    ringV.init(4 * CONSUMERS);
    mbar_init(fullQ, 1);
    mbar_init(emptyQ, 4 * CONSUMERS);
    fence_barrier_init();
  }
  __syncthreads();

  const int nmb = (S + BM - 1) / BM;
  const int ntiles = nmb * B * H;
  (void)ntiles;
  // This CTA's tiles, in order: w is the k-th.
#if PERSIST
#define FOR_EACH_TILE(w) \
  Tile w; \
  bool skip_; \
  for (int k_ = 0; decode_persistent(k_, nmb, B * H, H, HKV, S, causal, w, skip_); ++k_) \
    if (!skip_)
#else
#define FOR_EACH_TILE(w) \
  for (Tile w = decode(blockIdx.x, nmb, B * H, H, HKV, S, causal, (int)sm_count()), *once_ = &w; \
       once_; once_ = nullptr)
#endif

  if (wg == 0) {
    // ---------------------------------------------------------------- producer
    warpgroup::shrink_regs<PRODUCER_REGS>();
    if (threadIdx.x == 0) {
      tma::prefetch_desc(&tmQ);
      tma::prefetch_desc(&tmK);
      tma::prefetch_desc(&tmV);
      Cursor<STAGES> kc;
      uint32_t tq = 0;
      FOR_EACH_TILE(w) {
        for (int j = 0; j < w.n_end; ++j) {
          ringK.acquire(kc);
          uint32_t bar = ringK.commit(kc, KV_BYTES);
#pragma unroll
          for (int d = 0; d < HD / 64; ++d)
            tma::load_3d(sK + kc.stage * KV_BYTES + d * KV_BOX, &tmK, bar, 64 * d, j * BN, w.zkv);
          if (j == 0) {   // Q after the first K: that K load need not wait for the last epilogue
            mbar_wait(emptyQ, (tq & 1) ^ 1);
            mbar_expect_tx(fullQ, Q_BYTES);
#pragma unroll
            for (int d = 0; d < HD / 64; ++d)
              tma::load_3d(sQ + d * Q_BOX, &tmQ, fullQ, 64 * d, w.m0, w.z);
          }
          ringV.acquire(kc);
          bar = ringV.commit(kc, KV_BYTES);
#pragma unroll
          for (int d = 0; d < HD / 64; ++d)
            tma::load_3d(sV + kc.stage * KV_BYTES + d * KV_BOX, &tmV, bar, 64 * d, j * BN, w.zkv);
          kc.advance();
        }
        ++tq;
      }
    }
  } else {
    // ---------------------------------------------------------------- consumers
    warpgroup::grow_regs<CONSUMER_REGS>();
    const int c = wg - 1;
    const int lane = threadIdx.x % 32;
    const float sl2 = scale * 1.4426950408889634f;
    const uint32_t qa = sQ + c * 64 * 128;    // this warpgroup's 64 rows of every Q box
#if PINGPONG
    // GEMM issue passes round-robin: c waits on barrier 5 + c, then hands on to the next
    const uint32_t my_bar = 5 + c, next_bar = 5 + (c + 1) % CONSUMERS;
    if (c == CONSUMERS - 1) named_arrive(5, 256);   // warpgroup 0 goes first
#endif
    Cursor<STAGES> kc;
    uint32_t tq = 0;
    FOR_EACH_TILE(w) {
      const int row0 = w.m0 + c * 64 + warpgroup::warp() * 16 + lane / 4;   // rows row0, row0 + 8
      const int wg_first_row = w.m0 + c * 64;
      float o[HD / 2], s[BN / 2], m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f}, corr[2];
      uint32_t p[BN / 4];   // P as the A operand: BN / 16 k16 steps of 4 words
#pragma unroll
      for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
      mbar_wait(fullQ, tq & 1);

      const auto needs_mask = [&](int j) {
        return (j + 1) * BN > S || (causal && (j + 1) * BN - 1 > wg_first_row);
      };
      const auto issue_qk = [&](const Cursor<STAGES>& at) {
        ringK.wait(at);
        wgmma::fence();
        wgmma::mma_ss_k<BN, HD / 16>(s, qa, Q_BOX, sK + at.stage * KV_BYTES, KV_BOX, false);
        wgmma::commit();
      };
      const auto issue_pv = [&](const Cursor<STAGES>& at) {
        ringV.wait(at);
        wgmma::fence();
        wgmma::mma_rs_mn<HD, BN / 16>(o, p, sV + at.stage * KV_BYTES, KV_BOX);
        wgmma::commit();
      };
      const auto qk_done = [&](const Cursor<STAGES>& at, int j) {
        wgmma::fence_regs<BN / 2>(s);
        if (lane == 0) {
          ringK.release(at);
          if (j == w.n_end - 1) mbar_arrive(emptyQ);
        }
      };

#if INTRA
      // S_0 alone; then each step issues Q K_j^T and P_{j-1} V_{j-1} together and runs the
      // softmax of S_j while P V is in flight.
      Cursor<STAGES> prev = kc;
#if PINGPONG
      named_sync(my_bar, 256);
#endif
      issue_qk(kc);
#if PINGPONG
      named_arrive(next_bar, 256);
#endif
      wgmma::wait<0>();
      qk_done(kc, 0);
      online_softmax(s, m, l, corr, needs_mask(0), 0, row0, S, causal, sl2);
      frag::acc_to_a_bf16<BN>(s, p);
      kc.advance();
      for (int j = 1; j < w.n_end; ++j) {
#if PINGPONG
        named_sync(my_bar, 256);
#endif
        issue_qk(kc);
        rescale(o, corr);
        issue_pv(prev);
#if PINGPONG
        named_arrive(next_bar, 256);
#endif
        wgmma::wait<1>();
        qk_done(kc, j);
        online_softmax(s, m, l, corr, needs_mask(j), j * BN, row0, S, causal, sl2);
        wgmma::wait<0>();
        wgmma::fence_regs<HD / 2>(o);
        if (lane == 0) ringV.release(prev);
        frag::acc_to_a_bf16<BN>(s, p);
        prev = kc;
        kc.advance();
      }
      rescale(o, corr);
      issue_pv(prev);
      wgmma::wait<0>();
      wgmma::fence_regs<HD / 2>(o);
      if (lane == 0) ringV.release(prev);
#else
      for (int j = 0; j < w.n_end; ++j) {
        issue_qk(kc);
        wgmma::wait<0>();
        qk_done(kc, j);
        online_softmax(s, m, l, corr, needs_mask(j), j * BN, row0, S, causal, sl2);
        rescale(o, corr);
        frag::acc_to_a_bf16<BN>(s, p);
        issue_pv(kc);
        wgmma::wait<0>();
        wgmma::fence_regs<HD / 2>(o);
        if (lane == 0) ringV.release(kc);
        kc.advance();
      }
#endif

      // ------------------------------------------------------------ epilogue
#if EPI
      if (warpgroup::thread() == 0) tma::store_wait_read();   // the last tile's O has left
      warpgroup::sync();
#endif
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float lt = frag::quad_sum(l[r]);
        const int row = row0 + 8 * r;
        const float inv = 1.f / lt;
#pragma unroll
        for (int i = 0; i < HD / 2; ++i)
          if ((i / 2) % 2 == r) o[i] *= inv;
#if EPI
        (void)O;
        // this thread's pairs into the swizzled 64-column boxes (16-byte chunk j % 8 of row
        // rr at (j % 8 ^ rr % 8) * 16, as TMA's 128-byte swizzle reads it back)
        const int rr = c * 64 + warpgroup::warp() * 16 + lane / 4 + 8 * r;
#pragma unroll
        for (int j = 0; j < HD / 8; ++j) {
          const uint32_t a = sO + (j / 8) * Q_BOX + rr * 128 + (((j % 8) ^ (rr % 8)) * 16) + 4 * (lane % 4);
          asm volatile("st.shared.b32 [%0], %1;" :: "r"(a), "r"(pack_bf16x2(o[4 * j + 2 * r], o[4 * j + 2 * r + 1])) : "memory");
        }
        if (row < S && lane % 4 == 0)
          LSE[(size_t)w.z * S + row] = (m[r] + __log2f(lt)) * 0.6931471805599453f;
#else
        if (row < S) {
          bf16_t* orow = O + ((size_t)w.z * S + row) * HD + 2 * (lane % 4);
#pragma unroll
          for (int j = 0; j < HD / 8; ++j)
            *reinterpret_cast<uint32_t*>(orow + 8 * j) = pack_bf16x2(o[4 * j + 2 * r], o[4 * j + 2 * r + 1]);
          if (lane % 4 == 0) LSE[(size_t)w.z * S + row] = (m[r] + __log2f(lt)) * 0.6931471805599453f;
        }
#endif
      }
#if EPI
      fence_proxy_async();
      warpgroup::sync();
      if (warpgroup::thread() == 0) {
#pragma unroll
        for (int d = 0; d < HD / 64; ++d)
          tma::store_3d(&tmO, sO + d * Q_BOX + c * 64 * 128, 64 * d, w.m0 + c * 64, w.z);
        tma::store_commit();
      }
#endif
      ++tq;
    }
#if EPI
    if (warpgroup::thread() == 0) tma::store_wait_all();   // the staging smem outlives the stores
#endif
  }
}
