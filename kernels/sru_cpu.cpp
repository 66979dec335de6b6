// CPU implementation of the SRU elementwise recurrence (a torch C++ extension, JIT-built by
// torch.utils.cpp_extension). Same layouts and per-step arithmetic (sru_step.h) as the CUDA
// kernels. Work is split into tasks of up to kBlock adjacent columns of one (batch, direction);
// each task walks through time with its states in a small local array, so the inner loop over
// columns reads contiguous memory and vectorises. Tasks run on torch's intra-op thread pool.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <sys/mman.h>

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
// kPrefetch ahead are requested explicitly so that memory latency overlaps the arithmetic.
constexpr int64_t kPrefetch = 4;

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
  for (int64_t j = 0; j < n; ++j) {
    dst[3 * j] = a[j];
    dst[3 * j + 1] = b[j];
    dst[3 * j + 2] = c[j];
  }
}

inline void store_interleaved3(double* dst, const double* a, const double* b, const double* c, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    dst[3 * j] = a[j];
    dst[3 * j + 1] = b[j];
    dst[3 * j + 2] = c[j];
  }
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
  for (int64_t q = 0; q < n * (int64_t)sizeof(F); q += 64) __builtin_prefetch(c + q, 0, 0);
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
      const F* v = wc + tk.col0;
      const F* vr = wc + D + tk.col0;
      const F* bf = bias + tk.col0;
      const F* br = bias + D + tk.col0;
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
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) {
          F hv;
          c[j] = sru::forward_step<F>(up[3 * j], up[3 * j + 1], up[3 * j + 2], xp[j], v[j], vr[j],
                                      bf[j], br[j], c[j], &hv);
          hb[j] = hv;
        }
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
    F gc[kBlock], c_init[kBlock], gv[kBlock], gvr[kBlock], gbf[kBlock], gbr[kBlock];
    alignas(64) F gu0[kBlock], gu1[kBlock], gu2[kBlock];
    alignas(64) F gxb[kBlock];
    for (int64_t k = begin; k < end; ++k) {
      const Task& tk = tasks[k];
      const int64_t n = tk.n;
      const F* v = wc + tk.col0;
      const F* vr = wc + D + tk.col0;
      const F* bf = bias + tk.col0;
      const F* br = bias + D + tk.col0;
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
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) {
          sru::StepGrad<F> g;
          gc[j] = sru::backward_step<F>(up[3 * j], up[3 * j + 1], up[3 * j + 2], xp[j], v[j], vr[j],
                                        bf[j], br[j], cprev[j], cp[j], ghp[j], gc[j], &g, &gv[j],
                                        &gvr[j], &gbf[j], &gbr[j]);
          gu0[j] = g.u0;
          gu1[j] = g.u1;
          gu2[j] = g.u2;
          gxb[j] = g.x;
        }
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
// - always: outputs are advised as transparent huge pages, so that filling them costs a few hundred
//   faults instead of tens of thousands (what torch's THP_MEM_ALLOC_ENABLE does for every allocation);
// - opt-in ($SRUPP_CPU_POOL_MB, default 0 = off): a pool that keeps freed output buffers (up to that many
//   MiB) and hands them to the next call, like the CUDA caching allocator. Training allocates the same few
//   sizes at every step, so this removes the faults altogether (forward+backward about 25% faster on the
//   benchmark). It is off by default because a resume-exactness test (kill -9 at random moments) failed 3
//   times in about 30 runs with it on and never in about 20 without, for a reason not yet found.
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

  BufferPool() {
    const char* env = std::getenv("SRUPP_CPU_POOL_MB");
    limit_ = (env && *env) ? size_t(std::strtoull(env, nullptr, 10)) << 20 : 0;
  }

  std::mutex mu_;
  std::multimap<size_t, void*> free_;  // capacity -> buffer
  size_t pooled_ = 0;
  size_t limit_;
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

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "SRU recurrence forward (CPU)");
  m.def("backward", &backward, "SRU recurrence backward (CPU)");
  m.def("pool_stats", &pool_stats, "(limit, pooled bytes, pooled buffers, reuses, fresh allocations)");
  m.def("set_pool_limit", &set_pool_limit, "limit of the output pool in bytes (0: off)");
}
