/*
 * stria-balance: how evenly causal ring attention spreads its work over the ranks under each
 * token layout, from stria_analyze_balance (the public C API only).
 *
 *   stria-balance                          the table: S in {2048, 16384, 262144}, N in {2, 4, 8, 16},
 *                                          exact pairs (tile 1) and 64 x 64 tiles
 *   stria-balance --seq S --world N --tile T   one configuration (each flag narrows the sweep)
 *   stria-balance --svg FILE [--world N] [--seq S] [--tile T]
 *                                          the per-rank, per-step work of each layout as a picture
 *                                          (default N = 8, S = 2048, exact pairs)
 *   stria-balance --svg FILE --docs SEED [--world N] [--seq S] [--tile T]
 *                                          the same for packed documents of lognormal lengths
 *                                          (median 1k tokens, capped at 15k; SEED picks them): a
 *                                          document plan (stria_plan_create) beside each layout,
 *                                          with each ring's fraction of the ideal
 *                                          (default N = 8, S = 32768, 128 x 128 tiles)
 *
 * Why it matters: a ring step lasts as long as its busiest rank, so the ring's latency is the
 * sum over steps of the per-step maximum. Under the contiguous layout the late ranks see every
 * earlier key while the early ranks idle, so causal attention is about twice as slow as it
 * should be; striped and zigzag layouts give every rank nearly the same work at every step.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stria/stria.h"

#define NUM_LAYOUTS 3
#define MAX_PANELS 4 /* a plan and the three layouts */

/* Table and picture order: the baseline first, then the two balanced layouts. */
static const stria_layout_t kLayouts[NUM_LAYOUTS] = {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_ZIGZAG,
                                                     STRIA_LAYOUT_STRIPED};
static const char* const kLayoutNames[NUM_LAYOUTS] = {"contiguous", "zigzag", "striped"};

/* The largest ring the picture draws: beyond it the cells are thinner than a pixel. */
#define SVG_MAX_WORLD 256

static void Usage(FILE* f) {
  fprintf(f,
          "usage: stria-balance [--seq S] [--world N] [--tile T] [--svg FILE]\n"
          "  without flags: causal speedup and imbalance of each layout for S in {2048, 16384, 262144},\n"
          "  N in {2, 4, 8, 16}, at exact-pair (tile 1) and tile 64 granularity.\n"
          "  --seq, --world, --tile narrow the sweep to one value each.\n"
          "  --svg FILE writes the per-rank, per-step work of each layout as an SVG picture\n"
          "  (N defaults to 8, S to 2048, T to 1).\n"
          "  --svg FILE --docs SEED: packed documents of lognormal lengths, a document plan beside each\n"
          "  layout (N defaults to 8, S to 32768, T to 128).\n");
}

/* Parses a whole decimal integer; 0 on anything else (trailing junk, overflow, empty). */
static int ParseInt64(const char* s, long long* out) {
  char* end = NULL;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0') return 0;
  *out = v;
  return 1;
}

/* A whole number of pairs with thousands separators: 491648 -> "491,648". */
static const char* Grouped(double value, char* buf, size_t size) {
  char digits[64];
  snprintf(digits, sizeof digits, "%.0f", value);
  size_t n = strlen(digits), o = 0;
  for (size_t i = 0; i < n && o + 2 < size; ++i) {
    if (i > 0 && digits[i - 1] != '-' && (n - i) % 3 == 0) buf[o++] = ',';
    buf[o++] = digits[i];
  }
  buf[o] = '\0';
  return buf;
}

/* ---------------------------------------------------------------------------------------- */
/* The table.                                                                                */

typedef struct {
  int ok;
  stria_balance_t b;
} Cell;

static Cell Analyze(stria_layout_t layout, long long seq_len, int world, long long tile, char* err, size_t err_size) {
  Cell c;
  memset(&c, 0, sizeof c);
  c.b.struct_size = sizeof c.b;
  if (stria_analyze_balance(layout, 1, seq_len, world, tile, &c.b) == STRIA_SUCCESS) {
    c.ok = 1;
  } else if (err[0] == '\0') {
    /* Keep the first message only: the rest of a failed row usually says the same. */
    snprintf(err, err_size, "%s", stria_get_last_error());
  }
  return c;
}

static void PrintHeader(void) {
  printf("Causal ring attention: work in visible (q,k) pairs; a tile counts whole when any pair in it is visible.\n");
  printf(
      "speedup = total work / ring latency (N is perfect); imbalance = ring latency / (total work / N) "
      "(1 is perfect);\n");
  printf("striped gain = contiguous ring latency / striped ring latency.\n\n");
  printf("%8s %5s %5s |", "seq_len", "N", "tile");
  for (int l = 0; l < NUM_LAYOUTS; ++l) printf(" %-19s |", kLayoutNames[l]);
  printf(" striped\n");
  printf("%20s |", "");
  for (int l = 0; l < NUM_LAYOUTS; ++l) printf(" %8s %10s |", "speedup", "imbalance");
  printf("    gain\n");
}

/* Prints the rows for every (S, N, T) of the lists; returns the number of rows printed and
 * leaves the first library message of a skipped cell in err. */
static int PrintTable(const long long* seqs, int nseq, const int* worlds, int nworld, const long long* tiles, int ntile,
                      char* err, size_t err_size) {
  int rows = 0;
  for (int si = 0; si < nseq; ++si) {
    for (int wi = 0; wi < nworld; ++wi) {
      for (int ti = 0; ti < ntile; ++ti) {
        Cell cells[NUM_LAYOUTS];
        int any = 0;
        for (int l = 0; l < NUM_LAYOUTS; ++l) {
          cells[l] = Analyze(kLayouts[l], seqs[si], worlds[wi], tiles[ti], err, err_size);
          any |= cells[l].ok;
        }
        if (!any) continue;           /* an invalid combination for every layout: skip the row */
        if (rows == 0) PrintHeader(); /* only once there is a row, so a failed run prints just the error */
        printf("%8lld %5d %5lld |", seqs[si], worlds[wi], tiles[ti]);
        for (int l = 0; l < NUM_LAYOUTS; ++l) {
          if (cells[l].ok) {
            printf(" %8.2f %10.2f |", cells[l].b.speedup, cells[l].b.imbalance);
          } else {
            printf(" %8s %10s |", "n/a", "n/a");
          }
        }
        /* kLayouts: 0 contiguous, 2 striped. */
        if (cells[0].ok && cells[2].ok && cells[2].b.ring_latency > 0) {
          printf(" %7.2f\n", cells[0].b.ring_latency / cells[2].b.ring_latency);
        } else {
          printf(" %7s\n", "n/a");
        }
        ++rows;
      }
    }
  }
  return rows;
}

/* ---------------------------------------------------------------------------------------- */
/* The picture: one panel per layout, N rows (ranks) x N columns (steps), after Figure 4 of   */
/* Striped Attention (Brandon et al. 2023).                                                  */

/* White to dark blue: the share of the busiest cell of all panels. */
static void Shade(double t, char* buf, size_t size) {
  if (t < 0) t = 0;
  if (t > 1) t = 1;
  const int r = (int)(255 + (8 - 255) * t + 0.5);
  const int g = (int)(255 + (48 - 255) * t + 0.5);
  const int b = (int)(255 + (107 - 255) * t + 0.5);
  snprintf(buf, size, "#%02x%02x%02x", r, g, b);
}

#define FONT "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\""
#define BUSY_COLOR "#d62728"

/* What one picture shows: each panel's per-step table and summary (the three layouts, or a plan
 * and the layouts on packed documents). */
typedef struct {
  long long seq_len, tile;
  int n;
  int panels;
  const char* names[MAX_PANELS];
  double* work[MAX_PANELS]; /* [step * n + rank] */
  stria_balance_t summary[MAX_PANELS];
  long long documents; /* > 0: packed documents; the footers give the fraction of the ideal */
} Picture;

static void EmitSvg(FILE* f, const Picture* p) {
  const int n = p->n;
  char buf[64], buf2[64], color[16];

  /* One scale for all panels, so darker means more work wherever it appears. */
  double max_cell = 0;
  for (int l = 0; l < p->panels; ++l)
    for (int i = 0; i < n * n; ++i)
      if (p->work[l][i] > max_cell) max_cell = p->work[l][i];
  if (max_cell <= 0) max_cell = 1;

  /* Geometry: cells shrink with N so a panel stays about 320 px wide. */
  int cell = 320 / n;
  if (cell > 40) cell = 40;
  if (cell < 1) cell = 1;
  const int grid = cell * n;
  const int panel_w = grid > 270 ? grid : 270;
  const int left = 64, gap = 56, top = 118, strip_h = 40;
  const int width = left + p->panels * panel_w + (p->panels - 1) * gap + 24;
  const int strip_y = top + grid + 14;
  const int footer_y = strip_y + strip_h + 22;
  const int legend_y = footer_y + 44;
  const int height = legend_y + 40;
  const int label_every = cell >= 14 ? 1 : (14 + cell - 1) / cell; /* keep labels from overlapping */
  const int show_values = cell >= 30;                              /* room for "100.0" inside a cell */

  fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
  fprintf(f,
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" " FONT
          " font-size=\"12\">\n",
          width, height, width, height);
  fprintf(f, "<title>Causal ring attention work per rank and step: S=%lld, N=%d, tile %lld</title>\n", p->seq_len, n,
          p->tile);
  fprintf(f,
          "<defs><linearGradient id=\"scale\" x1=\"0\" x2=\"1\" y1=\"0\" y2=\"0\">"
          "<stop offset=\"0\" stop-color=\"#ffffff\"/><stop offset=\"1\" stop-color=\"#08306b\"/>"
          "</linearGradient></defs>\n");
  fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", width, height);
  fprintf(f,
          "<text x=\"%d\" y=\"28\" font-size=\"17\" font-weight=\"bold\">Causal ring attention: work of each rank "
          "at each ring step</text>\n",
          left);
  fprintf(f, "<text x=\"%d\" y=\"50\" fill=\"#333333\">S = %s tokens", left,
          Grouped((double)p->seq_len, buf, sizeof buf));
  if (p->documents > 0) fprintf(f, " in %lld packed documents (lognormal lengths)", p->documents);
  fprintf(f, ", N = %d rank%s, ", n, n == 1 ? "" : "s");
  if (p->tile == 1) {
    fprintf(f, "exact (q,k) pairs. ");
  } else {
    fprintf(f, "%lld x %lld tiles, counted whole when any pair is visible. ", p->tile, p->tile);
  }
  fprintf(f, "Shade: work relative to the busiest cell of all panels (%s pairs).</text>\n",
          Grouped(max_cell, buf2, sizeof buf2));
  fprintf(f,
          "<text x=\"%d\" y=\"68\" fill=\"#333333\">A step lasts as long as its busiest rank "
          "(<tspan fill=\"" BUSY_COLOR
          "\" font-weight=\"bold\">red outline</tspan>); "
          "the ring latency is the sum of those maxima (red bars).</text>\n",
          left);

  for (int l = 0; l < p->panels; ++l) {
    const double* work = p->work[l];
    const int x0 = left + l * (panel_w + gap) + (panel_w - grid) / 2;
    const int cx = left + l * (panel_w + gap) + panel_w / 2;
    fprintf(f, "<g>\n");
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"15\" font-weight=\"bold\" text-anchor=\"middle\">%s</text>\n", cx,
            top - 26, p->names[l]);
    /* Column (step) and row (rank) labels. */
    for (int s = 0; s < n; s += label_every)
      fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"10\" fill=\"#555555\" text-anchor=\"middle\">%d</text>\n",
              x0 + s * cell + cell / 2, top - 6, s);
    for (int r = 0; r < n; r += label_every)
      fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"10\" fill=\"#555555\" text-anchor=\"end\">%d</text>\n", x0 - 5,
              top + r * cell + cell / 2 + 4, r);
    if (l == 0) {
      fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"11\" fill=\"#555555\" text-anchor=\"end\">step</text>\n", x0 - 22,
              top - 6);
      fprintf(f,
              "<text x=\"%d\" y=\"%d\" font-size=\"11\" fill=\"#555555\" text-anchor=\"middle\" "
              "transform=\"rotate(-90 %d %d)\">rank</text>\n",
              x0 - 30, top + grid / 2, x0 - 30, top + grid / 2);
    }

    for (int s = 0; s < n; ++s) {
      double step_max = 0;
      for (int r = 0; r < n; ++r)
        if (work[s * n + r] > step_max) step_max = work[s * n + r];
      for (int r = 0; r < n; ++r) {
        const double w = work[s * n + r];
        const double t = w / max_cell;
        Shade(t, color, sizeof color);
        fprintf(f,
                "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\" stroke=\"#d9d9d9\" "
                "stroke-width=\"%s\"><title>rank %d, step %d: %s pairs</title></rect>\n",
                x0 + s * cell, top + r * cell, cell, cell, color, cell >= 8 ? "0.5" : "0", r, s,
                Grouped(w, buf, sizeof buf));
        if (show_values && w > 0)
          fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"10\" text-anchor=\"middle\" fill=\"%s\">%.1f</text>\n",
                  x0 + s * cell + cell / 2, top + r * cell + cell / 2 + 4, t > 0.5 ? "#ffffff" : "#222222", 100 * t);
      }
      /* Outline the busiest rank(s) of the step: they decide how long the step takes. */
      if (step_max > 0) {
        const double inset = cell >= 8 ? 1.0 : 0.25;
        for (int r = 0; r < n; ++r) {
          if (work[s * n + r] != step_max) continue;
          fprintf(f,
                  "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"none\" stroke=\"" BUSY_COLOR
                  "\" stroke-width=\"%s\"/>\n",
                  x0 + s * cell + inset, top + r * cell + inset, cell - 2 * inset, cell - 2 * inset,
                  cell >= 8 ? "2" : "0.5");
        }
      }
      /* The step's maximum as a bar below the grid: the bars add up to the ring latency. */
      const double bar = strip_h * step_max / max_cell;
      fprintf(f,
              "<rect x=\"%d\" y=\"%.2f\" width=\"%d\" height=\"%.2f\" fill=\"" BUSY_COLOR
              "\" fill-opacity=\"0.75\"><title>step %d: busiest rank %s pairs</title></rect>\n",
              x0 + s * cell + (cell >= 6 ? 1 : 0), strip_y + strip_h - bar, cell >= 6 ? cell - 2 : cell, bar, s,
              Grouped(step_max, buf, sizeof buf));
    }
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#888888\"/>\n", x0, top, grid,
            grid);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#888888\"/>\n", x0, strip_y + strip_h, x0 + grid,
            strip_y + strip_h);
    if (l == 0)
      fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"10\" fill=\"#555555\" text-anchor=\"end\">step max</text>\n",
              x0 - 5, strip_y + strip_h - 2);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">ring latency %s pairs</text>\n", cx, footer_y,
            Grouped(p->summary[l].ring_latency, buf, sizeof buf));
    if (p->documents > 0) {
      fprintf(f,
              "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\"><tspan font-weight=\"bold\">%.2f of ideal</tspan>, "
              "imbalance %.2f</text>\n",
              cx, footer_y + 18, p->summary[l].ideal_latency / p->summary[l].ring_latency, p->summary[l].imbalance);
    } else {
      fprintf(f,
              "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\"><tspan font-weight=\"bold\">speedup %.2f</tspan> of "
              "%d, imbalance %.2f</text>\n",
              cx, footer_y + 18, p->summary[l].speedup, n, p->summary[l].imbalance);
    }
    fprintf(f, "</g>\n");
  }

  /* Colour legend. */
  fprintf(f, "<g>\n");
  fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"200\" height=\"12\" fill=\"url(#scale)\" stroke=\"#888888\"/>\n", left,
          legend_y);
  fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"10\" fill=\"#555555\">0</text>\n", left, legend_y + 26);
  fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"10\" fill=\"#555555\" text-anchor=\"end\">%s pairs%s</text>\n",
          left + 200, legend_y + 26, Grouped(max_cell, buf, sizeof buf), show_values ? " = 100" : "");
  fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"11\" fill=\"#333333\">work of one rank in one step%s.</text>\n",
          left + 214, legend_y + 10, show_values ? " (cell numbers: % of the busiest cell)" : "");
  fprintf(f,
          "<text x=\"%d\" y=\"%d\" font-size=\"11\" fill=\"#333333\">%s; "
          "imbalance = ring latency / (total work / N).</text>\n",
          left + 214, legend_y + 26,
          p->documents > 0 ? "ideal = one device on every document alone (its own tiles) / N"
                           : "speedup = total work / ring latency");
  fprintf(f, "</g>\n</svg>\n");
}

/* Writes the picture to path; 0 on success. */
static int SavePicture(const char* path, const Picture* p) {
  FILE* f = fopen(path, "w");
  if (f == NULL) {
    fprintf(stderr, "stria-balance: cannot write %s: %s\n", path, strerror(errno));
    return 1;
  }
  EmitSvg(f, p);
  const int write_failed = ferror(f);
  if (fclose(f) != 0 || write_failed) {
    fprintf(stderr, "stria-balance: error writing %s\n", path);
    return 1;
  }
  return 0;
}

static int WriteSvg(const char* path, long long seq_len, int world, long long tile) {
  Picture p;
  memset(&p, 0, sizeof p);
  p.seq_len = seq_len;
  p.tile = tile;
  p.n = world;
  p.panels = NUM_LAYOUTS;
  for (int l = 0; l < NUM_LAYOUTS; ++l) p.names[l] = kLayoutNames[l];
  int status = 1;

  /* Let the library judge the arguments first; a valid but huge N is only too big to draw. */
  for (int l = 0; l < NUM_LAYOUTS; ++l) {
    /* Every layout is drawn, so each must be valid here (zigzag needs S divisible by 2N). */
    p.summary[l].struct_size = sizeof p.summary[l];
    if (stria_analyze_balance(kLayouts[l], 1, seq_len, world, tile, &p.summary[l]) != STRIA_SUCCESS) {
      fprintf(stderr, "stria-balance: %s\n", stria_get_last_error());
      return 1;
    }
  }
  if (world > SVG_MAX_WORLD) {
    fprintf(stderr, "stria-balance: --svg draws at most %d ranks, got --world %d\n", SVG_MAX_WORLD, world);
    return 1;
  }
  for (int l = 0; l < NUM_LAYOUTS; ++l) {
    p.work[l] = (double*)malloc(sizeof(double) * (size_t)world * (size_t)world);
    if (p.work[l] == NULL) {
      fprintf(stderr, "stria-balance: out of memory\n");
      goto done;
    }
    if (stria_analyze_balance_steps(kLayouts[l], 1, seq_len, world, tile, p.work[l]) != STRIA_SUCCESS) {
      fprintf(stderr, "stria-balance: %s\n", stria_get_last_error());
      goto done;
    }
  }
  status = SavePicture(path, &p);

done:
  for (int l = 0; l < NUM_LAYOUTS; ++l) free(p.work[l]);
  return status;
}

/* ---------------------------------------------------------------------------------------- */
/* Packed documents: a plan beside the layouts.                                              */

/* A uniform double in (0, 1) from a 64-bit state (xorshift64*): the same documents everywhere. */
static double Uniform(unsigned long long* state) {
  *state ^= *state >> 12;
  *state ^= *state << 25;
  *state ^= *state >> 27;
  return ((double)((*state * 2685821657736338717ULL) >> 11) + 0.5) / 9007199254740992.0;
}

/* Boundaries [0, .., S] of documents of lognormal lengths (median 1000, sigma 1, capped at
 * 15000); returns the number of documents, or -1 when out of memory (*cu is then NULL). */
static long long LognormalDocuments(long long seq_len, unsigned long long seed, int64_t** cu) {
  unsigned long long state = seed * 0x9e3779b97f4a7c15ULL + 1;
  long long cap = 1024, n = 0;
  *cu = (int64_t*)malloc(sizeof(int64_t) * (size_t)cap);
  if (*cu == NULL) return -1;
  (*cu)[0] = 0;
  while ((*cu)[n] < seq_len) {
    /* Box-Muller: one standard normal from two uniforms. */
    const double z = sqrt(-2.0 * log(Uniform(&state))) * cos(6.283185307179586 * Uniform(&state));
    long long len = llround(exp(log(1000.0) + z));
    if (len < 1) len = 1;
    if (len > 15000) len = 15000;
    if (n + 2 > cap) {
      cap *= 2;
      int64_t* grown = (int64_t*)realloc(*cu, sizeof(int64_t) * (size_t)cap);
      if (grown == NULL) {
        free(*cu);
        *cu = NULL;
        return -1;
      }
      *cu = grown;
    }
    (*cu)[n + 1] = (*cu)[n] + len < seq_len ? (*cu)[n] + len : seq_len;
    ++n;
  }
  return n;
}

static int WritePlanSvg(const char* path, long long seq_len, int world, long long tile, unsigned long long seed) {
  static const char* const kNames[MAX_PANELS] = {"plan", "contiguous", "zigzag", "striped"};
  Picture p;
  memset(&p, 0, sizeof p);
  p.seq_len = seq_len;
  p.tile = tile;
  p.n = world;
  p.panels = MAX_PANELS;
  int status = 1;
  int64_t* cu = NULL;
  stria_plan_t plans[MAX_PANELS] = {NULL};
  if (world > SVG_MAX_WORLD) {
    fprintf(stderr, "stria-balance: --svg draws at most %d ranks, got --world %d\n", SVG_MAX_WORLD, world);
    return 1;
  }
  const long long docs = LognormalDocuments(seq_len, seed, &cu);
  if (docs < 0) {
    fprintf(stderr, "stria-balance: out of memory\n");
    return 1;
  }
  p.documents = docs;
  printf("%lld documents over %lld tokens, N = %d, %lld x %lld tiles: fraction of the ideal ring latency\n", docs,
         seq_len, world, tile, tile);
  for (int l = 0; l < MAX_PANELS; ++l) {
    p.names[l] = kNames[l];
    stria_plan_config_t cfg;
    stria_plan_config_init(&cfg);
    cfg.world_size = world;
    cfg.tile = tile;
    if (l > 0) {
      cfg.strategy = STRIA_PLAN_LAYOUT;
      cfg.layout = kLayouts[l - 1];
    }
    p.summary[l].struct_size = sizeof p.summary[l];
    p.work[l] = (double*)malloc(sizeof(double) * (size_t)world * (size_t)world);
    if (p.work[l] == NULL || stria_plan_create(&cfg, cu, docs, 1, seq_len, &plans[l]) != STRIA_SUCCESS ||
        stria_plan_analyze_balance(plans[l], tile, &p.summary[l], p.work[l]) != STRIA_SUCCESS) {
      fprintf(stderr, "stria-balance: %s: %s\n", kNames[l], p.work[l] ? stria_get_last_error() : "out of memory");
      goto done;
    }
    printf("  %-10s %.3f\n", kNames[l], p.summary[l].ideal_latency / p.summary[l].ring_latency);
  }
  status = SavePicture(path, &p);

done:
  for (int l = 0; l < MAX_PANELS; ++l) {
    free(p.work[l]);
    if (plans[l] != NULL) stria_plan_destroy(plans[l]);
  }
  free(cu);
  return status;
}

/* ---------------------------------------------------------------------------------------- */

int main(int argc, char** argv) {
  long long seq = 0, tile = 0, world = 0, docs_seed = -1;
  int have_seq = 0, have_tile = 0, have_world = 0;
  const char* svg = NULL;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      Usage(stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "stria-balance: %s needs a value\n", a);
      Usage(stderr);
      return 2;
    }
    const char* v = argv[++i];
    if (strcmp(a, "--svg") == 0) {
      svg = v;
      continue;
    }
    long long x;
    if (!ParseInt64(v, &x)) {
      fprintf(stderr, "stria-balance: %s wants an integer, got '%s'\n", a, v);
      return 2;
    }
    if (strcmp(a, "--seq") == 0) {
      seq = x;
      have_seq = 1;
    } else if (strcmp(a, "--world") == 0) {
      if (x < -2147483647 - 1 || x > 2147483647) {
        fprintf(stderr, "stria-balance: --world %s does not fit in an int\n", v);
        return 2;
      }
      world = x;
      have_world = 1;
    } else if (strcmp(a, "--tile") == 0) {
      tile = x;
      have_tile = 1;
    } else if (strcmp(a, "--docs") == 0 && x >= 0) {
      docs_seed = x;
    } else {
      fprintf(stderr, "stria-balance: unknown option %s\n", a);
      Usage(stderr);
      return 2;
    }
  }
  const int world_int = (int)world;

  if (docs_seed >= 0) {
    if (svg == NULL) {
      fprintf(stderr, "stria-balance: --docs goes with --svg FILE\n");
      return 2;
    }
    if (WritePlanSvg(svg, have_seq ? seq : 32768, have_world ? world_int : 8, have_tile ? tile : 128,
                     (unsigned long long)docs_seed) != 0)
      return 1;
    printf("\nwrote %s\n", svg);
    return 0;
  }
  if (svg != NULL) {
    const long long s = have_seq ? seq : 2048, t = have_tile ? tile : 1;
    const int n = have_world ? world_int : 8;
    char err[512] = "";
    if (PrintTable(&s, 1, &n, 1, &t, 1, err, sizeof err) == 0) {
      fprintf(stderr, "stria-balance: %s\n", err);
      return 1;
    }
    if (WriteSvg(svg, s, n, t) != 0) return 1;
    printf("\nwrote %s\n", svg);
    return 0;
  }

  static const long long kSeqs[] = {2048, 16384, 262144};
  static const int kWorlds[] = {2, 4, 8, 16};
  static const long long kTiles[] = {1, 64};
  const long long* seqs = have_seq ? &seq : kSeqs;
  const int* worlds = have_world ? &world_int : kWorlds;
  const long long* tiles = have_tile ? &tile : kTiles;
  char err[512] = "";
  const int rows =
      PrintTable(seqs, have_seq ? 1 : 3, worlds, have_world ? 1 : 4, tiles, have_tile ? 1 : 2, err, sizeof err);
  if (rows == 0) {
    fprintf(stderr, "stria-balance: %s\n", err);
    return 1;
  }
  if (err[0] != '\0') printf("\nn/a: %s\n", err);
  return 0;
}
