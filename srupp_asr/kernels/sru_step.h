// Per-step arithmetic of the SRU elementwise recurrence, shared by the CUDA kernels
// (sru_cuda.cu, compiled by NVRTC) and the CPU implementation (sru_cpu.cpp, compiled by
// the host C++ compiler), so the CPU tests exercise exactly the arithmetic the GPU runs.
//
// Equations (one column of one direction; x is the highway input, m the padding mask):
//   f = sigmoid(u0 + v  * c_prev + bf)
//   r = sigmoid(u1 + vr * c_prev + br)
//   c = f * c_prev + (1 - f) * u2
//   h = r * c + (1 - r) * x
// A padded step (m == 0) keeps c_prev and emits h = 0.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define SRU_HD __host__ __device__ __forceinline__
#else
#include <cmath>
#define SRU_HD inline
#endif

namespace sru {

// On the GPU the float path uses the hardware exp2 and reciprocal approximations (a few ulp;
// the tests bound the end result against float64): the recurrence is latency bound there.
#if defined(__CUDA_ARCH__)
SRU_HD float exp_(float a) { return __expf(a); }
SRU_HD float recip_(float a) { return __fdividef(1.0f, a); }
#else
// On the CPU, exp(a) = 2^y with y = a * log2(e) = n + r, n = round(y) and r = y - n (exact,
// |r| <= 1/2): 2^r from a degree-5 polynomial fitted to minimise its relative error on [-1/2, 1/2]
// (at most 1.8e-7 evaluated in float, about 1.5 ulp; the sigmoid's absolute error from it is below
// 5e-8, a tenth of the rounding of its outputs), and 2^n built in the exponent bits. Working in base 2
// needs no two-part ln 2 reduction: 11 vector operations instead of 16 for the usual base-e form of
// Cephes' expf. Branch-free, so the loops over columns vectorise without calls into the vector math
// library. The callers clamp the argument to [-80, 80], so n is in [-116, 116].
SRU_HD float exp_(float a) {
  const float y = a * 1.44269504088896341f;
  const float n = __builtin_rintf(y);
  const float r = y - n;
  float p = 1.3220827e-3f;
  p = p * r + 9.6716993e-3f;
  p = p * r + 5.5508856e-2f;
  p = p * r + 2.4022238e-1f;
  p = p * r + 6.9314688e-1f;
  p = p * r + 1.0f;
  const int bits = (static_cast<int>(n) + 127) << 23;  // 2^n
  float scale;
  __builtin_memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}
SRU_HD float recip_(float a) { return 1.0f / a; }
#endif
SRU_HD double exp_(double a) { return exp(a); }
SRU_HD double recip_(double a) { return 1.0 / a; }

// The argument is clamped where exp would overflow (sigmoid is 0 or 1 to working precision
// there), so the CPU build can use its fast vectorised exp without infinities.
template <typename F>
SRU_HD F sigmoid(F a) {
  const F lim = sizeof(F) == 4 ? F(80) : F(700);
  a = a < -lim ? -lim : (a > lim ? lim : a);
  return recip_(F(1) + exp_(-a));
}

// Forward step. Returns the new cell state and writes h.
template <typename F>
SRU_HD F forward_step(F u0, F u1, F u2, F x, F v, F vr, F bf, F br, F c_prev, F* h) {
  const F f = sigmoid(u0 + v * c_prev + bf);
  const F r = sigmoid(u1 + vr * c_prev + br);
  const F c = f * c_prev + (F(1) - f) * u2;
  *h = r * c + (F(1) - r) * x;
  return c;
}

// Gradients of one step, given the incoming gradient of h (gh) and of the new state c
// coming from later steps (gc). Writes the input gradients and returns the gradient
// flowing into c_prev. The per-column parameter gradients are added to the accumulators.
template <typename F>
struct StepGrad {
  F u0, u1, u2, x;
};

template <typename F>
SRU_HD F backward_step(F u0, F u1, F u2, F x, F v, F vr, F bf, F br, F c_prev, F c, F gh,
                       F gc, StepGrad<F>* g, F* gv, F* gvr, F* gbf, F* gbr) {
  const F f = sigmoid(u0 + v * c_prev + bf);
  const F r = sigmoid(u1 + vr * c_prev + br);
  const F gc_total = gc + gh * r;
  const F gr = gh * (c - x) * r * (F(1) - r);
  const F gf = gc_total * (c_prev - u2) * f * (F(1) - f);
  g->u0 = gf;
  g->u1 = gr;
  g->u2 = gc_total * (F(1) - f);
  g->x = gh * (F(1) - r);
  *gv += gf * c_prev;
  *gvr += gr * c_prev;
  *gbf += gf;
  *gbr += gr;
  return gc_total * f + gf * v + gr * vr;
}

}  // namespace sru
