/*
 * pkgconfig_forward: a four-rank ring in one process, built the way a C user builds against an
 * installed stria:
 *
 *   cc pkgconfig_forward.c $(pkg-config --cflags --libs stria) -lpthread -lm
 *
 * or with CMake: find_package(Stria) and target_link_libraries(... Stria::stria Threads::Threads).
 *
 * It cuts a full causal sequence into the zigzag layout with stria_shard, runs
 * stria_attention_forward on a local group of 4 contexts, each driven by its own pthread (a
 * context belongs to one thread at a time and the forward is a collective, so the ranks must run
 * concurrently), gathers the outputs with stria_unshard and compares them with a naive
 * double-precision full-sequence attention with grouped-query heads (Hq = 4 over Hkv = 2).
 * Exit status: 0 on success, 1 on a wrong result, 2 when a call fails.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <stria/stria.h>

enum { kWorld = 4, kB = 1, kL = 8, kS = kWorld * kL, kHq = 4, kHkv = 2, kD = 16 };
#define kMaxRelErr 1e-5
#define kLayout STRIA_LAYOUT_ZIGZAG

/* One rank's work: its context and its shards, and what happened, for the main thread to read
 * after pthread_join (the library's message is per thread, so the rank copies it). */
typedef struct {
  stria_context_t ctx;
  const stria_attention_params_t* params;
  DLTensor q, k, v, out, lse;
  stria_status_t status;
  char message[512];
} RankJob;

static float NextUniform(uint32_t* state) {
  *state = *state * 1664525u + 1013904223u;
  return (float)((*state >> 8) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static DLTensor MakeTensor(void* data, int ndim, int64_t* shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.device.device_id = 0;
  t.ndim = ndim;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  t.strides = NULL;
  t.byte_offset = 0;
  return t;
}

static void* RunRank(void* arg) {
  RankJob* job = arg;
  job->status = stria_attention_forward(job->ctx, job->params, &job->q, &job->k, &job->v, &job->out, &job->lse, NULL);
  /* No abort of the peers here: the library fails every rank of a ring whose ranks disagree, and
   * aborting would race with that and replace their precise message with "aborted". A failure
   * only this rank saw is bounded by config.timeout_s. */
  if (job->status != STRIA_SUCCESS) snprintf(job->message, sizeof job->message, "%s", stria_get_last_error());
  return NULL;
}

/* Naive causal attention over the whole sequence in double, with GQA: query head h reads key and
 * value head h / (Hq / Hkv). out: [B, S, Hq, D]; lse: [B, Hq, S]. */
static void Reference(const float* q, const float* k, const float* v, double scale, double* out, double* lse) {
  const int group = kHq / kHkv;
  double scores[kS];
  for (int b = 0; b < kB; ++b) {
    for (int h = 0; h < kHq; ++h) {
      const int hk = h / group;
      for (int i = 0; i < kS; ++i) {
        const float* qi = q + (((size_t)b * kS + i) * kHq + h) * kD;
        double m = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          const float* kj = k + (((size_t)b * kS + j) * kHkv + hk) * kD;
          double dot = 0.0;
          for (int d = 0; d < kD; ++d) dot += (double)qi[d] * (double)kj[d];
          scores[j] = scale * dot;
          if (scores[j] > m) m = scores[j];
        }
        double denom = 0.0;
        for (int j = 0; j <= i; ++j) {
          scores[j] = exp(scores[j] - m);
          denom += scores[j];
        }
        double* oi = out + (((size_t)b * kS + i) * kHq + h) * kD;
        for (int d = 0; d < kD; ++d) oi[d] = 0.0;
        for (int j = 0; j <= i; ++j) {
          const float* vj = v + (((size_t)b * kS + j) * kHkv + hk) * kD;
          for (int d = 0; d < kD; ++d) oi[d] += scores[j] / denom * (double)vj[d];
        }
        lse[((size_t)b * kHq + h) * kS + i] = m + log(denom);
      }
    }
  }
}

static double RelError(const float* got, const double* want, size_t n, int* nans) {
  double num = 0.0, den = 0.0;
  *nans = 0;
  for (size_t i = 0; i < n; ++i) {
    if (isnan(got[i])) ++*nans;
    const double e = (double)got[i] - want[i];
    num += e * e;
    den += want[i] * want[i];
  }
  return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

static int Check(stria_status_t s, const char* what) {
  if (s == STRIA_SUCCESS) return 1;
  fprintf(stderr, "pkgconfig_forward: %s failed: %s: %s\n", what, stria_status_string(s), stria_get_last_error());
  return 0;
}

int main(void) {
  const int version = stria_get_version();
  printf("pkgconfig_forward: stria %d.%d.%d (header %d.%d.%d)\n", version / 10000, version / 100 % 100, version % 100,
         STRIA_VERSION_MAJOR, STRIA_VERSION_MINOR, STRIA_VERSION_PATCH);

  /* Full-sequence tensors, and one set of shards per rank. */
  const size_t nq = (size_t)kB * kS * kHq * kD, nkv = (size_t)kB * kS * kHkv * kD, nlse = (size_t)kB * kHq * kS;
  const size_t lq = nq / kWorld, lkv = nkv / kWorld, llse = nlse / kWorld;
  float* q = malloc(nq * sizeof *q);
  float* k = malloc(nkv * sizeof *k);
  float* v = malloc(nkv * sizeof *v);
  float* out = malloc(nq * sizeof *out);
  float* lse = malloc(nlse * sizeof *lse);
  float* local = malloc((size_t)kWorld * (2 * lq + 2 * lkv + llse) * sizeof *local);
  double* ref_out = malloc(nq * sizeof *ref_out);
  double* ref_lse = malloc(nlse * sizeof *ref_lse);
  stria_context_t ctxs[kWorld] = {NULL};
  int have_group = 0, rc = 2;
  if (!q || !k || !v || !out || !lse || !local || !ref_out || !ref_lse) {
    fprintf(stderr, "pkgconfig_forward: out of memory\n");
    goto done;
  }
  uint32_t seed = 2024u;
  for (size_t i = 0; i < nq; ++i) q[i] = NextUniform(&seed);
  for (size_t i = 0; i < nkv; ++i) k[i] = NextUniform(&seed);
  for (size_t i = 0; i < nkv; ++i) v[i] = NextUniform(&seed);
  /* Poison what the ranks write, so a token no rank produced cannot pass. */
  for (size_t i = 0; i < nq; ++i) out[i] = NAN;
  for (size_t i = 0; i < nlse; ++i) lse[i] = NAN;

  int64_t full_q_shape[4] = {kB, kS, kHq, kD}, full_kv_shape[4] = {kB, kS, kHkv, kD};
  int64_t full_lse_shape[3] = {kB, kHq, kS};
  int64_t local_q_shape[4] = {kB, kL, kHq, kD}, local_kv_shape[4] = {kB, kL, kHkv, kD};
  int64_t local_lse_shape[3] = {kB, kHq, kL};
  DLTensor full_q = MakeTensor(q, 4, full_q_shape), full_k = MakeTensor(k, 4, full_kv_shape),
           full_v = MakeTensor(v, 4, full_kv_shape), full_out = MakeTensor(out, 4, full_q_shape),
           full_lse = MakeTensor(lse, 3, full_lse_shape);

  stria_context_config_t config;
  if (!Check(stria_context_config_init(&config), "stria_context_config_init")) goto done;
  config.timeout_s = 60.0; /* a broken ring fails the test in a minute, not the default five */
  if (!Check(stria_context_create_local_group(&config, kWorld, ctxs), "stria_context_create_local_group")) goto done;
  have_group = 1;

  stria_attention_params_t params;
  if (!Check(stria_attention_params_init(&params), "stria_attention_params_init")) goto done;
  params.layout = kLayout;
  params.causal = 1;

  RankJob jobs[kWorld];
  for (int r = 0; r < kWorld; ++r) {
    RankJob* job = &jobs[r];
    float* base = local + (size_t)r * (2 * lq + 2 * lkv + llse);
    memset(job, 0, sizeof *job);
    job->ctx = ctxs[r];
    job->params = &params;
    job->q = MakeTensor(base, 4, local_q_shape);
    job->k = MakeTensor(base + lq, 4, local_kv_shape);
    job->v = MakeTensor(base + lq + lkv, 4, local_kv_shape);
    job->out = MakeTensor(base + lq + 2 * lkv, 4, local_q_shape);
    job->lse = MakeTensor(base + 2 * lq + 2 * lkv, 3, local_lse_shape);
    /* The sequence is dimension 1 of q, k and v ([B, L, H, D]). */
    if (!Check(stria_shard(kLayout, kWorld, r, 1, &full_q, &job->q, NULL), "stria_shard(q)") ||
        !Check(stria_shard(kLayout, kWorld, r, 1, &full_k, &job->k, NULL), "stria_shard(k)") ||
        !Check(stria_shard(kLayout, kWorld, r, 1, &full_v, &job->v, NULL), "stria_shard(v)"))
      goto done;
  }

  pthread_t threads[kWorld];
  int started = 0;
  for (; started < kWorld; ++started) {
    int err = pthread_create(&threads[started], NULL, RunRank, &jobs[started]);
    if (err != 0) {
      fprintf(stderr, "pkgconfig_forward: pthread_create failed: %s\n", strerror(err));
      /* The started ranks wait for peers that will never come: release them. */
      for (int r = 0; r < kWorld; ++r) stria_context_abort(ctxs[r]);
      break;
    }
  }
  for (int r = 0; r < started; ++r) pthread_join(threads[r], NULL);
  if (started < kWorld) goto done;
  int failed = 0;
  for (int r = 0; r < kWorld; ++r) {
    if (jobs[r].status != STRIA_SUCCESS) {
      fprintf(stderr, "pkgconfig_forward: rank %d: stria_attention_forward failed: %s: %s\n", r,
              stria_status_string(jobs[r].status), jobs[r].message);
      failed = 1;
    }
  }
  if (failed) goto done;

  /* Gather: out along dimension 1, lse ([B, Hq, L]) along its last. */
  for (int r = 0; r < kWorld; ++r) {
    if (!Check(stria_unshard(kLayout, kWorld, r, 1, &jobs[r].out, &full_out, NULL), "stria_unshard(out)") ||
        !Check(stria_unshard(kLayout, kWorld, r, -1, &jobs[r].lse, &full_lse, NULL), "stria_unshard(lse)"))
      goto done;
  }

  Reference(q, k, v, 1.0 / sqrt((double)kD), ref_out, ref_lse);
  int out_nans = 0, lse_nans = 0;
  const double out_err = RelError(out, ref_out, nq, &out_nans);
  const double lse_err = RelError(lse, ref_lse, nlse, &lse_nans);
  printf("pkgconfig_forward: %d ranks x L=%d (S=%d), Hq=%d Hkv=%d D=%d, causal zigzag, float32\n", kWorld, kL, kS, kHq,
         kHkv, kD);
  printf("pkgconfig_forward: out relative error %.3g, lse relative error %.3g, NaNs %d (limit %.0e)\n", out_err,
         lse_err, out_nans + lse_nans, kMaxRelErr);
  if (out_nans || lse_nans || !(out_err < kMaxRelErr) || !(lse_err < kMaxRelErr)) {
    fprintf(stderr, "pkgconfig_forward: FAILED: the gathered output does not match the reference\n");
    rc = 1;
    goto done;
  }
  printf("pkgconfig_forward: OK\n");
  rc = 0;

done:
  if (have_group) {
    for (int r = 0; r < kWorld; ++r) {
      if (stria_context_destroy(ctxs[r]) != STRIA_SUCCESS) {
        fprintf(stderr, "pkgconfig_forward: stria_context_destroy(rank %d) failed: %s\n", r, stria_get_last_error());
        if (rc == 0) rc = 2;
      }
    }
  }
  free(q);
  free(k);
  free(v);
  free(out);
  free(lse);
  free(local);
  free(ref_out);
  free(ref_lse);
  return rc;
}
