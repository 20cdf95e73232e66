/*
 * dlopen_forward: use libstria the way a framework does, by dlopen() at run time, without linking it.
 *
 *   dlopen_forward [path/to/libstria.so.0]
 *
 * Without an argument the dynamic linker's default search finds "libstria.so.0" (the SONAME, so
 * the program keeps working across minor releases and never needs the development symlink).
 * stria.h is included for its types and constants only: every function is resolved with
 * dlsym(), so this program proves that the exported C ABI alone is enough to load the library,
 * build a one-rank context and run a causal striped forward on the CPU.
 *
 * The output is checked against a naive double-precision attention computed here. Exit status:
 * 0 on success, 1 on a wrong result, 2 when the library cannot be loaded or a call fails.
 */
#define _POSIX_C_SOURCE 200809L /* dlopen/dlsym under a strict -std=c99 */

#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stria/stria.h"

/* The problem: [B, L, H, D] float32, one rank, so S = L. Small enough for the naive reference. */
enum { kB = 1, kL = 16, kH = 2, kD = 32 };
#define kMaxRelErr 1e-5

/* The entry points this program uses, resolved by name. The typedefs come from the prototypes'
 * shapes in stria.h: keeping them here (not taking the addresses of the declared functions) is
 * what keeps libstria out of the link. */
typedef int (*GetVersionFn)(void);
typedef const char* (*GetLastErrorFn)(void);
typedef stria_status_t (*ConfigInitFn)(stria_context_config_t*);
typedef stria_status_t (*ContextCreateFn)(const stria_context_config_t*, stria_context_t*);
typedef stria_status_t (*ParamsInitFn)(stria_attention_params_t*);
typedef stria_status_t (*ForwardFn)(stria_context_t, const stria_attention_params_t*, const DLTensor*, const DLTensor*,
                                    const DLTensor*, DLTensor*, DLTensor*, void*);
typedef stria_status_t (*ContextDestroyFn)(stria_context_t);

typedef struct {
  GetVersionFn get_version;
  GetLastErrorFn get_last_error;
  ConfigInitFn context_config_init;
  ContextCreateFn context_create;
  ParamsInitFn attention_params_init;
  ForwardFn attention_forward;
  ContextDestroyFn context_destroy;
} StriaApi;

/* dlsym returns void*; POSIX guarantees that it converts to a function pointer. */
static int Resolve(void* lib, const char* name, void** slot) {
  dlerror(); /* clear a stale error so that the check below is about this lookup */
  *slot = dlsym(lib, name);
  if (*slot == NULL) {
    const char* why = dlerror();
    fprintf(stderr, "dlopen_forward: symbol %s not found: %s\n", name, why ? why : "NULL address");
    return 0;
  }
  return 1;
}

static int LoadApi(void* lib, StriaApi* api) {
  void* p[7];
  if (!Resolve(lib, "stria_get_version", &p[0]) || !Resolve(lib, "stria_get_last_error", &p[1]) ||
      !Resolve(lib, "stria_context_config_init", &p[2]) || !Resolve(lib, "stria_context_create", &p[3]) ||
      !Resolve(lib, "stria_attention_params_init", &p[4]) || !Resolve(lib, "stria_attention_forward", &p[5]) ||
      !Resolve(lib, "stria_context_destroy", &p[6]))
    return 0;
  api->get_version = (GetVersionFn)p[0];
  api->get_last_error = (GetLastErrorFn)p[1];
  api->context_config_init = (ConfigInitFn)p[2];
  api->context_create = (ContextCreateFn)p[3];
  api->attention_params_init = (ParamsInitFn)p[4];
  api->attention_forward = (ForwardFn)p[5];
  api->context_destroy = (ContextDestroyFn)p[6];
  return 1;
}

/* Reports a failed call with the library's own message (which is per thread: read it at once). */
static int Failed(const StriaApi* api, const char* what, stria_status_t s) {
  if (s == STRIA_SUCCESS) return 0;
  fprintf(stderr, "dlopen_forward: %s failed (status %d): %s\n", what, (int)s, api->get_last_error());
  return 1;
}

/* Deterministic inputs in [-1, 1): the same numbers on every machine, no libc rand() state. */
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
  t.strides = NULL; /* compact row-major */
  t.byte_offset = 0;
  return t;
}

/* Naive causal attention in double: out[b, i, h, :] = softmax_j<=i(scale * q_i . k_j) v_j, and
 * lse[b, h, i] = log of the softmax denominator. Token order is global order because one rank
 * holds the whole sequence (striped positions i * 1 + 0 = i). */
static void Reference(const float* q, const float* k, const float* v, double scale, double* out, double* lse) {
  double scores[kL];
  for (int b = 0; b < kB; ++b) {
    for (int h = 0; h < kH; ++h) {
      for (int i = 0; i < kL; ++i) {
        const float* qi = q + (((size_t)b * kL + i) * kH + h) * kD;
        double m = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          const float* kj = k + (((size_t)b * kL + j) * kH + h) * kD;
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
        double* oi = out + (((size_t)b * kL + i) * kH + h) * kD;
        for (int d = 0; d < kD; ++d) oi[d] = 0.0;
        for (int j = 0; j <= i; ++j) {
          const float* vj = v + (((size_t)b * kL + j) * kH + h) * kD;
          for (int d = 0; d < kD; ++d) oi[d] += scores[j] / denom * (double)vj[d];
        }
        lse[((size_t)b * kH + h) * kL + i] = m + log(denom);
      }
    }
  }
}

/* ||got - want|| / ||want|| in double; NaN anywhere in got makes the result NaN. */
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

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "libstria.so.0";
  /* RTLD_LOCAL: a framework loads us beside other libraries; nothing of ours may leak into the
   * global namespace. RTLD_NOW: a missing dependency shows up here, not in the middle of a call. */
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "dlopen_forward: cannot load %s: %s\n", path, dlerror());
    return 2;
  }
  StriaApi api;
  if (!LoadApi(lib, &api)) {
    dlclose(lib);
    return 2;
  }

  const int version = api.get_version();
  printf("dlopen_forward: loaded %s, version %d.%d.%d (header %d.%d.%d)\n", path, version / 10000, version / 100 % 100,
         version % 100, STRIA_VERSION_MAJOR, STRIA_VERSION_MINOR, STRIA_VERSION_PATCH);
  /* Structs carry struct_size, so a newer library accepts this program's older structs; a
   * different major version is a different ABI and is refused. */
  if (version / 10000 != STRIA_VERSION_MAJOR) {
    fprintf(stderr, "dlopen_forward: library major version %d, this program was built for %d\n", version / 10000,
            STRIA_VERSION_MAJOR);
    dlclose(lib);
    return 2;
  }

  const size_t n_qkv = (size_t)kB * kL * kH * kD;
  const size_t n_lse = (size_t)kB * kH * kL;
  float* q = malloc(n_qkv * sizeof *q);
  float* k = malloc(n_qkv * sizeof *k);
  float* v = malloc(n_qkv * sizeof *v);
  float* out = malloc(n_qkv * sizeof *out);
  float* lse = malloc(n_lse * sizeof *lse);
  double* ref_out = malloc(n_qkv * sizeof *ref_out);
  double* ref_lse = malloc(n_lse * sizeof *ref_lse);
  int rc = 2;
  stria_context_t ctx = NULL;
  if (!q || !k || !v || !out || !lse || !ref_out || !ref_lse) {
    fprintf(stderr, "dlopen_forward: out of memory\n");
    goto done;
  }
  uint32_t seed = 12345u;
  for (size_t i = 0; i < n_qkv; ++i) q[i] = NextUniform(&seed);
  for (size_t i = 0; i < n_qkv; ++i) k[i] = NextUniform(&seed);
  for (size_t i = 0; i < n_qkv; ++i) v[i] = NextUniform(&seed);
  /* A poisoned output: a row the library forgot to write cannot pass the check by accident. */
  for (size_t i = 0; i < n_qkv; ++i) out[i] = NAN;
  for (size_t i = 0; i < n_lse; ++i) lse[i] = NAN;

  stria_context_config_t config;
  if (Failed(&api, "stria_context_config_init", api.context_config_init(&config))) goto done;
  config.rank = 0;
  config.world_size = 1;
  config.num_threads = 2; /* a small problem: do not wake every core of a CI machine */
  if (Failed(&api, "stria_context_create", api.context_create(&config, &ctx))) goto done;

  stria_attention_params_t params;
  if (Failed(&api, "stria_attention_params_init", api.attention_params_init(&params))) goto done;
  params.layout = STRIA_LAYOUT_STRIPED;
  params.causal = 1;
  params.softmax_scale = 0.0f; /* the default, 1/sqrt(D) */

  int64_t qkv_shape[4] = {kB, kL, kH, kD};
  int64_t lse_shape[3] = {kB, kH, kL};
  DLTensor tq = MakeTensor(q, 4, qkv_shape), tk = MakeTensor(k, 4, qkv_shape), tv = MakeTensor(v, 4, qkv_shape);
  DLTensor tout = MakeTensor(out, 4, qkv_shape), tlse = MakeTensor(lse, 3, lse_shape);
  if (Failed(&api, "stria_attention_forward", api.attention_forward(ctx, &params, &tq, &tk, &tv, &tout, &tlse, NULL)))
    goto done;

  Reference(q, k, v, 1.0 / sqrt((double)kD), ref_out, ref_lse);
  int out_nans = 0, lse_nans = 0;
  const double out_err = RelError(out, ref_out, n_qkv, &out_nans);
  const double lse_err = RelError(lse, ref_lse, n_lse, &lse_nans);
  printf("dlopen_forward: B=%d L=%d H=%d D=%d, 1 rank, causal striped, float32\n", kB, kL, kH, kD);
  printf("dlopen_forward: out relative error %.3g, lse relative error %.3g, NaNs %d (limit %.0e)\n", out_err, lse_err,
         out_nans + lse_nans, kMaxRelErr);
  /* Written as "not below the limit" so that a NaN error fails too. */
  if (out_nans || lse_nans || !(out_err < kMaxRelErr) || !(lse_err < kMaxRelErr)) {
    fprintf(stderr, "dlopen_forward: FAILED: the output does not match the reference\n");
    rc = 1;
    goto done;
  }
  printf("dlopen_forward: OK\n");
  rc = 0;

done:
  if (ctx != NULL && api.context_destroy(ctx) != STRIA_SUCCESS) {
    fprintf(stderr, "dlopen_forward: stria_context_destroy failed: %s\n", api.get_last_error());
    if (rc == 0) rc = 2;
  }
  free(q);
  free(k);
  free(v);
  free(out);
  free(lse);
  free(ref_out);
  free(ref_lse);
  dlclose(lib);
  return rc;
}
