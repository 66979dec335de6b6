// CUDA kernels of the SRU elementwise recurrence, compiled at run time by NVRTC (cupy.RawModule).
//
// One thread owns SRU_COLS adjacent columns of one batch entry and walks through time. Layouts (all contiguous):
//   u      (L, B, D, 3)  storage type T      x, h, grad_x (L, B, D)  T
//   c_all  (L, B, D)     compute type F       c0, c_last, grad_c0 (B, D)  F
//   c_all may be null (inference: no backward pass will need the states)
//   wc, bias (2, D)      F                    mask (L, B) uint8, or null (no padding)
//   wpart  (B, 4, D)     F: per-batch partial gradients of v, v', b, b', summed over B by the
//                        caller in a fixed order, so parameter gradients are deterministic.
// With bidirectional = 1 the columns [D/2, D) run backward in time.
//
// The build defines SRU_T (storage) and SRU_F (compute) types; half and bfloat16 are carried as
// raw 16-bit words and converted here, so no CUDA toolkit header is needed.
//
// SRU_COLS (1, 2 or 4) is how many adjacent columns a thread owns. With more than one, a step's values
// of the thread's columns are adjacent in memory and move as whole words: with 2, u's six 16-bit
// values as three 32-bit loads, x and h as one each, so a bf16 thread issues half the memory
// instructions per column (with 4: 64-bit words for bf16, 128-bit for fp32), and its recurrences are
// independent chains the scheduler can interleave. The caller (srupp_asr/recurrence.py) launches
// D / SRU_COLS threads per batch entry and uses SRU_COLS only when D (and, bidirectional, D / 2) is a
// multiple of it and the tensors are aligned to the words.
//
// The same source also compiles as host C++ (tests/cuda_emulation.py runs every thread of the grid
// in turn on the CPU), so CI checks the indexing, chunking and column grouping without a GPU; the
// `__CUDA_ARCH__` branches below are the only code that only a GPU runs.
#include "sru_step.h"

#ifndef SRU_COLS
#define SRU_COLS 1
#endif

typedef long long idx_t;

struct half_t { unsigned short bits; };
struct bf16_t { unsigned short bits; };

// The chunk buffers below hold raw storage values; converting at use (not at load) keeps a
// pending load from stalling the warp before the previous chunk's arithmetic has run.
__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ double to_f(double v) { return v; }
__device__ __forceinline__ float to_f(half_t v) {
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
  return f;
#else
  _Float16 h;
  __builtin_memcpy(&h, &v.bits, 2);
  return (float)h;
#endif
}
__device__ __forceinline__ float to_f(bf16_t v) { return __uint_as_float(((unsigned int)v.bits) << 16); }

// Rounding to the storage type (to nearest even).
template <typename T>
__device__ __forceinline__ T to_storage(SRU_F v);
template <>
__device__ __forceinline__ float to_storage<float>(SRU_F v) { return v; }
template <>
__device__ __forceinline__ double to_storage<double>(SRU_F v) { return v; }
template <>
__device__ __forceinline__ half_t to_storage<half_t>(SRU_F v) {
  half_t r;
#if defined(__CUDA_ARCH__)
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"((float)v));
#else
  const _Float16 h = (_Float16)(float)v;
  __builtin_memcpy(&r.bits, &h, 2);
#endif
  return r;
}
template <>
__device__ __forceinline__ bf16_t to_storage<bf16_t>(SRU_F v) {
  bf16_t r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"((float)v));
#else
  unsigned int u = __float_as_uint((float)v);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) {
    r.bits = 0x7fff;  // NaN stays NaN
    return r;
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  r.bits = (unsigned short)(u >> 16);
#endif
  return r;
}

// Whole words of N bytes, each moved by one load or store instruction.
template <int N>
struct Word;
template <>
struct Word<2> { typedef unsigned short type; };
template <>
struct Word<4> { typedef unsigned int type; };
template <>
struct Word<8> { typedef unsigned long long type; };
struct alignas(16) Word16 { unsigned long long lo, hi; };
template <>
struct Word<16> { typedef Word16 type; };
struct alignas(32) Word32 { Word16 lo, hi; };  // fp64 with 4 columns (two 128-bit moves)
template <>
struct Word<32> { typedef Word32 type; };

// W words of SRU_COLS values of type V: a step's values of the thread's columns (W = 1), or of
// their u (W = 3: the columns' (u0, u1, u2) triples one after another).
template <typename V, int W>
union Pack {
  V v[W * SRU_COLS];
  typename Word<SRU_COLS * sizeof(V)>::type w[W];
};

template <typename V, int W>
__device__ __forceinline__ void load(Pack<V, W>& p, const V* __restrict__ src) {
  typedef typename Word<SRU_COLS * sizeof(V)>::type word;
  const word* s = reinterpret_cast<const word*>(src);
#pragma unroll
  for (int i = 0; i < W; ++i) p.w[i] = s[i];
}

template <typename V, int W>
__device__ __forceinline__ void store(V* __restrict__ dst, const Pack<V, W>& p) {
  typedef typename Word<SRU_COLS * sizeof(V)>::type word;
  word* d = reinterpret_cast<word*>(dst);
#pragma unroll
  for (int i = 0; i < W; ++i) d[i] = p.w[i];
}

// Each thread's time loop is a dependency chain, so with one step's loads in flight a warp
// mostly waits on memory. The loops therefore run in chunks of SRU_CHUNK steps, double-buffered:
// the loads of the next chunk (which do not depend on c) are issued before the arithmetic of the
// current chunk runs from registers, so memory latency hides behind the recurrence.
#ifndef SRU_CHUNK
#define SRU_CHUNK 4
#endif

// Where a thread's columns live: step s (forward order) of its first column is at first + s * stride
// in an (L, B, D) array and at mfirst + s * mstride in the (L, B) mask; stride is negative for
// backward columns. The thread's batch entry is b and its first column col.
struct Ctx {
  int L, b, col;
  idx_t first, stride, mfirst, mstride;
  __device__ __forceinline__ Ctx(int L_, int B, int D, idx_t n, int bidirectional) : L(L_) {
    const int groups = D / SRU_COLS;
    b = (int)(n / groups);
    col = (int)(n % groups) * SRU_COLS;
    const bool reverse = bidirectional && col >= D / 2;
    const idx_t t0 = reverse ? L_ - 1 : 0;
    first = (t0 * B + b) * D + col;
    stride = reverse ? -(idx_t)B * D : (idx_t)B * D;
    mfirst = t0 * B + b;
    mstride = reverse ? -(idx_t)B : (idx_t)B;
  }
  __device__ __forceinline__ idx_t off(int s) const { return first + s * stride; }
  __device__ __forceinline__ bool real(const unsigned char* mask, int s) const {
    return !mask || mask[mfirst + s * mstride];
  }
};

// The recurrent weights and biases of a thread's columns.
struct Params {
  SRU_F v[SRU_COLS], vr[SRU_COLS], bf[SRU_COLS], br[SRU_COLS];
  __device__ __forceinline__ Params(const SRU_F* __restrict__ wc, const SRU_F* __restrict__ bias, int D, int col) {
#pragma unroll
    for (int j = 0; j < SRU_COLS; ++j) {
      v[j] = wc[col + j];
      vr[j] = wc[D + col + j];
      bf[j] = bias[col + j];
      br[j] = bias[D + col + j];
    }
  }
};

struct FwdChunk {
  Pack<SRU_T, 3> u[SRU_CHUNK];
  Pack<SRU_T, 1> x[SRU_CHUNK];
  bool real[SRU_CHUNK];
};

// Loads steps s0 .. s0 + SRU_CHUNK - 1 (those < L).
__device__ __forceinline__ void load_fwd(FwdChunk& q, const Ctx& k_, int s0, const SRU_T* __restrict__ u,
                                         const SRU_T* __restrict__ x, const unsigned char* __restrict__ mask) {
#pragma unroll
  for (int k = 0; k < SRU_CHUNK; ++k) {
    const int s = s0 + k;
    if (s < k_.L) {
      const idx_t off = k_.off(s);
      load(q.u[k], u + off * 3);
      load(q.x[k], x + off);
      q.real[k] = k_.real(mask, s);
    }
  }
}

extern "C" __global__ void sru_forward(const SRU_T* __restrict__ u, const SRU_T* __restrict__ x,
                                       const SRU_F* __restrict__ wc, const SRU_F* __restrict__ bias,
                                       const SRU_F* __restrict__ c0,
                                       const unsigned char* __restrict__ mask, SRU_T* __restrict__ h,
                                       SRU_F* __restrict__ c_all, SRU_F* __restrict__ c_last, int L,
                                       int B, int D, int bidirectional) {
  const idx_t n = (idx_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= (idx_t)B * (D / SRU_COLS)) return;
  const Ctx ctx(L, B, D, n, bidirectional);
  const Params p(wc, bias, D, ctx.col);
  const idx_t state = (idx_t)ctx.b * D + ctx.col;  // the columns' index in (B, D)
  SRU_F c[SRU_COLS];
#pragma unroll
  for (int j = 0; j < SRU_COLS; ++j) c[j] = c0 ? c0[state + j] : SRU_F(0);
  FwdChunk cur, nxt;
  load_fwd(cur, ctx, 0, u, x, mask);
  for (int s0 = 0; s0 < L; s0 += SRU_CHUNK) {
    if (s0 + SRU_CHUNK < L) load_fwd(nxt, ctx, s0 + SRU_CHUNK, u, x, mask);
#pragma unroll
    for (int k = 0; k < SRU_CHUNK; ++k) {
      const int s = s0 + k;
      if (s < L) {
        const idx_t off = ctx.off(s);
        Pack<SRU_T, 1> hp;
        Pack<SRU_F, 1> cp;
#pragma unroll
        for (int j = 0; j < SRU_COLS; ++j) {
          SRU_F hv = SRU_F(0);  // padded steps keep c and emit h = 0
          if (cur.real[k]) {
            const SRU_T* uj = cur.u[k].v + 3 * j;
            c[j] = sru::forward_step<SRU_F>(to_f(uj[0]), to_f(uj[1]), to_f(uj[2]), to_f(cur.x[k].v[j]), p.v[j],
                                            p.vr[j], p.bf[j], p.br[j], c[j], &hv);
          }
          hp.v[j] = to_storage<SRU_T>(hv);
          cp.v[j] = c[j];
        }
        store(h + off, hp);
        if (c_all) store(c_all + off, cp);
      }
    }
    cur = nxt;
  }
#pragma unroll
  for (int j = 0; j < SRU_COLS; ++j) c_last[state + j] = c[j];
}

struct BwdChunk {
  Pack<SRU_T, 3> u[SRU_CHUNK];
  Pack<SRU_T, 1> x[SRU_CHUNK], gh[SRU_CHUNK];
  Pack<SRU_F, 1> c[SRU_CHUNK + 1];  // c[k]: the states after step s0 - k; c[k + 1] the states before it
  bool real[SRU_CHUNK];
};

// Loads steps s0, s0 - 1, ..., s0 - SRU_CHUNK + 1 (those >= 0) and the states before the last.
__device__ __forceinline__ void load_bwd(BwdChunk& q, const Ctx& k_, int s0, const SRU_T* __restrict__ u,
                                         const SRU_T* __restrict__ x, const SRU_T* __restrict__ grad_h,
                                         const SRU_F* __restrict__ c_all, const Pack<SRU_F, 1>& c_init,
                                         const unsigned char* __restrict__ mask) {
#pragma unroll
  for (int k = 0; k <= SRU_CHUNK; ++k) {
    const int s = s0 - k;
    if (s < 0) {
      q.c[k] = c_init;
      continue;
    }
    const idx_t off = k_.off(s);
    load(q.c[k], c_all + off);
    if (k == SRU_CHUNK) continue;
    load(q.u[k], u + off * 3);
    load(q.x[k], x + off);
    load(q.gh[k], grad_h + off);
    q.real[k] = k_.real(mask, s);
  }
}

extern "C" __global__ void sru_backward(
    const SRU_T* __restrict__ u, const SRU_T* __restrict__ x, const SRU_F* __restrict__ wc,
    const SRU_F* __restrict__ bias, const SRU_F* __restrict__ c0,
    const unsigned char* __restrict__ mask, const SRU_F* __restrict__ c_all,
    const SRU_T* __restrict__ grad_h, const SRU_F* __restrict__ grad_c_last,
    SRU_T* __restrict__ grad_u, SRU_T* __restrict__ grad_x, SRU_F* __restrict__ grad_c0,
    SRU_F* __restrict__ wpart, int L, int B, int D, int bidirectional) {
  const idx_t n = (idx_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= (idx_t)B * (D / SRU_COLS)) return;
  const Ctx ctx(L, B, D, n, bidirectional);
  const Params p(wc, bias, D, ctx.col);
  const idx_t state = (idx_t)ctx.b * D + ctx.col;
  Pack<SRU_F, 1> c_init;
  SRU_F gc[SRU_COLS], gv[SRU_COLS], gvr[SRU_COLS], gbf[SRU_COLS], gbr[SRU_COLS];
#pragma unroll
  for (int j = 0; j < SRU_COLS; ++j) {
    c_init.v[j] = c0 ? c0[state + j] : SRU_F(0);
    gc[j] = grad_c_last ? grad_c_last[state + j] : SRU_F(0);
    gv[j] = gvr[j] = gbf[j] = gbr[j] = SRU_F(0);
  }
  BwdChunk cur, nxt;
  load_bwd(cur, ctx, L - 1, u, x, grad_h, c_all, c_init, mask);
  for (int s0 = L - 1; s0 >= 0; s0 -= SRU_CHUNK) {  // s is the step index in forward order
    if (s0 - SRU_CHUNK >= 0) load_bwd(nxt, ctx, s0 - SRU_CHUNK, u, x, grad_h, c_all, c_init, mask);
#pragma unroll
    for (int k = 0; k < SRU_CHUNK; ++k) {
      const int s = s0 - k;
      if (s >= 0) {
        const idx_t off = ctx.off(s);
        Pack<SRU_T, 3> gu;
        Pack<SRU_T, 1> gx;
#pragma unroll
        for (int j = 0; j < SRU_COLS; ++j) {
          sru::StepGrad<SRU_F> g = {SRU_F(0), SRU_F(0), SRU_F(0), SRU_F(0)};
          if (cur.real[k]) {  // padded steps pass gc through and get zero gradients
            const SRU_T* uj = cur.u[k].v + 3 * j;
            gc[j] = sru::backward_step<SRU_F>(to_f(uj[0]), to_f(uj[1]), to_f(uj[2]), to_f(cur.x[k].v[j]), p.v[j],
                                              p.vr[j], p.bf[j], p.br[j], cur.c[k + 1].v[j], cur.c[k].v[j],
                                              to_f(cur.gh[k].v[j]), gc[j], &g, &gv[j], &gvr[j], &gbf[j], &gbr[j]);
          }
          gu.v[3 * j] = to_storage<SRU_T>(g.u0);
          gu.v[3 * j + 1] = to_storage<SRU_T>(g.u1);
          gu.v[3 * j + 2] = to_storage<SRU_T>(g.u2);
          gx.v[j] = to_storage<SRU_T>(g.x);
        }
        store(grad_u + off * 3, gu);
        store(grad_x + off, gx);
      }
    }
    cur = nxt;
  }
#pragma unroll
  for (int j = 0; j < SRU_COLS; ++j) {
    grad_c0[state + j] = gc[j];
    SRU_F* wp = wpart + (idx_t)ctx.b * 4 * D + ctx.col + j;
    wp[0] = gv[j];
    wp[D] = gvr[j];
    wp[2 * D] = gbf[j];
    wp[3 * D] = gbr[j];
  }
}
