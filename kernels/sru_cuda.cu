// CUDA kernels of the SRU elementwise recurrence, compiled at run time by NVRTC (cupy.RawModule).
//
// One thread owns one (batch, column) pair and walks through time. Layouts (all contiguous):
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
#include "sru_step.h"

typedef long long idx_t;

struct half_t { unsigned short bits; };
struct bf16_t { unsigned short bits; };

// The chunk buffers below hold raw storage values; converting at use (not at load) keeps a
// pending load from stalling the warp before the previous chunk's arithmetic has run.
__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ double to_f(double v) { return v; }
__device__ __forceinline__ float to_f(half_t v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
  return f;
}
__device__ __forceinline__ float to_f(bf16_t v) { return __uint_as_float(((unsigned int)v.bits) << 16); }

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(double* p, double v) { *p = v; }
__device__ __forceinline__ void store(half_t* p, float v) {
  unsigned short b;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(b) : "f"(v));
  p->bits = b;
}
__device__ __forceinline__ void store(bf16_t* p, float v) {
  unsigned int u = __float_as_uint(v);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) {
    p->bits = 0x7fc0;  // NaN stays NaN
    return;
  }
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  p->bits = (unsigned short)(u >> 16);
}

// Each thread's time loop is a dependency chain, so with one step's loads in flight a warp
// mostly waits on memory. The loops therefore run in chunks of SRU_CHUNK steps, double-buffered:
// the loads of the next chunk (which do not depend on c) are issued before the arithmetic of the
// current chunk runs from registers, so memory latency hides behind the recurrence.
#ifndef SRU_CHUNK
#define SRU_CHUNK 4
#endif

// Where a thread's column lives: step s (forward order) is at first + s * stride in an (L, B, D)
// array and at mfirst + s * mstride in the (L, B) mask; stride is negative for backward columns.
struct Ctx {
  int L;
  idx_t first, stride, mfirst, mstride;
  __device__ __forceinline__ Ctx(int L_, int B, int D, int b, int col, bool reverse) : L(L_) {
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

struct FwdChunk {
  SRU_T u0[SRU_CHUNK], u1[SRU_CHUNK], u2[SRU_CHUNK], x[SRU_CHUNK];
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
      const SRU_T* up = u + off * 3;
      q.u0[k] = up[0];
      q.u1[k] = up[1];
      q.u2[k] = up[2];
      q.x[k] = x[off];
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
  if (n >= (idx_t)B * D) return;
  const int col = (int)(n % D);
  const Ctx ctx(L, B, D, (int)(n / D), col, bidirectional && col >= D / 2);
  const SRU_F v = wc[col], vr = wc[D + col], bf = bias[col], br = bias[D + col];
  SRU_F c = c0 ? c0[n] : SRU_F(0);
  FwdChunk cur, nxt;
  load_fwd(cur, ctx, 0, u, x, mask);
  for (int s0 = 0; s0 < L; s0 += SRU_CHUNK) {
    if (s0 + SRU_CHUNK < L) load_fwd(nxt, ctx, s0 + SRU_CHUNK, u, x, mask);
#pragma unroll
    for (int k = 0; k < SRU_CHUNK; ++k) {
      const int s = s0 + k;
      if (s < L) {
        const idx_t off = ctx.off(s);
        SRU_F hv = SRU_F(0);
        if (cur.real[k]) {
          c = sru::forward_step<SRU_F>(to_f(cur.u0[k]), to_f(cur.u1[k]), to_f(cur.u2[k]), to_f(cur.x[k]), v, vr,
                                       bf, br, c, &hv);
        }
        store(h + off, hv);  // padded steps keep c and emit h = 0
        if (c_all) c_all[off] = c;
      }
    }
    cur = nxt;
  }
  c_last[n] = c;
}

struct BwdChunk {
  SRU_T u0[SRU_CHUNK], u1[SRU_CHUNK], u2[SRU_CHUNK], x[SRU_CHUNK], gh[SRU_CHUNK];
  SRU_F c[SRU_CHUNK + 1];  // c[k]: the state after step s0 - k; c[k + 1] the state before it
  bool real[SRU_CHUNK];
};

// Loads steps s0, s0 - 1, ..., s0 - SRU_CHUNK + 1 (those >= 0) and the state before the last.
__device__ __forceinline__ void load_bwd(BwdChunk& q, const Ctx& k_, int s0, const SRU_T* __restrict__ u,
                                         const SRU_T* __restrict__ x, const SRU_T* __restrict__ grad_h,
                                         const SRU_F* __restrict__ c_all, SRU_F c_init,
                                         const unsigned char* __restrict__ mask) {
#pragma unroll
  for (int k = 0; k <= SRU_CHUNK; ++k) {
    const int s = s0 - k;
    if (s < 0) {
      q.c[k] = c_init;
      continue;
    }
    const idx_t off = k_.off(s);
    q.c[k] = c_all[off];
    if (k == SRU_CHUNK) continue;
    const SRU_T* up = u + off * 3;
    q.u0[k] = up[0];
    q.u1[k] = up[1];
    q.u2[k] = up[2];
    q.x[k] = x[off];
    q.gh[k] = grad_h[off];
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
  if (n >= (idx_t)B * D) return;
  const int col = (int)(n % D);
  const int b = (int)(n / D);
  const Ctx ctx(L, B, D, b, col, bidirectional && col >= D / 2);
  const SRU_F v = wc[col], vr = wc[D + col], bf = bias[col], br = bias[D + col];
  const SRU_F c_init = c0 ? c0[n] : SRU_F(0);
  SRU_F gc = grad_c_last ? grad_c_last[n] : SRU_F(0);
  SRU_F gv = 0, gvr = 0, gbf = 0, gbr = 0;
  BwdChunk cur, nxt;
  load_bwd(cur, ctx, L - 1, u, x, grad_h, c_all, c_init, mask);
  for (int s0 = L - 1; s0 >= 0; s0 -= SRU_CHUNK) {  // s is the step index in forward order
    if (s0 - SRU_CHUNK >= 0) load_bwd(nxt, ctx, s0 - SRU_CHUNK, u, x, grad_h, c_all, c_init, mask);
#pragma unroll
    for (int k = 0; k < SRU_CHUNK; ++k) {
      const int s = s0 - k;
      if (s >= 0) {
        const idx_t off = ctx.off(s);
        SRU_T* gup = grad_u + off * 3;
        sru::StepGrad<SRU_F> g = {SRU_F(0), SRU_F(0), SRU_F(0), SRU_F(0)};
        if (cur.real[k]) {
          gc = sru::backward_step<SRU_F>(to_f(cur.u0[k]), to_f(cur.u1[k]), to_f(cur.u2[k]), to_f(cur.x[k]), v, vr,
                                         bf, br, cur.c[k + 1], cur.c[k], to_f(cur.gh[k]), gc, &g, &gv, &gvr, &gbf, &gbr);
        }
        store(gup, g.u0);  // padded steps pass gc through and get zero gradients
        store(gup + 1, g.u1);
        store(gup + 2, g.u2);
        store(grad_x + off, g.x);
      }
    }
    cur = nxt;
  }
  grad_c0[n] = gc;
  SRU_F* wp = wpart + (idx_t)b * 4 * D + col;
  wp[0] = gv;
  wp[D] = gvr;
  wp[2 * D] = gbf;
  wp[3 * D] = gbr;
}
