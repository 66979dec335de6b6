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
  for (int s = 0; s < L; ++s) {
    const int t = reverse ? L - 1 - s : s;
    const idx_t off = ((idx_t)t * B + b) * D + col;
    if (mask && !mask[(idx_t)t * B + b]) {
      store(h + off, SRU_F(0));
      if (c_all) c_all[off] = c;
      continue;
    }
    const SRU_T* up = u + off * 3;
    SRU_F hv;
    c = sru::forward_step<SRU_F>(load(up), load(up + 1), load(up + 2), load(x + off), v, vr, bf, br,
                                 c, &hv);
    store(h + off, hv);
    if (c_all) c_all[off] = c;
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
  for (int s = L - 1; s >= 0; --s) {  // s is the step index in forward order
    const int t = reverse ? L - 1 - s : s;
    const idx_t off = ((idx_t)t * B + b) * D + col;
    SRU_T* gup = grad_u + off * 3;
    if (mask && !mask[(idx_t)t * B + b]) {
      store(gup, SRU_F(0));
      store(gup + 1, SRU_F(0));
      store(gup + 2, SRU_F(0));
      store(grad_x + off, SRU_F(0));
      continue;
    }
    const int t_prev = reverse ? t + 1 : t - 1;
    const SRU_F c_prev = s == 0 ? c_init : c_all[((idx_t)t_prev * B + b) * D + col];
    const SRU_T* up = u + off * 3;
    sru::StepGrad<SRU_F> g;
    gc = sru::backward_step<SRU_F>(load(up), load(up + 1), load(up + 2), load(x + off), v, vr, bf,
                                   br, c_prev, c_all[off], load(grad_h + off), gc, &g, &gv, &gvr,
                                   &gbf, &gbr);
    store(gup, g.u0);
    store(gup + 1, g.u1);
    store(gup + 2, g.u2);
    store(grad_x + off, g.x);
  }
  grad_c0[n] = gc;
  SRU_F* wp = wpart + (idx_t)b * 4 * D + col;
  wp[0] = gv;
  wp[D] = gvr;
  wp[2 * D] = gbf;
  wp[3 * D] = gbr;
}
