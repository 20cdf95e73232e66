/* Packed documents with stria_attention_forward_documents: one sequence of 48 tokens holding three
 * documents, causal attention masked to each. A document's first token sees only itself, so its
 * output is its own value row exactly; under the plain call it also sees the documents before
 * it. Built and run by the tests (example_packed_documents). */
#include <math.h>
#include <stdio.h>
#include <stria/stria.h>

enum { L = 48, H = 2, D = 16 };

static int check(stria_status_t s) {
  if (s != STRIA_SUCCESS) printf("%s: %s\n", stria_status_string(s), stria_get_last_error());
  return s == STRIA_SUCCESS;
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

  /* Three documents: tokens [0, 20), [20, 31) and [31, 48) (one row: batch 1). */
  const int64_t cu_seqlens[4] = {0, 20, 31, 48};
  int ok = check(stria_attention_forward_documents(ctx, &p, cu_seqlens, 3, &tq, &tk, &tv, &to, &tl, NULL));
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
  stria_context_destroy(ctx);
  return ok ? 0 : 1;
}
