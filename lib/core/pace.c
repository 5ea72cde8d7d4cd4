/* pace.c - when the engine's next cycle starts (see pace.h). */
#include "core/pace.h"

#include "base/wait.h"
#include "internal.h"

static const double backoff_min = 50e-6;
static const int idle_max = 16;

void hvd__pace_init(hvd__pace_t *p, double cycle, double now) {
  *p = (hvd__pace_t){backoff_min, 1, now, now + cycle};
}

void hvd__pace_deadline(hvd__pace_t *p, double cycle, size_t inflight,
                        int callers_waiting) {
  if (inflight == 0) { /* idle: p->idle cycle times */
    p->next = p->settled + p->idle * cycle;
    return;
  }
  double cap = callers_waiting ? 0 : cycle;
  double soon = hvd__now() + (p->backoff < cap ? p->backoff : cap);
  if (soon < p->next)
    p->next = soon;
}

void hvd__pace_poked(hvd__pace_t *p) { p->backoff = backoff_min; }

void hvd__pace_start(hvd__pace_t *p, double cycle, double now) {
  p->next = now + cycle;
}

void hvd__pace_end(hvd__pace_t *p, int progress, double settled) {
  p->backoff = progress ? backoff_min : 2 * p->backoff;
  p->idle = progress ? 1 : p->idle < idle_max ? 2 * p->idle : idle_max;
  p->settled = settled;
}
