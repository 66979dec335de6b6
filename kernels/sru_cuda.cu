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

__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ double load(const double* p) { return *p; }
__device__ __forceinline__ float load(const half_t* p) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(p->bits));
  return f;
}
__device__ __forceinline__ float load(const bf16_t* p) {
  return __uint_as_float(((unsigned int)p->bits) << 16);
}

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
// mostly waits on memory. The loops therefore run in chunks of SRU_CHUNK steps: all loads of a
// chunk are issued first (they do not depend on c), then the chunk's arithmetic runs from registers.
#ifndef SRU_CHUNK
#define SRU_CHUNK 8
#endif

extern "C" __global__ void sru_forward(const SRU_T* __restrict__ u, const SRU_T* __restrict__ x,
                                       const SRU_F* __restrict__ wc, const SRU_F* __restrict__ bias,
                                       const SRU_F* __restrict__ c0,
                                       const unsigned char* __restrict__ mask, SRU_T* __restrict__ h,
                                       SRU_F* __restrict__ c_all, SRU_F* __restrict__ c_last, int L,
                                       int B, int D, int bidirectional) {
  const idx_t n = (idx_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= (idx_t)B * D) return;
  const int col = (int)(n % D);
  const int b = (int)(n / D);
  const bool reverse = bidirectional && col >= D / 2;
  const SRU_F v = wc[col], vr = wc[D + col], bf = bias[col], br = bias[D + col];
  SRU_F c = c0 ? c0[n] : SRU_F(0);
  for (int s0 = 0; s0 < L; s0 += SRU_CHUNK) {
    SRU_F u0[SRU_CHUNK], u1[SRU_CHUNK], u2[SRU_CHUNK], xv[SRU_CHUNK];
    bool real[SRU_CHUNK];
#pragma unroll
    for (int k = 0; k < SRU_CHUNK; ++k) {
      const int s = s0 + k;
      if (s < L) {
        const int t = reverse ? L - 1 - s : s;
        const idx_t off = ((idx_t)t * B + b) * D + col;
        const SRU_T* up = u + off * 3;
        u0[k] = load(up);
        u1[k] = load(up + 1);
        u2[k] = load(up + 2);
        xv[k] = load(x + off);
        real[k] = !mask || mask[(idx_t)t * B + b];
      }
    }
#pragma unroll
    for (int k = 0; k < SRU_CHUNK; ++k) {
      const int s = s0 + k;
      if (s < L) {
        const int t = reverse ? L - 1 - s : s;
        const idx_t off = ((idx_t)t * B + b) * D + col;
        SRU_F hv = SRU_F(0);
        if (real[k]) c = sru::forward_step<SRU_F>(u0[k], u1[k], u2[k], xv[k], v, vr, bf, br, c, &hv);
        store(h + off, hv);  // padded steps keep c and emit h = 0
        if (c_all) c_all[off] = c;
      }
    }
  }
  c_last[n] = c;
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
  const bool reverse = bidirectional && col >= D / 2;
  const SRU_F v = wc[col], vr = wc[D + col], bf = bias[col], br = bias[D + col];
  const SRU_F c_init = c0 ? c0[n] : SRU_F(0);
  SRU_F gc = grad_c_last ? grad_c_last[n] : SRU_F(0);
  SRU_F gv = 0, gvr = 0, gbf = 0, gbr = 0;
  // s is the step index in forward order; chunk k holds step s0 - k. cs[k] is the state after step
  // s0 - k, so the state before it is cs[k + 1] (c_init before step 0).
  for (int s0 = L - 1; s0 >= 0; s0 -= SRU_CHUNK) {
    SRU_F u0[SRU_CHUNK], u1[SRU_CHUNK], u2[SRU_CHUNK], xv[SRU_CHUNK], gh[SRU_CHUNK];
    SRU_F cs[SRU_CHUNK + 1];
    bool real[SRU_CHUNK];
#pragma unroll
    for (int k = 0; k <= SRU_CHUNK; ++k) {
      const int s = s0 - k;
      if (s < 0) {
        cs[k] = c_init;
        continue;
      }
      const int t = reverse ? L - 1 - s : s;
      const idx_t off = ((idx_t)t * B + b) * D + col;
      cs[k] = c_all[off];
      if (k == SRU_CHUNK) continue;
      const SRU_T* up = u + off * 3;
      u0[k] = load(up);
      u1[k] = load(up + 1);
      u2[k] = load(up + 2);
      xv[k] = load(x + off);
      gh[k] = load(grad_h + off);
      real[k] = !mask || mask[(idx_t)t * B + b];
    }
#pragma unroll
    for (int k = 0; k < SRU_CHUNK; ++k) {
      const int s = s0 - k;
      if (s >= 0) {
        const int t = reverse ? L - 1 - s : s;
        const idx_t off = ((idx_t)t * B + b) * D + col;
        SRU_T* gup = grad_u + off * 3;
        sru::StepGrad<SRU_F> g = {SRU_F(0), SRU_F(0), SRU_F(0), SRU_F(0)};
        if (real[k]) {
          gc = sru::backward_step<SRU_F>(u0[k], u1[k], u2[k], xv[k], v, vr, bf, br, cs[k + 1], cs[k],
                                         gh[k], gc, &g, &gv, &gvr, &gbf, &gbr);
        }
        store(gup, g.u0);  // padded steps pass gc through and get zero gradients
        store(gup + 1, g.u1);
        store(gup + 2, g.u2);
        store(grad_x + off, g.x);
      }
    }
  }
  grad_c0[n] = gc;
  SRU_F* wp = wpart + (idx_t)b * 4 * D + col;
  wp[0] = gv;
  wp[D] = gvr;
  wp[2 * D] = gbf;
  wp[3 * D] = gbr;
}
