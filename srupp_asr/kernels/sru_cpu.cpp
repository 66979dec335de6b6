// CPU implementation of the SRU elementwise recurrence (a torch C++ extension, JIT-built by
// torch.utils.cpp_extension). Same layouts and per-step arithmetic (sru_step.h) as the CUDA
// kernels, except for float on AVX-512, where a hand-written form of the same equations runs (see
// forward_columns). Work is split into tasks of up to kBlock adjacent columns of one (batch, direction);
// each task walks through time with its states in a small local array, so the inner loop over
// columns reads contiguous memory and vectorises. Tasks run on torch's intra-op thread pool.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "sru_step.h"

namespace {

constexpr int64_t kBlock = 64;

// Each step of a task reads a few cache lines from a new 4 KiB page (the next time step is
// B * D columns away), where the hardware prefetchers do not follow; the loads of the step
// kPrefetch ahead are requested explicitly so that memory latency overlaps the arithmetic. They are
// requested into L2 (prefetcht1), which can track more misses in flight than L1: with 8 steps ahead
// that took 19 instead of 24 ms for the benchmark's forward + backward (prefetchnta, 4 steps ahead).
constexpr int64_t kPrefetch = 8;

// The large outputs are written with non-temporal (streaming) stores where the vector ISA and the
// alignment allow, from a small local buffer: the output's cache lines are then not read from
// memory before being overwritten, which saves a third of the traffic of writing them.
inline void store_stream(float* dst, const float* src, int64_t n) {
#if defined(__AVX512F__)
  if ((reinterpret_cast<uintptr_t>(dst) & 63) == 0 && n % 16 == 0) {
    for (int64_t j = 0; j < n; j += 16) _mm512_stream_ps(dst + j, _mm512_loadu_ps(src + j));
    return;
  }
#elif defined(__AVX__)
  if ((reinterpret_cast<uintptr_t>(dst) & 31) == 0 && n % 8 == 0) {
    for (int64_t j = 0; j < n; j += 8) _mm256_stream_ps(dst + j, _mm256_loadu_ps(src + j));
    return;
  }
#endif
  std::memcpy(dst, src, n * sizeof(float));
}

inline void store_stream(double* dst, const double* src, int64_t n) {
  std::memcpy(dst, src, n * sizeof(double));
}

// grad_u is laid out (..., 3) like u: the three gate gradients of a column are adjacent. The backward pass
// computes them as three vectors; written element by element, that is 48 scalar stores per 16 columns (most of
// the backward's time). This interleaves them with two shuffles per output vector and streams the result.
template <typename F>
inline void store_interleaved3(F* dst, const F* a, const F* b, const F* c, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    dst[3 * j] = a[j];
    dst[3 * j + 1] = b[j];
    dst[3 * j + 2] = c[j];
  }
}

// float: the vector form where the ISA and alignment allow, else the loop above.
inline void store_interleaved3(float* dst, const float* a, const float* b, const float* c, int64_t n) {
#if defined(__AVX512F__)
  if ((reinterpret_cast<uintptr_t>(dst) & 63) == 0 && n % 16 == 0) {
    // Output vector k holds the elements 16k..16k+15 of (a0 b0 c0 a1 b1 c1 ...): element q comes from
    // source q % 3 at index q / 3. idx_ab picks it from a (0-15) or b (16-31); the c elements are then
    // put in by a masked permute.
    alignas(64) static const int32_t idx_ab[3][16] = {
        {0, 16, 0, 1, 17, 0, 2, 18, 0, 3, 19, 0, 4, 20, 0, 5},
        {21, 0, 6, 22, 0, 7, 23, 0, 8, 24, 0, 9, 25, 0, 10, 26},
        {0, 11, 27, 0, 12, 28, 0, 13, 29, 0, 14, 30, 0, 15, 31, 0}};
    alignas(64) static const int32_t idx_c[3][16] = {
        {0, 0, 0, 0, 0, 1, 0, 0, 2, 0, 0, 3, 0, 0, 4, 0},
        {0, 5, 0, 0, 6, 0, 0, 7, 0, 0, 8, 0, 0, 9, 0, 0},
        {10, 0, 0, 11, 0, 0, 12, 0, 0, 13, 0, 0, 14, 0, 0, 15}};
    const __mmask16 mask_c[3] = {0x4924, 0x2492, 0x9249};
    __m512i iab[3], ic[3];
    for (int k = 0; k < 3; ++k) {
      iab[k] = _mm512_load_si512(idx_ab[k]);
      ic[k] = _mm512_load_si512(idx_c[k]);
    }
    for (int64_t j = 0; j < n; j += 16) {
      const __m512 va = _mm512_load_ps(a + j), vb = _mm512_load_ps(b + j), vc = _mm512_load_ps(c + j);
      for (int k = 0; k < 3; ++k) {
        const __m512 ab = _mm512_permutex2var_ps(va, iab[k], vb);
        _mm512_stream_ps(dst + 3 * j + 16 * k, _mm512_mask_permutexvar_ps(ab, mask_c[k], ic[k], vc));
      }
    }
    return;
  }
#endif
  store_interleaved3<float>(dst, a, b, c, n);
}

// Streaming stores are weakly ordered: a fence makes them visible before the task returns.
inline void store_fence() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_sfence();
#endif
}

template <typename F>
inline void prefetch(const F* p, int64_t n) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t q = 0; q < n * (int64_t)sizeof(F); q += 64) __builtin_prefetch(c + q, 0, 2);  // prefetcht1
}

struct Task {
  int64_t b, col0, n;
  bool reverse;
};

std::vector<Task> make_tasks(int64_t B, int64_t D, bool bidirectional) {
  std::vector<Task> tasks;
  const int64_t dirs = bidirectional ? 2 : 1;
  const int64_t d = D / dirs;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t dir = 0; dir < dirs; ++dir)
      for (int64_t j = 0; j < d; j += kBlock)
        tasks.push_back({b, dir * d + j, std::min(kBlock, d - j), dir == 1});
  return tasks;
}

// The per-step arithmetic over a task's columns. The generic form runs sru_step.h's scalar step in a loop the
// compiler vectorises; for float on AVX-512 a hand-written form (below) takes over where the columns come in
// whole vectors, on the same equations with fewer instructions.

// Whether the float AVX-512 form is used (it is when compiled in; tests switch it off to check the generic form
// on the same machine).
std::atomic<bool> g_vector_form{true};

#if defined(__AVX512F__)
namespace avx512 {

constexpr float kLog2e = 1.44269504088896341f;

// 2^y for y in [-126, 126]: 2^r (r = y - round(y)) from the same degree-5 polynomial as sru_step.h's exp_, scaled
// by 2^round(y) with vscalefps.
inline __m512 exp2(__m512 y) {
  const __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_sub_ps(y, n);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.3220827e-3f), r, _mm512_set1_ps(9.6716993e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.5508856e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.4022238e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.9314688e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// sigmoid(a) given y = -log2(e) * a: 1 / (1 + 2^y), the reciprocal from vrcp14ps and one Newton step (relative
// error about 2^-28). y is clamped as sru_step.h clamps a (to +-80 / log2 e there; +-126 here, where 2^y stays a
// normal float): sigmoid is 0 or 1 to working precision beyond.
inline __m512 sigmoid_log2(__m512 y) {
  y = _mm512_max_ps(_mm512_min_ps(y, _mm512_set1_ps(126.0f)), _mm512_set1_ps(-126.0f));
  const __m512 d = _mm512_add_ps(exp2(y), _mm512_set1_ps(1.0f));
  const __m512 r0 = _mm512_rcp14_ps(d);
  return _mm512_mul_ps(r0, _mm512_fnmadd_ps(d, r0, _mm512_set1_ps(2.0f)));
}

// u's three gates of 16 columns (48 adjacent floats, gate-minor) as three vectors: gate g of column i is
// element 3i + g; elements 0-31 are picked from the first two loads, the rest from the third.
inline void load_gates(const float* up, __m512* u0, __m512* u1, __m512* u2) {
  alignas(64) static const int32_t idx_ab[3][16] = {{0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 0, 0, 0, 0, 0},
                                                    {1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31, 0, 0, 0, 0, 0},
                                                    {2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 0, 0, 0, 0, 0, 0}};
  alignas(64) static const int32_t idx_c[3][16] = {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 4, 7, 10, 13},
                                                   {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 5, 8, 11, 14},
                                                   {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 6, 9, 12, 15}};
  const __m512 a = _mm512_loadu_ps(up), b = _mm512_loadu_ps(up + 16), c = _mm512_loadu_ps(up + 32);
  __m512* out[3] = {u0, u1, u2};
  const __mmask16 mask_c[3] = {0xf800, 0xf800, 0xfc00};
  for (int g = 0; g < 3; ++g) {
    const __m512 ab = _mm512_permutex2var_ps(a, _mm512_load_si512(idx_ab[g]), b);
    *out[g] = _mm512_mask_permutexvar_ps(ab, mask_c[g], _mm512_load_si512(idx_c[g]), c);
  }
}

}  // namespace avx512
#endif

// A task's per-column parameters: v, v', b, b' and, for the vector form, the same times -log2(e), so that the
// gates' exponents come from two fused multiply-adds: y = -log2(e) * (u + v c + b) = u * (-log2 e) + (v~ c + b~).
template <typename F>
struct Columns {
  const F *v, *vr, *bf, *br;
  alignas(64) F sv[kBlock], svr[kBlock], sbf[kBlock], sbr[kBlock];

  Columns(const F* wc, const F* bias, int64_t D, int64_t col0, int64_t n)
      : v(wc + col0), vr(wc + D + col0), bf(bias + col0), br(bias + D + col0) {
    const F k = -F(1.44269504088896340736);
    for (int64_t j = 0; j < n; ++j) {
      sv[j] = k * v[j];
      svr[j] = k * vr[j];
      sbf[j] = k * bf[j];
      sbr[j] = k * br[j];
    }
  }
};

// One forward step over n columns: the state c (updated in place) and h (written to hb) from the gates u
// (gate-minor) and the highway input x; sru_step.h's scalar step in a loop the compiler vectorises.
template <typename F>
inline void forward_columns_generic(const F* up, const F* xp, const Columns<F>& p, F* c, F* hb, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    F hv;
    c[j] = sru::forward_step<F>(up[3 * j], up[3 * j + 1], up[3 * j + 2], xp[j], p.v[j], p.vr[j], p.bf[j], p.br[j],
                                c[j], &hv);
    hb[j] = hv;
  }
}

// One backward step over n columns (see sru::backward_step): updates the incoming state gradient gc and the
// parameter gradients' accumulators; writes the gates' gradients (one array per gate) and x's.
template <typename F>
struct StepOut {
  F *gc, *gv, *gvr, *gbf, *gbr, *gu0, *gu1, *gu2, *gx;
};

template <typename F>
inline void backward_columns_generic(const F* up, const F* xp, const F* cprev, const F* cp, const F* ghp,
                                     const Columns<F>& p, const StepOut<F>& o, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    sru::StepGrad<F> g;
    o.gc[j] = sru::backward_step<F>(up[3 * j], up[3 * j + 1], up[3 * j + 2], xp[j], p.v[j], p.vr[j], p.bf[j],
                                    p.br[j], cprev[j], cp[j], ghp[j], o.gc[j], &g, &o.gv[j], &o.gvr[j],
                                    &o.gbf[j], &o.gbr[j]);
    o.gu0[j] = g.u0;
    o.gu1[j] = g.u1;
    o.gu2[j] = g.u2;
    o.gx[j] = g.x;
  }
}

template <typename F>
inline void forward_columns(const F* up, const F* xp, const Columns<F>& p, F* c, F* hb, int64_t n) {
  forward_columns_generic(up, xp, p, c, hb, n);
}

template <typename F>
inline void backward_columns(const F* up, const F* xp, const F* cprev, const F* cp, const F* ghp,
                             const Columns<F>& p, const StepOut<F>& o, int64_t n) {
  backward_columns_generic(up, xp, cprev, cp, ghp, p, o, n);
}

#if defined(__AVX512F__)
// The float steps on AVX-512: the equations of sru_step.h with the exponent in base 2 from two FMAs, vscalefps for
// 2^n, vrcp14ps + one Newton step for 1 / (1 + e), and u's gates de-interleaved by shuffles (42 vector operations
// per 16 columns of the forward instead of the 54 compiled from the scalar step). A step's dependency chain (from
// c_prev through both exponentials to c) is about 60 cycles long, so NV vectors (16 NV columns, 4 for a whole
// block) are done at once, each operation written for all of them together, and the compiler interleaves their
// NV independent chains. The tests check both forms against float64. Scaling v and b by -log2(e) beforehand rounds
// each term of u + v c + b on its own, so where large terms cancel the result is less exact than the generic
// form's (u ~ 50 times the usual scale: relative error 4.7e-6 against 9.4e-7; at the usual scale both ~3e-7).
// The gates of NV vectors (columns j .. j + 16 NV) given the previous states: u's candidate part u2, and f, r.
template <int NV>
inline void gates(const float* up, const Columns<float>& p, int64_t j, const __m512* c_prev, __m512* u2, __m512* f,
                  __m512* r) {
  const __m512 k = _mm512_set1_ps(-avx512::kLog2e);
  for (int v = 0; v < NV; ++v) {
    const int64_t q = j + 16 * v;
    __m512 u0, u1;
    avx512::load_gates(up + 3 * q, &u0, &u1, &u2[v]);
    f[v] = _mm512_fmadd_ps(_mm512_load_ps(p.sv + q), c_prev[v], _mm512_fmadd_ps(u0, k, _mm512_load_ps(p.sbf + q)));
    r[v] = _mm512_fmadd_ps(_mm512_load_ps(p.svr + q), c_prev[v], _mm512_fmadd_ps(u1, k, _mm512_load_ps(p.sbr + q)));
  }
  for (int v = 0; v < NV; ++v) f[v] = avx512::sigmoid_log2(f[v]);
  for (int v = 0; v < NV; ++v) r[v] = avx512::sigmoid_log2(r[v]);
}

template <int NV>
inline void forward_vectors(const float* up, const float* xp, const Columns<float>& p, int64_t j, float* c,
                            float* hb) {
  __m512 c_prev[NV], u2[NV], f[NV], r[NV];
  for (int v = 0; v < NV; ++v) c_prev[v] = _mm512_load_ps(c + j + 16 * v);
  gates<NV>(up, p, j, c_prev, u2, f, r);
  for (int v = 0; v < NV; ++v) {
    const int64_t q = j + 16 * v;
    const __m512 c_new = _mm512_fmadd_ps(f[v], _mm512_sub_ps(c_prev[v], u2[v]), u2[v]);  // f c + (1 - f) u2
    const __m512 xv = _mm512_loadu_ps(xp + q);
    _mm512_store_ps(hb + q, _mm512_fmadd_ps(r[v], _mm512_sub_ps(c_new, xv), xv));  // r c + (1 - r) x
    _mm512_store_ps(c + q, c_new);
  }
}

template <>
inline void forward_columns<float>(const float* up, const float* xp, const Columns<float>& p, float* c, float* hb,
                                   int64_t n) {
  if (n % 16 != 0 || !g_vector_form.load(std::memory_order_relaxed))
    return forward_columns_generic(up, xp, p, c, hb, n);
  int64_t j = 0;
  for (; j + 64 <= n; j += 64) forward_vectors<4>(up, xp, p, j, c, hb);
  for (; j < n; j += 16) forward_vectors<1>(up, xp, p, j, c, hb);
}

template <int NV>
inline void backward_vectors(const float* up, const float* xp, const float* cprev, const float* cp, const float* ghp,
                             const Columns<float>& p, int64_t j, const StepOut<float>& o) {
  const __m512 one = _mm512_set1_ps(1.0f);
  __m512 c_prev[NV], u2[NV], f[NV], r[NV];
  for (int v = 0; v < NV; ++v) c_prev[v] = _mm512_loadu_ps(cprev + j + 16 * v);
  gates<NV>(up, p, j, c_prev, u2, f, r);
  for (int v = 0; v < NV; ++v) {
    const int64_t q = j + 16 * v;
    const __m512 gh = _mm512_loadu_ps(ghp + q);
    const __m512 gc_total = _mm512_fmadd_ps(gh, r[v], _mm512_load_ps(o.gc + q));
    const __m512 one_r = _mm512_sub_ps(one, r[v]), one_f = _mm512_sub_ps(one, f[v]);
    const __m512 gr = _mm512_mul_ps(_mm512_mul_ps(gh, _mm512_sub_ps(_mm512_loadu_ps(cp + q), _mm512_loadu_ps(xp + q))),
                                    _mm512_mul_ps(r[v], one_r));
    const __m512 gf =
        _mm512_mul_ps(_mm512_mul_ps(gc_total, _mm512_sub_ps(c_prev[v], u2[v])), _mm512_mul_ps(f[v], one_f));
    _mm512_store_ps(o.gu0 + q, gf);
    _mm512_store_ps(o.gu1 + q, gr);
    _mm512_store_ps(o.gu2 + q, _mm512_mul_ps(gc_total, one_f));
    _mm512_store_ps(o.gx + q, _mm512_mul_ps(gh, one_r));
    _mm512_store_ps(o.gv + q, _mm512_fmadd_ps(gf, c_prev[v], _mm512_load_ps(o.gv + q)));
    _mm512_store_ps(o.gvr + q, _mm512_fmadd_ps(gr, c_prev[v], _mm512_load_ps(o.gvr + q)));
    _mm512_store_ps(o.gbf + q, _mm512_add_ps(_mm512_load_ps(o.gbf + q), gf));
    _mm512_store_ps(o.gbr + q, _mm512_add_ps(_mm512_load_ps(o.gbr + q), gr));
    const __m512 gc_new = _mm512_fmadd_ps(gf, _mm512_loadu_ps(p.v + q), _mm512_mul_ps(gc_total, f[v]));
    _mm512_store_ps(o.gc + q, _mm512_fmadd_ps(gr, _mm512_loadu_ps(p.vr + q), gc_new));  // into c_prev
  }
}

template <>
inline void backward_columns<float>(const float* up, const float* xp, const float* cprev, const float* cp,
                                    const float* ghp, const Columns<float>& p, const StepOut<float>& o, int64_t n) {
  if (n % 16 != 0 || !g_vector_form.load(std::memory_order_relaxed))
    return backward_columns_generic(up, xp, cprev, cp, ghp, p, o, n);
  int64_t j = 0;
  for (; j + 64 <= n; j += 64) backward_vectors<4>(up, xp, cprev, cp, ghp, p, j, o);
  for (; j < n; j += 16) backward_vectors<1>(up, xp, cprev, cp, ghp, p, j, o);
}
#endif

template <typename F>
void forward_impl(const F* u, const F* x, const F* wc, const F* bias, const F* c0,
                  const uint8_t* mask, F* h, F* c_all, F* c_last, int64_t L, int64_t B, int64_t D,
                  bool bidirectional) {
  const auto tasks = make_tasks(B, D, bidirectional);
  at::parallel_for(0, (int64_t)tasks.size(), 1, [&](int64_t begin, int64_t end) {
    alignas(64) F c[kBlock];
    alignas(64) F hb[kBlock];
    for (int64_t k = begin; k < end; ++k) {
      const Task& tk = tasks[k];
      const int64_t n = tk.n;
      const Columns<F> p(wc, bias, D, tk.col0, n);
      for (int64_t j = 0; j < n; ++j) c[j] = c0 ? c0[tk.b * D + tk.col0 + j] : F(0);
      for (int64_t s = 0; s < L; ++s) {
        const int64_t t = tk.reverse ? L - 1 - s : s;
        const int64_t off = (t * B + tk.b) * D + tk.col0;
        F* hp = h + off;
        F* cp = c_all ? c_all + off : nullptr;
        if (mask && !mask[t * B + tk.b]) {
          for (int64_t j = 0; j < n; ++j) hp[j] = F(0);
          if (cp)
            for (int64_t j = 0; j < n; ++j) cp[j] = c[j];
          continue;
        }
        const F* up = u + off * 3;
        const F* xp = x + off;
        if (s + kPrefetch < L) {
          const int64_t ahead = ((tk.reverse ? t - kPrefetch : t + kPrefetch) * B + tk.b) * D + tk.col0;
          prefetch(u + ahead * 3, 3 * n);
          prefetch(x + ahead, n);
        }
        forward_columns(up, xp, p, c, hb, n);
        store_stream(hp, hb, n);
        if (cp) store_stream(cp, c, n);
      }
      for (int64_t j = 0; j < n; ++j) c_last[tk.b * D + tk.col0 + j] = c[j];
    }
    store_fence();
  });
}

template <typename F>
void backward_impl(const F* u, const F* x, const F* wc, const F* bias, const F* c0,
                   const uint8_t* mask, const F* c_all, const F* grad_h, const F* grad_c_last,
                   F* grad_u, F* grad_x, F* grad_c0, F* wpart, int64_t L, int64_t B, int64_t D,
                   bool bidirectional) {
  const auto tasks = make_tasks(B, D, bidirectional);
  at::parallel_for(0, (int64_t)tasks.size(), 1, [&](int64_t begin, int64_t end) {
    alignas(64) F gc[kBlock], c_init[kBlock], gv[kBlock], gvr[kBlock], gbf[kBlock], gbr[kBlock];
    alignas(64) F gu0[kBlock], gu1[kBlock], gu2[kBlock], gxb[kBlock];
    const StepOut<F> o{gc, gv, gvr, gbf, gbr, gu0, gu1, gu2, gxb};
    for (int64_t k = begin; k < end; ++k) {
      const Task& tk = tasks[k];
      const int64_t n = tk.n;
      const Columns<F> p(wc, bias, D, tk.col0, n);
      for (int64_t j = 0; j < n; ++j) {
        c_init[j] = c0 ? c0[tk.b * D + tk.col0 + j] : F(0);
        gc[j] = grad_c_last ? grad_c_last[tk.b * D + tk.col0 + j] : F(0);
        gv[j] = gvr[j] = gbf[j] = gbr[j] = F(0);
      }
      for (int64_t s = L - 1; s >= 0; --s) {  // s: step index in forward order
        const int64_t t = tk.reverse ? L - 1 - s : s;
        const int64_t off = (t * B + tk.b) * D + tk.col0;
        F* gup = grad_u + off * 3;
        F* gxp = grad_x + off;
        if (mask && !mask[t * B + tk.b]) {
          for (int64_t j = 0; j < 3 * n; ++j) gup[j] = F(0);
          for (int64_t j = 0; j < n; ++j) gxp[j] = F(0);
          continue;
        }
        const int64_t t_prev = tk.reverse ? t + 1 : t - 1;
        const F* cprev = s == 0 ? c_init : c_all + (t_prev * B + tk.b) * D + tk.col0;
        const F* cp = c_all + off;
        const F* up = u + off * 3;
        const F* xp = x + off;
        const F* ghp = grad_h + off;
        if (s >= kPrefetch) {
          const int64_t ahead = ((tk.reverse ? t + kPrefetch : t - kPrefetch) * B + tk.b) * D + tk.col0;
          prefetch(u + ahead * 3, 3 * n);
          prefetch(x + ahead, n);
          prefetch(grad_h + ahead, n);
          prefetch(c_all + ahead, n);
        }
        backward_columns(up, xp, cprev, cp, ghp, p, o, n);
        store_interleaved3(gup, gu0, gu1, gu2, n);
        store_stream(gxp, gxb, n);
      }
      F* wp = wpart + tk.b * 4 * D + tk.col0;
      for (int64_t j = 0; j < n; ++j) {
        grad_c0[tk.b * D + tk.col0 + j] = gc[j];
        wp[j] = gv[j];
        wp[D + j] = gvr[j];
        wp[2 * D + j] = gbf[j];
        wp[3 * D + j] = gbr[j];
      }
    }
    store_fence();
  });
}

// Large outputs: fresh memory from the kernel costs a page fault and the zeroing of every page on first
// touch, about 9 ms for 32 MB on a small VM, as much as the recurrence's own arithmetic. Two remedies:
// - a pool (on by default, up to 1024 MiB; $SRUPP_CPU_POOL_MB, read by kernels/__init__.py) that keeps freed
//   output buffers and hands them to the next call, like the CUDA caching allocator. Training allocates the
//   same few sizes at every step, so this removes the faults altogether (the benchmark's forward + backward
//   takes 17 instead of 25 ms);
// - outputs that do not come from the pool (pool off, or full) are advised as transparent huge pages, so that
//   filling them costs a few hundred faults instead of tens of thousands (what torch's THP_MEM_ALLOC_ENABLE
//   does for every allocation).
torch::Tensor empty_huge(at::IntArrayRef sizes, const at::TensorOptions& options) {
  auto t = torch::empty(sizes, options);
#ifdef MADV_HUGEPAGE
  constexpr uintptr_t kHuge = 2u << 20;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t end = begin + t.nbytes();
  const uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1);
  if (end > first + kHuge) madvise(reinterpret_cast<void*>(first), (end - first) & ~(kHuge - 1), MADV_HUGEPAGE);
#endif
  return t;
}

class BufferPool {
 public:
  static BufferPool& instance() {
    static BufferPool* pool = new BufferPool();  // never destroyed: tensors may be freed at exit
    return *pool;
  }

  // A buffer of at least `bytes` (at most twice that, so a small request does not pin a big buffer).
  void* take(size_t bytes, size_t* capacity) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.lower_bound(bytes);
      if (it != free_.end() && it->first <= 2 * bytes) {
        void* p = it->second;
        *capacity = it->first;
        pooled_ -= it->first;
        free_.erase(it);
        ++hits_;
        return p;
      }
      ++misses_;
    }
    *capacity = (bytes + kHuge - 1) / kHuge * kHuge;
    void* p = nullptr;
    if (posix_memalign(&p, kHuge, *capacity) != 0) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    madvise(p, *capacity, MADV_HUGEPAGE);  // only advice; harmless if refused
#endif
    return p;
  }

  // Called by the tensor's deleter when the last reference to a buffer goes away.
  void give(void* p, size_t capacity) {
    std::vector<void*> drop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (capacity > limit_) {
        drop.push_back(p);
      } else {
        free_.emplace(capacity, p);
        pooled_ += capacity;
        trim(p, &drop);
      }
    }
    for (void* q : drop) std::free(q);
  }

  void set_limit(size_t bytes) {
    std::vector<void*> drop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      limit_ = bytes;
      trim(nullptr, &drop);
    }
    for (void* q : drop) std::free(q);
  }

  size_t limit() {
    std::lock_guard<std::mutex> lock(mu_);
    return limit_;
  }

  std::vector<int64_t> stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return {(int64_t)limit_, (int64_t)pooled_, (int64_t)free_.size(), hits_, misses_};
  }

 private:
  static constexpr size_t kHuge = size_t(2) << 20;

  // With mu_ held: moves the largest buffers other than `keep` to `drop` until the pool is within its limit
  // (`keep`, just given back, is at most the limit itself, so another buffer is always there to drop).
  void trim(const void* keep, std::vector<void*>* drop) {
    while (pooled_ > limit_) {
      auto victim = std::prev(free_.end());
      if (victim->second == keep) victim = std::prev(victim);
      pooled_ -= victim->first;
      drop->push_back(victim->second);
      free_.erase(victim);
    }
  }

  BufferPool() = default;

  std::mutex mu_;
  std::multimap<size_t, void*> free_;  // capacity -> buffer
  size_t pooled_ = 0;
  size_t limit_ = size_t(1024) << 20;  // the default; kernels/__init__.py applies $SRUPP_CPU_POOL_MB
  int64_t hits_ = 0, misses_ = 0;
};

// Outputs of at least this many bytes come from the pool when it is on; smaller ones from torch (malloc
// reuses those).
constexpr size_t kPoolMinBytes = size_t(1) << 20;

torch::Tensor empty_output(at::IntArrayRef sizes, const at::TensorOptions& options) {
  const size_t bytes = size_t(c10::multiply_integers(sizes)) * options.dtype().itemsize();
  BufferPool& pool = BufferPool::instance();
  if (bytes < kPoolMinBytes) return torch::empty(sizes, options);
  if (pool.limit() == 0) return empty_huge(sizes, options);
  size_t capacity = 0;
  void* p = pool.take(bytes, &capacity);
  return torch::from_blob(p, sizes, [capacity](void* q) { BufferPool::instance().give(q, capacity); }, options);
}

// (limit, pooled bytes, pooled buffers, reuses, fresh allocations) of the output pool.
std::vector<int64_t> pool_stats() { return BufferPool::instance().stats(); }

// Set the pool's limit in bytes (0: no pooling; buffers above the limit are freed now).
void set_pool_limit(int64_t bytes) { BufferPool::instance().set_limit(bytes < 0 ? 0 : size_t(bytes)); }

template <typename F>
const F* ptr_or_null(const c10::optional<torch::Tensor>& t) {
  return t.has_value() ? t->data_ptr<F>() : nullptr;
}

const uint8_t* mask_ptr(const c10::optional<torch::Tensor>& m) {
  return m.has_value() ? m->data_ptr<uint8_t>() : nullptr;
}

// Returns (h, c_all, c_last). All inputs are contiguous, of one floating dtype; mask is uint8.
// c_all (every step's state, needed by the backward pass) is empty unless keep_states.
std::vector<torch::Tensor> forward(torch::Tensor u, torch::Tensor x, torch::Tensor wc,
                                   torch::Tensor bias, c10::optional<torch::Tensor> c0,
                                   c10::optional<torch::Tensor> mask, bool bidirectional,
                                   bool keep_states) {
  const int64_t L = u.size(0), B = u.size(1), D = u.size(2);
  auto h = empty_output({L, B, D}, u.options());
  auto c_all = empty_output({keep_states ? L : 0, B, D}, u.options());
  auto c_last = torch::empty({B, D}, u.options());
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "sru_forward_cpu", [&] {
    forward_impl<scalar_t>(u.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                           wc.data_ptr<scalar_t>(), bias.data_ptr<scalar_t>(),
                           ptr_or_null<scalar_t>(c0), mask_ptr(mask), h.data_ptr<scalar_t>(),
                           keep_states ? c_all.data_ptr<scalar_t>() : nullptr,
                           c_last.data_ptr<scalar_t>(), L, B, D,
                           bidirectional);
  });
  return {h, c_all, c_last};
}

// Returns (grad_u, grad_x, grad_c0, wpart) with wpart (B, 4, D) the per-batch partial gradients
// of v, v', b, b'.
std::vector<torch::Tensor> backward(torch::Tensor u, torch::Tensor x, torch::Tensor wc,
                                    torch::Tensor bias, c10::optional<torch::Tensor> c0,
                                    c10::optional<torch::Tensor> mask, torch::Tensor c_all,
                                    torch::Tensor grad_h, c10::optional<torch::Tensor> grad_c_last,
                                    bool bidirectional) {
  const int64_t L = u.size(0), B = u.size(1), D = u.size(2);
  auto grad_u = empty_output(u.sizes(), u.options());
  auto grad_x = empty_output(x.sizes(), x.options());
  auto grad_c0 = torch::empty({B, D}, u.options());
  auto wpart = torch::empty({B, 4, D}, u.options());
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "sru_backward_cpu", [&] {
    backward_impl<scalar_t>(u.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                            wc.data_ptr<scalar_t>(), bias.data_ptr<scalar_t>(),
                            ptr_or_null<scalar_t>(c0), mask_ptr(mask),
                            c_all.data_ptr<scalar_t>(), grad_h.data_ptr<scalar_t>(),
                            ptr_or_null<scalar_t>(grad_c_last), grad_u.data_ptr<scalar_t>(),
                            grad_x.data_ptr<scalar_t>(), grad_c0.data_ptr<scalar_t>(),
                            wpart.data_ptr<scalar_t>(), L, B, D, bidirectional);
  });
  return {grad_u, grad_x, grad_c0, wpart};
}

// Switches the hand-written AVX-512 float steps on or off (for tests); returns the previous setting. Without
// AVX-512 in the build the generic form runs either way.
bool set_vector_form(bool on) { return g_vector_form.exchange(on); }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "SRU recurrence forward (CPU)");
  m.def("backward", &backward, "SRU recurrence backward (CPU)");
  m.def("pool_stats", &pool_stats, "(limit, pooled bytes, pooled buffers, reuses, fresh allocations)");
  m.def("set_vector_form", &set_vector_form, "use the hand-written AVX-512 float steps (returns the previous)");
  m.def("set_pool_limit", &set_pool_limit, "limit of the output pool in bytes (0: off)");
}
