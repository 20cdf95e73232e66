/* Sliding-window attention through params (window_left, window_right): 64 tokens, each query sees itself
 * and the 8 tokens before it (Mistral's local attention, say). The example checks every output row
 * against attention computed here over exactly those keys, and that a window as long as the
 * sequence gives the plain call's numbers. Built and run by the tests (example_sliding_window). */
#include <math.h>
#include <stdio.h>
#include <stria/stria.h>

enum { L = 64, H = 2, D = 16, W = 8 };

static int check(stria_status_t s) {
  if (s != STRIA_SUCCESS) printf("%s: %s\n", stria_status_string(s), stria_get_last_error());
  return s == STRIA_SUCCESS;
}

/* Output row i, head h of softmax(q k^T / sqrt(D)) v over the keys [i - W, i]. */
static void windowed_row(const float* q, const float* k, const float* v, int i, int h, double* row) {
  double p[W + 1], mx = -INFINITY, sum = 0;
  const int j0 = i - W < 0 ? 0 : i - W;
  for (int j = j0; j <= i; ++j) {
    double s = 0;
    for (int d = 0; d < D; ++d) s += (double)q[(i * H + h) * D + d] * k[(j * H + h) * D + d];
    p[j - j0] = s / sqrt((double)D);
    if (p[j - j0] > mx) mx = p[j - j0];
  }
  for (int j = j0; j <= i; ++j) sum += (p[j - j0] = exp(p[j - j0] - mx));
  for (int d = 0; d < D; ++d) {
    row[d] = 0;
    for (int j = j0; j <= i; ++j) row[d] += p[j - j0] / sum * v[(j * H + h) * D + d];
  }
}

int main(void) {
  static float q[L * H * D], k[L * H * D], v[L * H * D], out[L * H * D], plain[L * H * D], lse[H * L];
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

  /* W keys to the left; the right side does not matter when causal (-1: unbounded); no documents. */
  stria_attention_params_t windowed = p;
  windowed.window_left = W;
  windowed.window_right = -1;
  if (!check(stria_attention_forward(ctx, &windowed, &tq, &tk, &tv, &to, &tl, NULL))) return 1;
  double worst = 0, row[D];
  for (int i = 0; i < L; ++i)
    for (int h = 0; h < H; ++h) {
      windowed_row(q, k, v, i, h, row);
      for (int d = 0; d < D; ++d) worst = fmax(worst, fabs(row[d] - out[(i * H + h) * D + d]));
    }
  printf("a window of %d: largest difference from the direct computation %.2g: %s\n", W, worst,
         worst < 1e-4 ? "ok" : "WRONG");

  /* A window as long as the sequence cuts nothing: the plain call's numbers. */
  to.data = plain;
  int ok = worst < 1e-4 && check(stria_attention_forward(ctx, &p, &tq, &tk, &tv, &to, &tl, NULL));
  to.data = out;
  windowed.window_left = L;
  ok = ok && check(stria_attention_forward(ctx, &windowed, &tq, &tk, &tv, &to, &tl, NULL));
  for (int i = 0; ok && i < L * H * D; ++i) ok = fabsf(out[i] - plain[i]) < 1e-5f;
  printf("a window of the whole sequence: %s\n", ok ? "the plain call's numbers: ok" : "WRONG");
  stria_context_destroy(ctx);
  return ok ? 0 : 1;
}
