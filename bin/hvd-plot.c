/*
 * hvd-plot - the loss curve of a training log, without writing code:
 *
 *   hvd-plot [-o FILE.svg] [--title TEXT] LOG.jsonl [LOG2.jsonl ...]
 *
 * Reads JSON-lines logs (bert_train and cifar_train --log-json: one
 * {"step":N,"loss":X,...} record per line; other lines and fields are
 * ignored) and writes one SVG chart of loss against step, a curve per log
 * (default file: the first log's name with .svg), atomically (a temporary
 * file renamed over it). Prints, per log, one line with its range and a
 * sparkline of the curve. Needs nothing but the C library.
 *
 * Records whose step or loss is not a finite number are left out; one
 * beyond +-1e300 is refused (a chart cannot scale it).
 *
 * Exit status: 0 written; 1 a log unreadable, without records or with a
 * value beyond 1e300, or the chart not written; 2 a bad command line.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define W 800
#define H 480
#define LEFT 72
#define RIGHT 24
#define TOP 48
#define BOTTOM 56

typedef struct curve {
  const char *path;
  double *step, *loss;
  size_t n, cap;
} curve_t;

static const char *const colors[] = {"#1f77b4", "#d62728", "#2ca02c",
                                     "#9467bd", "#ff7f0e", "#17becf"};

static void usage(FILE *f) {
  fputs("usage: hvd-plot [-o FILE.svg] [--title TEXT] LOG.jsonl [LOG ...]\n"
        "  the loss against the step of JSON-lines training logs\n"
        "  (bert_train, cifar_train --log-json) as one SVG chart\n",
        f);
}

/* The number after "key": in line, or NAN. */
static double field(const char *line, const char *key) {
  const char *p = strstr(line, key);
  if (p == NULL)
    return NAN;
  p += strlen(key);
  while (*p == ' ')
    p++;
  char *end;
  double v = strtod(p, &end);
  return end == p ? NAN : v;
}

static int add(curve_t *c, double step, double loss) {
  if (c->n == c->cap) {
    size_t cap = c->cap ? 2 * c->cap : 256;
    double *s = realloc(c->step, cap * sizeof *s);
    if (s == NULL)
      return -1;
    c->step = s;
    double *l = realloc(c->loss, cap * sizeof *l);
    if (l == NULL)
      return -1;
    c->loss = l;
    c->cap = cap;
  }
  c->step[c->n] = step;
  c->loss[c->n++] = loss;
  return 0;
}

/* The largest magnitude charted: the spans and means stay finite. */
#define MAX_VALUE 1e300

static int read_log(curve_t *c) {
  FILE *f = fopen(c->path, "r");
  if (f == NULL) {
    fprintf(stderr, "hvd-plot: cannot open '%s': %s\n", c->path,
            strerror(errno));
    return -1;
  }
  char *line = NULL; /* whole, however long: a record is one line */
  size_t cap = 0;
  int rc = 0;
  for (long no = 1; rc == 0 && getline(&line, &cap, f) >= 0; no++) {
    double s = field(line, "\"step\":"), l = field(line, "\"loss\":");
    if (!isfinite(s) || !isfinite(l))
      continue;
    if (fabs(s) > MAX_VALUE || fabs(l) > MAX_VALUE) {
      fprintf(stderr,
              "hvd-plot: '%s' line %ld: step %g, loss %g: beyond the %g "
              "that a chart can scale\n",
              c->path, no, s, l, MAX_VALUE);
      rc = -1;
    } else if (add(c, s, l) != 0) {
      fprintf(stderr, "hvd-plot: out of memory\n");
      rc = -1;
    }
  }
  free(line);
  fclose(f);
  if (rc == 0 && c->n == 0) {
    fprintf(stderr,
            "hvd-plot: '%s' has no {\"step\":N,\"loss\":X} records (a "
            "--log-json file?)\n",
            c->path);
    rc = -1;
  }
  return rc;
}

/* [lo, hi] at least `least` wide and a billionth of its magnitude (a few
 * ulps apart, the ticks' step would not move a double), about its
 * middle: 10 % of it, or `least`. */
static void widen(double *lo, double *hi, double least) {
  double mag = fmax(fabs(*lo), fabs(*hi));
  if (*hi - *lo >= fmax(mag * 1e-9, least))
    return;
  double mid = *lo / 2 + *hi / 2, half = fmax(fabs(mid) * 0.05, least / 2);
  *lo = mid - half;
  *hi = mid + half;
}

/* A round step for about `want` ticks over [lo, hi]. */
static double tick_step(double lo, double hi, int want) {
  double raw = (hi - lo) / want, p = pow(10, floor(log10(raw))), m = raw / p;
  return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

/* The curve as a line of block characters (40 columns). */
static void sparkline(const curve_t *c, char *out, size_t len) {
  static const char *const bars[8] = {"\u2581", "\u2582", "\u2583", "\u2584",
                                      "\u2585", "\u2586", "\u2587", "\u2588"};
  enum { COLS = 40 };
  double mean[COLS] = {0}, lo = INFINITY, hi = -INFINITY;
  int cnt[COLS] = {0};
  for (size_t i = 0; i < c->n; i++) { /* a running mean: never overflows */
    size_t b = i * COLS / c->n;
    cnt[b]++;
    mean[b] += (c->loss[i] - mean[b]) / cnt[b];
  }
  for (int b = 0; b < COLS; b++)
    if (cnt[b] > 0)
      lo = fmin(lo, mean[b]), hi = fmax(hi, mean[b]);
  size_t at = 0;
  out[0] = '\0';
  for (int b = 0; b < COLS && at + 4 < len; b++)
    if (cnt[b] > 0) {
      double v = hi - lo > fmax(fabs(lo), fabs(hi)) * 1e-9 /* not flat */
                     ? (mean[b] - lo) / (hi - lo) * 7.999
                     : 0;
      int k = v > 0 ? (v < 7 ? (int)v : 7) : 0;
      at += (size_t)snprintf(out + at, len - at, "%s", bars[k]);
    }
}

static void xml_text(FILE *f, const char *s) {
  for (; *s; s++)
    switch (*s) {
    case '<':
      fputs("&lt;", f);
      break;
    case '>':
      fputs("&gt;", f);
      break;
    case '&':
      fputs("&amp;", f);
      break;
    case '"':
      fputs("&quot;", f);
      break;
    default:
      fputc(*s, f);
    }
}

static void svg(FILE *f, const curve_t *cs, int nc, const char *title) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (int k = 0; k < nc; k++)
    for (size_t i = 0; i < cs[k].n; i++) {
      x0 = fmin(x0, cs[k].step[i]), x1 = fmax(x1, cs[k].step[i]);
      y0 = fmin(y0, cs[k].loss[i]), y1 = fmax(y1, cs[k].loss[i]);
    }
  widen(&x0, &x1, 1);
  widen(&y0, &y1, 1e-3);
  double pad = (y1 - y0) * 0.05;
  y0 -= pad, y1 += pad;
  const double pw = W - LEFT - RIGHT, ph = H - TOP - BOTTOM;
#define PX(x) (LEFT + ((x)-x0) / (x1 - x0) * pw)
#define PY(y) (TOP + (1 - ((y)-y0) / (y1 - y0)) * ph)
  fprintf(f,
          "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
          "height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" "
          "font-size=\"12\">\n"
          "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n",
          W, H, W, H, W, H);
  fputs("<text x=\"400\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">", f);
  xml_text(f, title);
  fputs("</text>\n", f);
  double xs = tick_step(x0, x1, 8), ys = tick_step(y0, y1, 6);
  double xt = ceil(x0 / xs) * xs, yt = ceil(y0 / ys) * ys;
  for (int i = 0; i <= 20 && xt + i * xs <= x1 + xs * 1e-9; i++) {
    double x = xt + i * xs;
    fprintf(f,
            "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" "
            "stroke=\"#e0e0e0\"/><text x=\"%.1f\" y=\"%d\" "
            "text-anchor=\"middle\">%g</text>\n",
            PX(x), TOP, PX(x), H - BOTTOM, PX(x), H - BOTTOM + 16, x);
  }
  for (int i = 0; i <= 20 && yt + i * ys <= y1 + ys * 1e-9; i++) {
    double y = yt + i * ys;
    fprintf(f,
            "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" "
            "stroke=\"#e0e0e0\"/><text x=\"%d\" y=\"%.1f\" "
            "text-anchor=\"end\">%g</text>\n",
            LEFT, PY(y), W - RIGHT, PY(y), LEFT - 6, PY(y) + 4, y);
  }
  fprintf(f,
          "<rect x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%.0f\" "
          "fill=\"none\" stroke=\"black\"/>\n"
          "<text x=\"%.0f\" y=\"%d\" text-anchor=\"middle\">step</text>\n"
          "<text x=\"16\" y=\"%.0f\" text-anchor=\"middle\" "
          "transform=\"rotate(-90 16 %.0f)\">loss</text>\n",
          LEFT, TOP, pw, ph, LEFT + pw / 2, H - 16, TOP + ph / 2, TOP + ph / 2);
  for (int k = 0; k < nc; k++) {
    const char *color = colors[k % (int)(sizeof colors / sizeof *colors)];
    fprintf(f,
            "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" "
            "points=\"",
            color);
    for (size_t i = 0; i < cs[k].n; i++)
      fprintf(f, "%s%.1f,%.1f", i ? " " : "", PX(cs[k].step[i]),
              PY(cs[k].loss[i]));
    fputs("\"/>\n", f);
    fprintf(f,
            "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" "
            "stroke-width=\"2\"/><text x=\"%d\" y=\"%d\">",
            W - RIGHT - 220, TOP + 16 + 16 * k, W - RIGHT - 200,
            TOP + 16 + 16 * k, color, W - RIGHT - 194, TOP + 20 + 16 * k);
    const char *slash = strrchr(cs[k].path, '/');
    xml_text(f, slash ? slash + 1 : cs[k].path);
    fputs("</text>\n", f);
  }
  fputs("</svg>\n", f);
#undef PX
#undef PY
}

int main(int argc, char **argv) {
  const char *out = NULL, *title = "loss";
  curve_t cs[16];
  int nc = 0;
  memset(cs, 0, sizeof cs);
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--title") == 0) {
      if (i + 1 >= argc || argv[i + 1][0] == '\0') {
        fprintf(stderr, "hvd-plot: %s needs a value\n", argv[i]);
        return 2;
      }
      if (argv[i][1] == 'o')
        out = argv[++i];
      else
        title = argv[++i];
    } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
      fprintf(stderr, "hvd-plot: unknown option '%s' (try --help)\n", argv[i]);
      return 2;
    } else if (nc == (int)(sizeof cs / sizeof *cs)) {
      fprintf(stderr, "hvd-plot: at most %d logs\n", nc);
      return 2;
    } else {
      cs[nc++].path = argv[i];
    }
  }
  if (nc == 0) {
    usage(stderr);
    return 2;
  }
  for (int k = 0; k < nc; k++)
    if (read_log(&cs[k]) != 0)
      return 1;
  char def[4096], tmp[4200];
  if (out == NULL) { /* LOG.jsonl -> LOG.svg */
    snprintf(def, sizeof def, "%s", cs[0].path);
    char *dot = strrchr(def, '.'), *slash = strrchr(def, '/');
    if (dot != NULL && (slash == NULL || dot > slash))
      *dot = '\0';
    strncat(def, ".svg", sizeof def - strlen(def) - 1);
    out = def;
  }
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", out, (long)getpid());
  FILE *f = fopen(tmp, "w");
  if (f == NULL) {
    fprintf(stderr, "hvd-plot: cannot create '%s': %s\n", tmp, strerror(errno));
    return 1;
  }
  svg(f, cs, nc, title);
  if (fflush(f) != 0 || fsync(fileno(f)) != 0 || fclose(f) != 0 ||
      rename(tmp, out) != 0) {
    fprintf(stderr, "hvd-plot: cannot write '%s': %s\n", out, strerror(errno));
    unlink(tmp);
    return 1;
  }
  for (int k = 0; k < nc; k++) {
    char spark[200];
    sparkline(&cs[k], spark, sizeof spark);
    printf("%s: %zu steps, loss %.4g at step %g to %.4g at step %g  %s\n",
           cs[k].path, cs[k].n, cs[k].loss[0], cs[k].step[0],
           cs[k].loss[cs[k].n - 1], cs[k].step[cs[k].n - 1], spark);
    free(cs[k].step);
    free(cs[k].loss);
  }
  printf("hvd-plot: wrote %s\n", out);
  return 0;
}
