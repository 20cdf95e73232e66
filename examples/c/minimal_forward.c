/* The README's complete example, built and run by the tests (example_minimal) so it stays true. */
#include <stdio.h>
#include <stria/stria.h>

int main(void) {
  enum { L = 64, H = 2, D = 32 };
  static float q[L * H * D], k[L * H * D], v[L * H * D], out[L * H * D], lse[H * L];
  for (int i = 0; i < L * H * D; ++i) q[i] = k[i] = v[i] = (float)((i % 7) - 3) / 7.0f;
  int64_t shape[4] = {1, L, H, D}, lse_shape[3] = {1, H, L};
  DLDataType f32 = {kDLFloat, 32, 1};
  DLDevice cpu = {kDLCPU, 0};
  DLTensor tq = {q, cpu, 4, f32, shape, NULL, 0}, tk = tq, tv = tq, to = tq;
  DLTensor tl = {lse, cpu, 3, f32, lse_shape, NULL, 0};
  tk.data = k;
  tv.data = v;
  to.data = out;

  stria_context_config_t cfg;
  stria_context_config_init(&cfg); /* rank 0 of 1, CPU, in-process transport */
  stria_context_t ctx;
  if (stria_context_create(&cfg, &ctx) != STRIA_SUCCESS) {
    puts(stria_get_last_error());
    return 1;
  }
  stria_attention_params_t p;
  stria_attention_params_init(&p); /* striped, causal, scale 1/sqrt(D) */
  stria_status_t s = stria_attention_forward(ctx, &p, &tq, &tk, &tv, &to, &tl, NULL);
  if (s != STRIA_SUCCESS)
    printf("%s: %s\n", stria_status_string(s), stria_get_last_error());
  else
    printf("out[0] = %f, lse[0] = %f\n", out[0], lse[0]);
  stria_context_destroy(ctx);
  return s == STRIA_SUCCESS ? 0 : 1;
}
