/* kvbench's decode kernels, float32 on CPU: single-query attention (kvb_decode_attention) and one step of the gated
 * delta rule (kvb_gdn_step, at the end of the file).
 *
 * Built and loaded by kvbench/engines/decode_kernel.py (read its docstring first). A *job* is one KV head of one
 * sequence: its nq query rows (the query heads sharing that KV head) attend to the job's entries, which lie in up to
 * two runs of rows of D floats: rows 0 .. n1-1 from the job's base address, then rows off2 .. off2 + n2 - 1.
 *
 * The arithmetic depends only on the query rows and the logical sequence of entries (run one, then run two), never
 * on where the runs lie, on the other jobs of the call or on the thread that computes the job: a child answering
 * alone and the same child inside a batch get bit-identical outputs. Two passes per job, each key and value read
 * once: scores s_i = (q . k_i) * scale and their maximum m, then p_i = exp(s_i - m), out = sum_i p_i v_i / sum_i p_i.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#define KVB_PATH "avx512"
#else
#define KVB_PATH "generic"
#endif

const char *kvb_path(void) { return KVB_PATH; }

static inline const float *entry(const float *base, int64_t i, int64_t n1, int64_t off2, int64_t D) {
    return base + (i < n1 ? i : off2 + (i - n1)) * D;
}

#if defined(__AVX512F__)
/* exp(x) elementwise, x <= 0 (scores minus their maximum): x = n ln2 + r, |r| <= ln2 / 2, exp(r) by the
 * degree-7 Taylor-like minimax polynomial of Cephes' expf, then scaled by 2^n. About 1 ulp. */
static inline __m512 exp_nonpositive(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* One job; D a multiple of 16. Inlined with constant D and nq where the caller knows them, so the accumulators of
 * the common shapes stay in registers. s: scratch of nq * stride floats, stride >= L rounded up to 16. */
static inline __attribute__((always_inline)) void job(const float *q, const float *kb, const float *vb, int64_t n1,
                                                      int64_t off2, int64_t n2, float *o, int64_t nq, int64_t D,
                                                      float scale, float *s, int64_t stride) {
    const int64_t L = n1 + n2, C = D / 16;
    float m[nq], total[nq];
    for (int64_t a = 0; a < nq; a++) m[a] = -INFINITY;
    for (int64_t i = 0; i < L; i++) { /* pass 1: scores, every query row per key */
        const float *k = entry(kb, i, n1, off2, D);
        for (int64_t a = 0; a < nq; a++) {
            const float *qa = q + a * D;
            __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(qa), _mm512_loadu_ps(k));
            for (int64_t c = 1; c < C; c++)
                acc = _mm512_fmadd_ps(_mm512_loadu_ps(qa + 16 * c), _mm512_loadu_ps(k + 16 * c), acc);
            float score = _mm512_reduce_add_ps(acc) * scale;
            s[a * stride + i] = score;
            m[a] = score > m[a] ? score : m[a];
        }
    }
    for (int64_t a = 0; a < nq; a++) { /* weights p_i = exp(s_i - m), summed in 16 lanes by i mod 16 */
        float *sa = s + a * stride;
        __m512 mv = _mm512_set1_ps(m[a]), sum = _mm512_setzero_ps();
        for (int64_t i = 0; i < L; i += 16) {
            __mmask16 live = L - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (L - i)) - 1u);
            __m512 e = _mm512_maskz_mov_ps(live, exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, sa + i), mv)));
            _mm512_mask_storeu_ps(sa + i, live, e);
            sum = _mm512_add_ps(sum, e);
        }
        total[a] = _mm512_reduce_add_ps(sum);
    }
    __m512 acc[nq * C]; /* pass 2: values */
    for (int64_t x = 0; x < nq * C; x++) acc[x] = _mm512_setzero_ps();
    for (int64_t i = 0; i < L; i++) {
        const float *v = entry(vb, i, n1, off2, D);
        for (int64_t c = 0; c < C; c++) {
            __m512 vc = _mm512_loadu_ps(v + 16 * c);
            for (int64_t a = 0; a < nq; a++)
                acc[a * C + c] = _mm512_fmadd_ps(_mm512_set1_ps(s[a * stride + i]), vc, acc[a * C + c]);
        }
    }
    for (int64_t a = 0; a < nq; a++) {
        __m512 inv = _mm512_set1_ps(1.0f / total[a]);
        for (int64_t c = 0; c < C; c++) _mm512_storeu_ps(o + a * D + 16 * c, _mm512_mul_ps(acc[a * C + c], inv));
    }
}
#endif

/* One job, plain C (any D): the same two passes, scalar. */
static void job_generic(const float *q, const float *kb, const float *vb, int64_t n1, int64_t off2, int64_t n2,
                        float *o, int64_t nq, int64_t D, float scale, float *s, int64_t stride) {
    const int64_t L = n1 + n2;
    for (int64_t a = 0; a < nq; a++) {
        const float *qa = q + a * D;
        float *sa = s + a * stride, m = -INFINITY, total = 0.0f;
        for (int64_t i = 0; i < L; i++) {
            const float *k = entry(kb, i, n1, off2, D);
            float dot = 0.0f;
            for (int64_t d = 0; d < D; d++) dot += qa[d] * k[d];
            sa[i] = dot * scale;
            m = sa[i] > m ? sa[i] : m;
        }
        for (int64_t i = 0; i < L; i++) {
            sa[i] = expf(sa[i] - m);
            total += sa[i];
        }
        float *oa = o + a * D;
        memset(oa, 0, (size_t)D * sizeof(float));
        for (int64_t i = 0; i < L; i++) {
            const float *v = entry(vb, i, n1, off2, D);
            for (int64_t d = 0; d < D; d++) oa[d] += sa[i] * v[d];
        }
        for (int64_t d = 0; d < D; d++) oa[d] /= total;
    }
}

/* Attend J jobs. q, out: [J, nq, D]. kptr / vptr: [J] addresses of each job's first key / value row. n1, off2, n2:
 * [J] its runs (above). knew / vnew: NULL, or [J, D] entries to write at row off2 + n2 first and attend as the
 * second run's last (a batched decoding step feeding one token per job). Jobs run in parallel (OpenMP threads of
 * the process's runtime, shared with torch when built against its libgomp). Returns 0, or -1 if a thread could not
 * allocate its scratch memory (its jobs are then skipped: their outputs and new entries are not written). */
int kvb_decode_attention(const float *q, const int64_t *kptr, const int64_t *vptr, const int64_t *n1,
                         const int64_t *off2, const int64_t *n2, const float *knew, const float *vnew, float *out,
                         int64_t J, int64_t nq, int64_t D, float scale) {
    const int64_t fed = knew != NULL;
    int64_t longest = 0;
    for (int64_t j = 0; j < J; j++) longest = n1[j] + n2[j] + fed > longest ? n1[j] + n2[j] + fed : longest;
    const int64_t stride = (longest + 15) / 16 * 16;
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        float *s = aligned_alloc(64, (size_t)(nq * stride + 16) * sizeof(float));
        failed = s == NULL;
#pragma omp for schedule(dynamic, 1)
        for (int64_t j = 0; j < J; j++) {
            if (s == NULL) continue;
            float *kb = (float *)(intptr_t)kptr[j], *vb = (float *)(intptr_t)vptr[j];
            const int64_t n2j = n2[j] + fed;
            if (fed) {
                memcpy(kb + (off2[j] + n2[j]) * D, knew + j * D, (size_t)D * sizeof(float));
                memcpy(vb + (off2[j] + n2[j]) * D, vnew + j * D, (size_t)D * sizeof(float));
            }
            const float *qj = q + j * nq * D;
            float *oj = out + j * nq * D;
            if (n1[j] + n2j == 0) {
                memset(oj, 0, (size_t)(nq * D) * sizeof(float));
                continue;
            }
#if defined(__AVX512F__)
            if (D == 64 && nq == 2)
                job(qj, kb, vb, n1[j], off2[j], n2j, oj, 2, 64, scale, s, stride);
            else if (D == 64)
                job(qj, kb, vb, n1[j], off2[j], n2j, oj, nq, 64, scale, s, stride);
            else if (D == 128)
                job(qj, kb, vb, n1[j], off2[j], n2j, oj, nq, 128, scale, s, stride);
            else if (D == 256)
                job(qj, kb, vb, n1[j], off2[j], n2j, oj, nq, 256, scale, s, stride);
            else if (D % 16 == 0)
                job(qj, kb, vb, n1[j], off2[j], n2j, oj, nq, D, scale, s, stride);
            else
#endif
                job_generic(qj, kb, vb, n1[j], off2[j], n2j, oj, nq, D, scale, s, stride);
        }
        free(s);
    }
    return failed ? -1 : 0;
}

/* One gated delta rule step (a GDN layer's recurrence for one fed token) for R (row, value head) pairs, float32:
 * with S the pair's state [Dk, Dv] (state_in, never written), d = exp(g):
 *   S' = d S;  m_j = sum_i S'_ij k_i;  delta_j = beta (v_j - m_j);  S''_ij = S'_ij + k_i delta_j;  o_j = sum_i S''_ij q_i
 * S'' goes to state_out and o to out. q, k: [R, Dk] (normalised and scaled by the caller); v, out: [R, Dv]; g, beta:
 * [R]. Sums run over i in order, each pair on one thread: a pair's result depends only on its own inputs. Each state
 * is read twice (the second time from L1: 16 KB at Dk = Dv = 64) and written once. */
void kvb_gdn_step(const float *q, const float *k, const float *v, const float *g, const float *beta,
                  const float *state_in, float *state_out, float *out, int64_t R, int64_t Dk, int64_t Dv) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; r++) {
        const float *S = state_in + r * Dk * Dv, *qr = q + r * Dk, *kr = k + r * Dk, *vr = v + r * Dv;
        float *T = state_out + r * Dk * Dv, *o = out + r * Dv;
        const float d = expf(g[r]), b = beta[r];
        float m[Dv], delta[Dv];
        for (int64_t j = 0; j < Dv; j++) m[j] = 0.0f;
        for (int64_t i = 0; i < Dk; i++)
            for (int64_t j = 0; j < Dv; j++) m[j] += (S[i * Dv + j] * d) * kr[i];
        for (int64_t j = 0; j < Dv; j++) {
            delta[j] = (vr[j] - m[j]) * b;
            o[j] = 0.0f;
        }
        for (int64_t i = 0; i < Dk; i++)
            for (int64_t j = 0; j < Dv; j++) {
                const float s = S[i * Dv + j] * d + kr[i] * delta[j];
                T[i * Dv + j] = s;
                o[j] += s * qr[i];
            }
    }
}
