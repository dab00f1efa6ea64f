// Matrix-vector products for decoding: a few rows of x times a large matrix, bound by reading the matrix once.
// Compiled at first use by transformer_xl.inference.native (torch.utils.cpp_extension, for this machine's CPU).
//
//   txl::gemv(x [N, in] f32, w [O, I, 8, 8] f32, out, bias [out]?)                 -> [N, out] f32
//   txl::gemv(x [N, in] f32, w [out, in] f32, out, bias [out]?)                     -> [N, out] f32 (rows as stored)
//   txl::gemv_t(x [N, in] f32, w [in, out] f32, bias [out]?)                        -> [N, out] f32 (x w)
//   txl::gemv_q8(x [N, in] f32, w [O, I, 4, 32] i8, scale [O * 4] f32, out, bias?) -> [N, out] f32
//
// w is tiled (transformer_xl.inference.native.tile): the rows of a block of R rows, K columns at a time, side by
// side, so that a block is one sequential stream of R x K numbers per step of its loop and the hardware prefetcher
// sees one stream per thread. Zeros pad the last block and columns beyond in.
//
// The blocks are split into one contiguous range per thread (at::parallel_for: one OpenMP region per call), so
// every core streams its share; no BLAS call (MKL's single-precision matrix-vector kernel runs on one core on AMD
// CPUs). gemv_q8 quantizes every row of x to int8 with a scale of its own (max |x| / 127) and accumulates the int8
// products in 32-bit integers: on AVX2 by vpmaddubsw (|x| as unsigned bytes times w with x's sign) and vpmaddwd, 32
// weights an instruction, the way int8 dot products are done without VNNI.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <cmath>
#include <algorithm>
#include <cstdint>
#include <vector>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define TXL_AVX2 1
#endif

namespace {

constexpr int64_t kRowsF = 8, kColsF = 8;    // float32 tiles: 8 rows x 8 columns (256 bytes)
constexpr int64_t kRowsQ = 4, kColsQ = 32;   // int8 tiles: 4 rows x 32 columns (128 bytes)
constexpr int64_t kChunkBytes = 1 << 16;     // at least this many bytes of w per thread, or fewer threads

#ifdef TXL_AVX2
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}
#endif

// acc[j] = sum_k w[b, k, j] x[k] for the 8 rows j of float block b (I tiles of 8 x 8); x padded to I * 8.
inline void block_f32(const float* x, const float* w, int64_t tiles, float* acc) {
#ifdef TXL_AVX2
  __m256 a[kRowsF];
  for (int j = 0; j < kRowsF; ++j) a[j] = _mm256_setzero_ps();
  for (int64_t t = 0; t < tiles; ++t, w += kRowsF * kColsF) {
    const __m256 xv = _mm256_loadu_ps(x + t * kColsF);
    for (int j = 0; j < kRowsF; ++j) a[j] = _mm256_fmadd_ps(_mm256_loadu_ps(w + j * kColsF), xv, a[j]);
  }
  for (int j = 0; j < kRowsF; ++j) acc[j] = hsum(a[j]);
#else
  for (int j = 0; j < kRowsF; ++j) acc[j] = 0.f;
  for (int64_t t = 0; t < tiles; ++t, w += kRowsF * kColsF)
    for (int j = 0; j < kRowsF; ++j)
      for (int c = 0; c < kColsF; ++c) acc[j] += w[j * kColsF + c] * x[t * kColsF + c];
#endif
}

// acc[j] = sum_k w[b, k, j] xq[k] for the 4 rows j of int8 block b; xa = |xq| as unsigned bytes.
inline void block_q8(const int8_t* xq, const uint8_t* xa, const int8_t* w, int64_t tiles, int32_t* acc) {
#ifdef TXL_AVX2
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i a[kRowsQ];
  for (int j = 0; j < kRowsQ; ++j) a[j] = _mm256_setzero_si256();
  for (int64_t t = 0; t < tiles; ++t, w += kRowsQ * kColsQ) {
    const __m256i xs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + t * kColsQ));
    const __m256i xu = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa + t * kColsQ));
    for (int j = 0; j < kRowsQ; ++j) {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + j * kColsQ));
      a[j] = _mm256_add_epi32(a[j], _mm256_madd_epi16(_mm256_maddubs_epi16(xu, _mm256_sign_epi8(wv, xs)), ones));
    }
  }
  for (int j = 0; j < kRowsQ; ++j) acc[j] = hsum_i32(a[j]);
#else
  (void)xa;
  for (int j = 0; j < kRowsQ; ++j) acc[j] = 0;
  for (int64_t t = 0; t < tiles; ++t, w += kRowsQ * kColsQ)
    for (int j = 0; j < kRowsQ; ++j)
      for (int c = 0; c < kColsQ; ++c) acc[j] += int32_t(w[j * kColsQ + c]) * int32_t(xq[t * kColsQ + c]);
#endif
}

void check_bias(const c10::optional<at::Tensor>& bias, int64_t out, const char* op) {
  if (bias) TORCH_CHECK(bias->dim() == 1 && bias->size(0) == out && bias->scalar_type() == at::kFloat,
                        "txl ", op, ": bias must be float32 [out]");
}

void check(const at::Tensor& x, const at::Tensor& w, int64_t out, const c10::optional<at::Tensor>& bias,
           at::ScalarType wt, int64_t rows, int64_t cols) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "txl gemv: CPU tensors only");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "txl gemv: x must be float32 [N, in]");
  TORCH_CHECK(w.dim() == 4 && w.scalar_type() == wt && w.is_contiguous() && w.size(2) == rows && w.size(3) == cols,
              "txl gemv: w must be contiguous tiles [O, I, ", rows, ", ", cols, "] of ", wt);
  TORCH_CHECK(out > (w.size(0) - 1) * rows && out <= w.size(0) * rows, "txl gemv: out does not match w's blocks");
  TORCH_CHECK(x.size(1) <= w.size(1) * cols, "txl gemv: x has more columns than w");
  check_bias(bias, out, "gemv");
}

// Blocks [0, blocks) split into one contiguous range per thread, each of kChunkBytes at least.
template <class F>
void over_blocks(int64_t blocks, int64_t block_bytes, const F& f) {
  const int64_t grain = std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(1, block_bytes));
  at::parallel_for(0, blocks, grain, f);
}

// y[i, r] = w[r] . x[i] for rows [r0, r1) of a row-major w [*, in]: 4 rows read together, one stream each.
void rows_f32(const float* x, const float* w, int64_t in, int64_t r0, int64_t r1, float* y) {
  int64_t r = r0;
#ifdef TXL_AVX2
  for (; r + 4 <= r1; r += 4) {
    const float* w0 = w + r * in;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t k = 0;
    for (; k + 8 <= in; k += 8) {
      const __m256 xv = _mm256_loadu_ps(x + k);
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), xv, a0);
      a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + in + k), xv, a1);
      a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + 2 * in + k), xv, a2);
      a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + 3 * in + k), xv, a3);
    }
    float s[4] = {hsum(a0), hsum(a1), hsum(a2), hsum(a3)};
    for (; k < in; ++k)
      for (int j = 0; j < 4; ++j) s[j] += w0[j * in + k] * x[k];
    for (int j = 0; j < 4; ++j) y[r + j] = s[j];
  }
#endif
  for (; r < r1; ++r) {
    float s = 0.f;
    for (int64_t k = 0; k < in; ++k) s += w[r * in + k] * x[k];
    y[r] = s;
  }
}

at::Tensor gemv_rows(const at::Tensor& x_, const at::Tensor& w, int64_t out, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x_.device().is_cpu() && w.device().is_cpu(), "txl gemv: CPU tensors only");
  TORCH_CHECK(x_.dim() == 2 && x_.scalar_type() == at::kFloat, "txl gemv: x must be float32 [N, in]");
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.is_contiguous() && w.size(0) == out && w.size(1) == x_.size(1),
              "txl gemv: w must be contiguous float32 [out, in] matching x [N, in]");
  check_bias(bias, out, "gemv");
  const at::Tensor x = x_.contiguous();
  const int64_t n = x.size(0), in = x.size(1);
  at::Tensor y = at::empty({n, out}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  over_blocks((out + 3) / 4, 4 * in * 4, [&](int64_t b0, int64_t b1) {
    const int64_t r1 = std::min(out, b1 * 4);
    for (int64_t i = 0; i < n; ++i) rows_f32(xp + i * in, wp, in, b0 * 4, r1, yp + i * out);
  });
  return bias ? y.add_(*bias) : y;
}

at::Tensor gemv(const at::Tensor& x_, const at::Tensor& w, int64_t out, const c10::optional<at::Tensor>& bias) {
  if (w.dim() == 2) return gemv_rows(x_, w, out, bias);
  check(x_, w, out, bias, at::kFloat, kRowsF, kColsF);
  const int64_t n = x_.size(0), in = x_.size(1), tiles = w.size(1), width = tiles * kColsF;
  std::vector<float> xp(n * width, 0.f);  // x padded to whole tiles
  const at::Tensor x = x_.contiguous();
  for (int64_t i = 0; i < n; ++i) std::copy_n(x.data_ptr<float>() + i * in, in, xp.data() + i * width);
  at::Tensor y = at::empty({n, out}, x.options());
  const float* wp = w.data_ptr<float>();
  const float* bp = bias ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  over_blocks(w.size(0), tiles * kRowsF * kColsF * 4, [&](int64_t b0, int64_t b1) {
    float acc[kRowsF];
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t i = 0; i < n; ++i) {
        block_f32(xp.data() + i * width, wp + b * tiles * kRowsF * kColsF, tiles, acc);
        for (int64_t j = 0; j < kRowsF && b * kRowsF + j < out; ++j)
          yp[i * out + b * kRowsF + j] = acc[j] + (bp ? bp[b * kRowsF + j] : 0.f);
      }
  });
  return y;
}

at::Tensor gemv_q8(const at::Tensor& x_, const at::Tensor& w, const at::Tensor& scale, int64_t out,
                   const c10::optional<at::Tensor>& bias) {
  check(x_, w, out, bias, at::kChar, kRowsQ, kColsQ);
  TORCH_CHECK(scale.dim() == 1 && scale.size(0) >= out && scale.scalar_type() == at::kFloat && scale.is_contiguous(),
              "txl gemv_q8: scale must be contiguous float32 [out] or longer");
  const int64_t n = x_.size(0), in = x_.size(1), tiles = w.size(1), width = tiles * kColsQ;
  const at::Tensor x = x_.contiguous();
  // every row of x to int8 with its own scale; |x| kept as unsigned bytes for vpmaddubsw
  std::vector<int8_t> xq(n * width, 0);
  std::vector<uint8_t> xa(n * width, 0);
  std::vector<float> xs(n, 0.f);
  const float* xp = x.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    float m = 0.f;
    for (int64_t k = 0; k < in; ++k) m = std::fmax(m, std::fabs(xp[i * in + k]));
    xs[i] = m / 127.f;
    const float inv = m > 0.f ? 127.f / m : 0.f;
    for (int64_t k = 0; k < in; ++k) {
      const int v = static_cast<int>(std::nearbyint(xp[i * in + k] * inv));
      xq[i * width + k] = static_cast<int8_t>(v);
      xa[i * width + k] = static_cast<uint8_t>(v < 0 ? -v : v);
    }
  }
  at::Tensor y = at::empty({n, out}, x.options());
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* sp = scale.data_ptr<float>();
  const float* bp = bias ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  over_blocks(w.size(0), tiles * kRowsQ * kColsQ, [&](int64_t b0, int64_t b1) {
    int32_t acc[kRowsQ];
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t i = 0; i < n; ++i) {
        block_q8(xq.data() + i * width, xa.data() + i * width, wp + b * tiles * kRowsQ * kColsQ, tiles, acc);
        for (int64_t j = 0; j < kRowsQ && b * kRowsQ + j < out; ++j) {
          const int64_t r = b * kRowsQ + j;
          yp[i * out + r] = float(acc[j]) * sp[r] * xs[i] + (bp ? bp[r] : 0.f);
        }
      }
  });
  return y;
}

// y[i, :] = x[i] W for W [in, out] stored row-major (the transpose of a linear layer's weight: an adaptive softmax's
// projection [D, d_i]); the columns split between threads, each thread reading its columns of every row.
at::Tensor gemv_t(const at::Tensor& x_, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x_.device().is_cpu() && w.device().is_cpu(), "txl gemv_t: CPU tensors only");
  TORCH_CHECK(x_.dim() == 2 && x_.scalar_type() == at::kFloat, "txl gemv_t: x must be float32 [N, in]");
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat && w.is_contiguous() && w.size(0) == x_.size(1),
              "txl gemv_t: w must be contiguous float32 [in, out] matching x [N, in]");
  const int64_t n = x_.size(0), in = w.size(0), out = w.size(1);
  check_bias(bias, out, "gemv_t");
  const at::Tensor x = x_.contiguous();
  at::Tensor y = at::zeros({n, out}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(8, kChunkBytes / std::max<int64_t>(1, in * 4));  // columns per thread
  at::parallel_for(0, out, grain, [&](int64_t j0, int64_t j1) {
    for (int64_t i = 0; i < n; ++i) {
      float* yi = yp + i * out;
      for (int64_t r = 0; r < in; ++r) {
        const float xr = xp[i * in + r];
        const float* wr = wp + r * out;
        int64_t j = j0;
#ifdef TXL_AVX2
        const __m256 xv = _mm256_set1_ps(xr);
        for (; j + 8 <= j1; j += 8)
          _mm256_storeu_ps(yi + j, _mm256_fmadd_ps(xv, _mm256_loadu_ps(wr + j), _mm256_loadu_ps(yi + j)));
#endif
        for (; j < j1; ++j) yi[j] += xr * wr[j];
      }
    }
  });
  return bias ? y.add_(*bias) : y;
}

// ---------------------------------------------------------------------------------------------- attention
// One query per row over a ring of keys/values (transformer_xl.inference.decode): keys in slot blocks
// [B, H, C / 16, E, 16], position keys [H, C / 16, E, 16] by distance, values by dimension [B, H, E, C], float32 or
// bfloat16 (widened as read). score_c = scale (qu . k_c + qv . p_{d(c)}) + bias_c; out = softmax(score) . v. The
// (row, head) pairs are split between threads, one contiguous range each.

#ifdef TXL_AVX2
// e^x for x <= 0 (the softmax's arguments after the max is taken off): 2^n e^r, r in [-ln2/2, ln2/2], a degree-6
// polynomial (relative error about 2e-7); below -87 the result is 0.
inline __m256 exp_neg(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#endif

// dots[c] = q . keys[c] for the C slots of one head's blocks [C / 16, E, 16]: four blocks at once on AVX2 (eight
// independent sums, so that the multiply-adds' latency is hidden).
template <class T>
void dot_blocks(const float* q, const T* k, int64_t blocks, int64_t e_dim, float* dots) {
  int64_t b = 0;
  const int64_t stride = e_dim * 16;
#ifdef TXL_AVX2
  for (; b + 4 <= blocks; b += 4) {
    const T* k0 = k + b * stride;
    __m256 a[8];
    for (int j = 0; j < 8; ++j) a[j] = _mm256_setzero_ps();
    for (int64_t e = 0; e < e_dim; ++e) {
      const __m256 qe = _mm256_set1_ps(q[e]);
      for (int j = 0; j < 4; ++j) {
        a[2 * j] = _mm256_fmadd_ps(qe, load8(k0 + j * stride + e * 16), a[2 * j]);
        a[2 * j + 1] = _mm256_fmadd_ps(qe, load8(k0 + j * stride + e * 16 + 8), a[2 * j + 1]);
      }
    }
    for (int j = 0; j < 8; ++j) _mm256_storeu_ps(dots + b * 16 + j * 8, a[j]);
  }
#endif
  for (; b < blocks; ++b) {
    const T* kb = k + b * stride;
    for (int j = 0; j < 16; ++j) {
      float a = 0.f;
      for (int64_t e = 0; e < e_dim; ++e) a += q[e] * float(kb[e * 16 + j]);
      dots[b * 16 + j] = a;
    }
  }
}

template <class T>
void ring_heads(const float* qu, const float* qv, const T* ks, const T* ps, const T* vs, const int64_t* by_slot,
                const float* bias, float scale, int64_t heads, int64_t slots, int64_t e_dim, int64_t p0, int64_t p1,
                float* out) {
  std::vector<float> ac(slots), bd(slots);
  const int64_t blocks = slots / 16;
  for (int64_t p = p0; p < p1; ++p) {  // p = row * heads + head
    const int64_t head = p % heads;
    dot_blocks(qu + p * e_dim, ks + p * slots * e_dim, blocks, e_dim, ac.data());
    dot_blocks(qv + p * e_dim, ps + head * slots * e_dim, blocks, e_dim, bd.data());
    float m = -INFINITY;
    for (int64_t c = 0; c < slots; ++c) {
      ac[c] = (ac[c] + bd[by_slot[c]]) * scale + bias[c];
      m = std::max(m, ac[c]);
    }
    int64_t c = 0;
    float total = 0.f;
#ifdef TXL_AVX2
    __m256 tv = _mm256_setzero_ps();
    const __m256 mv = _mm256_set1_ps(m);
    for (; c + 8 <= slots; c += 8) {
      const __m256 ev = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(ac.data() + c), mv));
      _mm256_storeu_ps(ac.data() + c, ev);
      tv = _mm256_add_ps(tv, ev);
    }
    total = hsum(tv);
#endif
    for (; c < slots; ++c) {
      ac[c] = std::exp(ac[c] - m);
      total += ac[c];
    }
    const T* v = vs + p * e_dim * slots;
    for (int64_t e = 0; e < e_dim; ++e, v += slots) {
      float a = 0.f;
      int64_t k = 0;
#ifdef TXL_AVX2
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;  // four sums: the latency hidden
      for (; k + 32 <= slots; k += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(ac.data() + k), load8(v + k), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(ac.data() + k + 8), load8(v + k + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(ac.data() + k + 16), load8(v + k + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(ac.data() + k + 24), load8(v + k + 24), a3);
      }
      for (; k + 8 <= slots; k += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(ac.data() + k), load8(v + k), a0);
      a = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
#endif
      for (; k < slots; ++k) a += ac[k] * float(v[k]);
      out[p * e_dim + e] = a / total;
    }
  }
}

at::Tensor ring_attend(const at::Tensor& qu_, const at::Tensor& qv_, const at::Tensor& ks, const at::Tensor& ps,
                       const at::Tensor& vs, const at::Tensor& by_slot_, const at::Tensor& bias_, double scale) {
  TORCH_CHECK(ks.dim() == 5 && ks.size(4) == 16 && ks.is_contiguous(), "txl ring_attend: keys must be [B, H, C/16, E, 16]");
  const int64_t bsz = ks.size(0), heads = ks.size(1), slots = ks.size(2) * 16, e_dim = ks.size(3);
  TORCH_CHECK(ps.dim() == 4 && ps.size(0) == heads && ps.size(1) * 16 == slots && ps.size(2) == e_dim &&
              ps.is_contiguous() && ps.scalar_type() == ks.scalar_type(), "txl ring_attend: position keys must be "
              "[H, C/16, E, 16] of the keys' type");
  TORCH_CHECK(vs.dim() == 4 && vs.size(0) == bsz && vs.size(1) == heads && vs.size(2) == e_dim &&
              vs.size(3) == slots && vs.is_contiguous() && vs.scalar_type() == ks.scalar_type(),
              "txl ring_attend: values must be [B, H, E, C] of the keys' type");
  TORCH_CHECK(ks.scalar_type() == at::kFloat || ks.scalar_type() == at::kBFloat16,
              "txl ring_attend: the ring must be float32 or bfloat16");
  const at::Tensor qu = qu_.contiguous().to(at::kFloat), qv = qv_.contiguous().to(at::kFloat);
  TORCH_CHECK(qu.numel() == bsz * heads * e_dim && qv.numel() == qu.numel(), "txl ring_attend: queries must be [B, H, E]");
  const at::Tensor by_slot = by_slot_.contiguous().to(at::kLong), bias = bias_.contiguous().to(at::kFloat);
  TORCH_CHECK(by_slot.numel() == slots && bias.numel() == slots, "txl ring_attend: by_slot and bias must be [C]");
  const int64_t* bs = by_slot.data_ptr<int64_t>();
  for (int64_t c = 0; c < slots; ++c) TORCH_CHECK(bs[c] >= 0 && bs[c] < slots, "txl ring_attend: by_slot out of range");
  at::Tensor out = at::empty({bsz, heads, e_dim}, qu.options());
  const int64_t slot_bytes = e_dim * 3 * ks.element_size();
  const int64_t grain = std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(1, slots * slot_bytes));
  at::parallel_for(0, bsz * heads, grain, [&](int64_t p0, int64_t p1) {
    if (ks.scalar_type() == at::kFloat)
      ring_heads(qu.data_ptr<float>(), qv.data_ptr<float>(), ks.data_ptr<float>(), ps.data_ptr<float>(),
                 vs.data_ptr<float>(), bs, bias.data_ptr<float>(), float(scale), heads, slots, e_dim, p0, p1,
                 out.data_ptr<float>());
    else
      ring_heads(qu.data_ptr<float>(), qv.data_ptr<float>(), ks.data_ptr<c10::BFloat16>(),
                 ps.data_ptr<c10::BFloat16>(), vs.data_ptr<c10::BFloat16>(), bs, bias.data_ptr<float>(),
                 float(scale), heads, slots, e_dim, p0, p1, out.data_ptr<float>());
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(txl, m) {
  m.def("ring_attend(Tensor qu, Tensor qv, Tensor ks, Tensor ps, Tensor vs, Tensor by_slot, Tensor bias, float scale) -> Tensor");
  m.def("gemv(Tensor x, Tensor w, int out, Tensor? bias=None) -> Tensor");
  m.def("gemv_t(Tensor x, Tensor w, Tensor? bias=None) -> Tensor");
  m.def("gemv_q8(Tensor x, Tensor w, Tensor scale, int out, Tensor? bias=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(txl, CPU, m) {
  m.impl("gemv", &gemv);
  m.impl("gemv_t", &gemv_t);
  m.impl("gemv_q8", &gemv_q8);
  m.impl("ring_attend", &ring_attend);
}
