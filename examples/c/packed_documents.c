/* Packed documents through params (cu_seqlens, num_seqs): one sequence of 48 tokens holding three
 * documents, causal attention masked to each. A document's first token sees only itself, so its
 * output is its own value row exactly; under the plain call it also sees the documents before
 * it. Then the same sequence on a document plan over 3 ranks (threads of this process): each rank
 * holds the tokens the plan gives it, and the ring's outputs, put back in place, are the single
 * context's. Built and run by the tests (example_packed_documents). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <stria/stria.h>

enum { L = 48, H = 2, D = 16 };

static int check(stria_status_t s) {
  if (s != STRIA_SUCCESS) printf("%s: %s\n", stria_status_string(s), stria_get_last_error());
  return s == STRIA_SUCCESS;
}

enum { RANKS = 3 };

/* One rank of the plan's ring: shard q, k, v by the plan, attend, put the output back in place. */
struct Rank {
  stria_context_t ctx;
  stria_plan_t plan;
  int rank;
  int64_t local_len;
  const DLTensor *q, *k, *v;
  DLTensor* out; /* the full-sequence output all ranks write their tokens into */
  stria_status_t status;
};

static void* run_rank(void* arg) {
  struct Rank* r = (struct Rank*)arg;
  const int64_t n = r->local_len * H * D;
  float* buf = (float*)calloc((size_t)(5 * n + H * r->local_len), sizeof(float));
  int64_t shape[4] = {1, r->local_len, H, D}, lse_shape[3] = {1, H, r->local_len};
  DLTensor lq = *r->q, lk, lv, lo, ll;
  lq.shape = shape;
  lq.data = buf;
  lk = lq, lv = lq, lo = lq;
  lk.data = buf + n;
  lv.data = buf + 2 * n;
  lo.data = buf + 3 * n;
  ll = lq;
  ll.ndim = 3;
  ll.shape = lse_shape;
  ll.data = buf + 5 * n;
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  p.plan = r->plan; /* the ring runs on the plan; its boundaries are the mask */
  stria_status_t s = buf == NULL ? STRIA_ERROR_OUT_OF_MEMORY : STRIA_SUCCESS;
  if (s == STRIA_SUCCESS) s = stria_plan_shard(r->plan, r->rank, 1, r->q, &lq, NULL);
  if (s == STRIA_SUCCESS) s = stria_plan_shard(r->plan, r->rank, 1, r->k, &lk, NULL);
  if (s == STRIA_SUCCESS) s = stria_plan_shard(r->plan, r->rank, 1, r->v, &lv, NULL);
  if (s == STRIA_SUCCESS) s = stria_attention_forward(r->ctx, &p, &lq, &lk, &lv, &lo, &ll, NULL);
  if (s == STRIA_SUCCESS) s = stria_plan_unshard(r->plan, r->rank, 1, &lo, r->out, NULL);
  r->status = s;
  free(buf);
  return NULL;
}

int main(void) {
  static float q[L * H * D], k[L * H * D], v[L * H * D], out[L * H * D], lse[H * L];
  for (int i = 0; i < L * H * D; ++i) {
    q[i] = sinf(0.37f * (float)i);
    k[i] = cosf(0.11f * (float)i);
    v[i] = (float)(i % 13) - 6.0f;
  }
  int64_t shape[4] = {1, L, H, D}, lse_shape[3] = {1, H, L};
  DLDataType f32 = {kDLFloat, 32, 1};
  DLDevice cpu = {kDLCPU, 0};
  DLTensor tq = {q, cpu, 4, f32, shape, NULL, 0}, tk = tq, tv = tq, to = tq;
  DLTensor tl = {lse, cpu, 3, f32, lse_shape, NULL, 0};
  tk.data = k;
  tv.data = v;
  to.data = out;

  stria_context_config_t cfg;
  stria_context_config_init(&cfg); /* rank 0 of 1, CPU */
  stria_context_t ctx;
  if (!check(stria_context_create(&cfg, &ctx))) return 1;
  stria_attention_params_t p;
  stria_attention_params_init(&p); /* striped, causal, scale 1/sqrt(D) */

  /* Three documents: tokens [0, 20), [20, 31) and [31, 48) (one row: batch 1), in the params the
   * call takes like every other part of the attention. */
  const int64_t cu_seqlens[4] = {0, 20, 31, 48};
  stria_attention_params_t docs = p;
  docs.cu_seqlens = cu_seqlens;
  docs.num_seqs = 3;
  int ok = check(stria_attention_forward(ctx, &docs, &tq, &tk, &tv, &to, &tl, NULL));
  for (int d = 0; ok && d < 3; ++d) {
    const int64_t first = cu_seqlens[d];
    for (int h = 0; h < H; ++h)
      for (int e = 0; e < D; ++e) {
        const int64_t at = (first * H + h) * D + e;
        if (out[at] != v[at]) {
          printf("document %d: its first token's output %f is not its value %f\n", d, out[at], v[at]);
          ok = 0;
        }
      }
  }
  if (ok) printf("each document's first token sees only itself: ok\n");

  /* The plain call: token 20 now sees tokens 0..20 and its output is a mix of them. */
  ok = ok && check(stria_attention_forward(ctx, &p, &tq, &tk, &tv, &to, &tl, NULL));
  if (ok) printf("without the mask, token 20's output[0] is %f, not its value %f\n", out[20 * H * D], v[20 * H * D]);

  /* The documents again, on a plan over 3 ranks (48 tokens: 16 a rank, or a few more). */
  ok = ok && check(stria_attention_forward(ctx, &docs, &tq, &tk, &tv, &to, &tl, NULL));
  stria_context_destroy(ctx);
  stria_plan_config_t pc;
  stria_plan_config_init(&pc);
  pc.world_size = RANKS;
  pc.tile = 8; /* small tiles, so that a sequence this short has documents to cut */
  stria_plan_t plan = NULL;
  ok = ok && check(stria_plan_create(&pc, cu_seqlens, 3, 1, L, &plan));
  stria_plan_info_t info;
  info.struct_size = sizeof info;
  ok = ok && check(stria_plan_get_info(plan, &info));
  static float ring_out[L * H * D];
  DLTensor tr = to;
  tr.data = ring_out;
  stria_context_t group[RANKS] = {NULL};
  ok = ok && check(stria_context_create_local_group(&cfg, RANKS, group));
  if (ok) {
    struct Rank ranks[RANKS];
    pthread_t threads[RANKS];
    for (int r = 0; r < RANKS; ++r) {
      ranks[r] = (struct Rank){group[r], plan, r, info.local_len, &tq, &tk, &tv, &tr, STRIA_SUCCESS};
      pthread_create(&threads[r], NULL, run_rank, &ranks[r]);
    }
    for (int r = 0; r < RANKS; ++r) pthread_join(threads[r], NULL);
    for (int r = 0; r < RANKS; ++r) ok = check(ranks[r].status) && ok;
    double worst = 0;
    for (int i = 0; ok && i < L * H * D; ++i) worst = fmax(worst, fabs((double)ring_out[i] - (double)out[i]));
    if (ok)
      printf("on a plan over %d ranks (%lld slots each): largest difference %g\n", RANKS, (long long)info.local_len,
             worst);
    ok = ok && worst < 1e-5;
    if (ok) printf("the plan's ring matches one context: ok\n");
  }
  for (int r = 0; r < RANKS; ++r)
    if (group[r]) stria_context_destroy(group[r]);
  if (plan) stria_plan_destroy(plan);
  return ok ? 0 : 1;
}
