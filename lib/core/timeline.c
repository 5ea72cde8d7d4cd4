/* timeline.c - buffered Chrome-trace JSON writer. */
#include "core/timeline.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/json.h"
#include "base/log.h"
#include "base/settings.h"
#include "base/table.h"

/* The buffer is flushed when an event ends past BUF_MAX, never inside one:
 * it grows to hold a longer event, so the file only ever holds whole
 * events and its closing bracket. */
#define BUF_MAX (1 << 20)
#define TAIL "\n]\n" /* closes the array after every flush */
#define TAIL_LEN (sizeof TAIL - 1)
/* What the file keeps free under HVD_TIMELINE_MAX_BYTES for the
 * TIMELINE_CAP event (under 160 bytes at any pid, time and cap) and TAIL,
 * so that it never passes the cap: "[" and these fit in the smallest cap
 * the setting takes. */
#define CAP_ROOM 256
_Static_assert(1 + CAP_ROOM <= HVD__TIMELINE_MIN_BYTES,
               "the smallest cap holds '[', TIMELINE_CAP and TAIL");

struct hvd__timeline {
  pthread_mutex_t mu; /* the engine thread and the callers' marks */
  int fd;
  int rank;
  uint64_t written, cap; /* bytes in the file, TAIL aside; the cap (0: none) */
  int capped;            /* the cap was reached: nothing more is written */
  int failed;            /* a write failed: nothing more is written */
  int stream; /* a pipe, FIFO or terminal: events in order, TAIL at close */
  const char *path;
  double epoch, last_flush;
  char *buf;
  size_t len, size;   /* bytes in buf; its size, TAIL's room aside */
  size_t start;       /* where the event being put began in buf */
  int start_any;      /* any, when it began */
  int lost;           /* the event being put did not fit in memory */
  int any;            /* an event has been written: next needs a comma */
  hvd__table_t *tids; /* tensor -> track id */
  int next_tid;
};

static void flush_locked(hvd__timeline_t *t, double period);
static int write_buf(hvd__timeline_t *t);

/* Puts n bytes of the current event in the buffer, which grows for an
 * event longer than it (a name of megabytes). */
static void put(hvd__timeline_t *t, const char *s, size_t n) {
  if (t->lost)
    return;
  if (t->len + n > t->size) {
    size_t size = t->size * 2 > t->len + n ? t->size * 2 : t->len + n;
    char *buf = realloc(t->buf, size + TAIL_LEN);
    if (buf == NULL) {
      t->lost = 1; /* end_event drops the event */
      return;
    }
    t->buf = buf;
    t->size = size;
  }
  memcpy(t->buf + t->len, s, n);
  t->len += n;
}
static void put_str(hvd__timeline_t *t, const char *s) { put(t, s, strlen(s)); }

static void putf(hvd__timeline_t *t, const char *fmt, ...) HVD__PRINTF(2, 3);
static void putf(hvd__timeline_t *t, const char *fmt, ...) {
  char tmp[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n > 0)
    put(t, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static void put_fn(void *t, const char *p, size_t n) { put(t, p, n); }

/* The body of a JSON string (base/json.h). */
static void put_escaped(hvd__timeline_t *t, const char *s) {
  hvd__json_escape(s, put_fn, t);
}

static void begin_event(hvd__timeline_t *t) {
  t->start = t->len;
  t->start_any = t->any;
  put_str(t, t->any ? ",\n" : "\n");
  t->any = 1;
}

/* The event's args (a JSON object body, or NULL) and its closing brace. */
static void put_args(hvd__timeline_t *t, const char *args) {
  if (args != NULL) {
    put_str(t, ",\"args\":{");
    put_str(t, args);
    put_str(t, "}");
  }
  put_str(t, "}");
}

/* The cap is reached (lock held): a TIMELINE_CAP instant saying so, then
 * the array closed for good. */
static void cap_reached(hvd__timeline_t *t) {
  t->capped = 1;
  begin_event(t);
  putf(t,
       "{\"name\":\"TIMELINE_CAP\",\"ph\":\"i\",\"s\":\"g\",\"pid\":%d,"
       "\"ts\":%.3f,\"args\":{\"max_bytes\":%llu}}",
       t->rank, (hvd__now() - t->epoch) * 1e6, (unsigned long long)t->cap);
  flush_locked(t, 0);
  if (!t->failed)
    HVD__LOG(HVD__LOG_WARNING,
             "timeline: %s reached HVD_TIMELINE_MAX_BYTES (%llu bytes); "
             "nothing more is written to it",
             t->path, (unsigned long long)t->cap);
}

/* The event put since begin_event is whole (lock held). It is kept if the
 * file has room for it and still CAP_ROOM under the cap; else it is taken
 * back and the cap is reached, so the file never passes the cap. A full
 * buffer is flushed here, between events. */
static void end_event(hvd__timeline_t *t) {
  /* out of memory: this event alone is dropped; after the cap or a failed
   * write (an event put after a track's name reached the cap): all are */
  if (t->lost || t->capped || t->failed) {
    t->lost = 0;
    t->len = t->start;
    t->any = t->start_any;
    return;
  }
  if (t->cap != 0 && t->written + t->len + CAP_ROOM > t->cap) {
    t->len = t->start;
    t->any = t->start_any;
    cap_reached(t);
    return;
  }
  if (t->len >= BUF_MAX)
    flush_locked(t, 0);
}

/* 1 when an event may be written (lock held): the cap is not reached and
 * no write failed. */
static int room(hvd__timeline_t *t) { return !t->capped && !t->failed; }

/* A new timeline's state, its file not open yet; NULL when out of memory. */
static hvd__timeline_t *alloc_timeline(const char *path) {
  hvd__timeline_t *t = calloc(1, sizeof *t);
  if (t == NULL)
    return NULL;
  t->fd = -1;
  t->size = BUF_MAX;
  t->buf = malloc(BUF_MAX + TAIL_LEN);
  t->tids = hvd__table_create();
  t->path = strdup(path);
  if (t->buf == NULL || t->tids == NULL || t->path == NULL) {
    free(t->buf);
    hvd__table_destroy(t->tids);
    free((char *)t->path);
    free(t);
    return NULL;
  }
  pthread_mutex_init(&t->mu, NULL);
  return t;
}

static void free_timeline(hvd__timeline_t *t) {
  free(t->buf);
  hvd__table_destroy(t->tids);
  free((char *)t->path);
  pthread_mutex_destroy(&t->mu);
  free(t);
}

/* The array's "[" and the names of the process and of its CYCLE track,
 * written: 0, or the errno of the write (the caller's error). */
static int put_header(hvd__timeline_t *t) {
  t->buf[0] = '[';
  t->len = 1;
  begin_event(t);
  putf(t,
       "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":"
       "\"hvd rank %d\"}}",
       t->rank, t->rank);
  end_event(t);
  begin_event(t);
  putf(t,
       "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{"
       "\"name\":\"CYCLE\"}}",
       t->rank);
  end_event(t);
  return t->failed ? t->failed : write_buf(t);
}

hvd__timeline_t *hvd__timeline_open(const char *path, int rank, double epoch,
                                    uint64_t cap) {
  if (cap != 0 && cap < HVD__TIMELINE_MIN_BYTES) {
    hvd__set_error(HVD_ERR_INVALID_ARG,
                   "HVD_TIMELINE: a cap of %llu bytes is below the smallest "
                   "timeline (%d bytes)",
                   (unsigned long long)cap, HVD__TIMELINE_MIN_BYTES);
    return NULL;
  }
  hvd__timeline_t *t = alloc_timeline(path);
  if (t == NULL) {
    hvd__set_error(HVD_ERR_NO_MEMORY, "timeline");
    return NULL;
  }
  t->cap = cap;
  t->rank = rank;
  t->epoch = epoch;
  t->last_flush = hvd__now();
  t->next_tid = 1; /* track 0 is CYCLE */
  int err = 0;
  t->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  struct stat st;
  t->stream = t->fd >= 0 && fstat(t->fd, &st) == 0 && !S_ISREG(st.st_mode);
  if (t->fd < 0 || (err = put_header(t)) != 0) {
    if (t->fd < 0)
      err = errno;
    hvd__set_error(HVD_ERR_IO, "HVD_TIMELINE: cannot %s '%s': %s",
                   t->fd < 0 ? "open" : "write", path, strerror(err));
    if (t->fd >= 0)
      close(t->fd);
    free_timeline(t);
    return NULL;
  }
  return t;
}

static int track(hvd__timeline_t *t, const char *tensor) {
  intptr_t v = (intptr_t)hvd__table_get(t->tids, tensor);
  if (v != 0)
    return (int)v;
  int tid = t->next_tid++;
  hvd__table_put(t->tids, tensor, (void *)(intptr_t)tid);
  begin_event(t);
  putf(t, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,",
       t->rank, tid);
  put_str(t, "\"args\":{\"name\":\"");
  put_escaped(t, tensor);
  put_str(t, "\"}}");
  end_event(t);
  return tid;
}

void hvd__timeline_span(hvd__timeline_t *t, const char *tensor,
                        const char *phase, double t0, double t1,
                        const char *args) {
  if (t == NULL)
    return;
  pthread_mutex_lock(&t->mu);
  if (!room(t)) {
    pthread_mutex_unlock(&t->mu);
    return;
  }
  int tid = track(t, tensor);
  begin_event(t);
  putf(t,
       "{\"name\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,"
       "\"dur\":%.3f",
       phase, t->rank, tid, (t0 - t->epoch) * 1e6,
       (t1 > t0 ? t1 - t0 : 0) * 1e6);
  put_args(t, args);
  end_event(t);
  pthread_mutex_unlock(&t->mu);
}

void hvd__timeline_instant(hvd__timeline_t *t, const char *track_name,
                           const char *name, double at, const char *args) {
  if (t == NULL)
    return;
  pthread_mutex_lock(&t->mu);
  if (room(t)) {
    int tid = track(t, track_name);
    begin_event(t);
    put_str(t, "{\"name\":\"");
    put_escaped(t, name);
    putf(t, "\",\"ph\":\"i\",\"s\":\"t\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f",
         t->rank, tid, (at - t->epoch) * 1e6);
    put_args(t, args);
    end_event(t);
  }
  pthread_mutex_unlock(&t->mu);
}

void hvd__timeline_counter(hvd__timeline_t *t, const char *name, double at,
                           double value) {
  if (t == NULL)
    return;
  pthread_mutex_lock(&t->mu);
  if (room(t)) {
    begin_event(t);
    put_str(t, "{\"name\":\"");
    put_escaped(t, name);
    putf(t,
         "\",\"ph\":\"C\",\"pid\":%d,\"ts\":%.3f,\"args\":{\"value\":%.17g}}",
         t->rank, (at - t->epoch) * 1e6, isfinite(value) ? value : 0.0);
    end_event(t);
  }
  pthread_mutex_unlock(&t->mu);
}

void hvd__timeline_cycle(hvd__timeline_t *t, double at, long cycle) {
  if (t == NULL)
    return;
  pthread_mutex_lock(&t->mu);
  if (room(t)) {
    begin_event(t);
    putf(t,
         "{\"name\":\"CYCLE_START\",\"ph\":\"i\",\"s\":\"t\",\"pid\":%d,"
         "\"tid\":0,\"ts\":%.3f,\"args\":{\"cycle\":%ld}}",
         t->rank, (at - t->epoch) * 1e6, cycle);
    end_event(t);
  }
  pthread_mutex_unlock(&t->mu);
}

/* n bytes at off (where the file has no place, a pipe's or a
 * terminal's: next), in as many writes as the file takes (one, unless a
 * signal or a full disk cuts it short): 0 or an errno. */
static int write_at(const hvd__timeline_t *t, const char *p, size_t n,
                    uint64_t off) {
  while (n > 0) {
    ssize_t k =
        t->stream ? write(t->fd, p, n) : pwrite(t->fd, p, n, (off_t)off);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      return k < 0 ? errno : EIO;
    p += k;
    n -= (size_t)k;
    off += (uint64_t)k;
  }
  return 0;
}

/* A flush failed with err (lock held): the file is taken back to its last
 * whole event and TAIL, where the failed write began (TAIL first, into the
 * blocks the file had, then the bytes past it cut), and nothing more is
 * written to it. One warning. */
static void write_failed(hvd__timeline_t *t, int err) {
  t->failed = err;
  t->len = 0;
  t->start = 0;
  if (t->written > 0 || t->stream)
    (void)write_at(t, TAIL, TAIL_LEN, t->written);
  if (!t->stream)
    (void)!ftruncate(t->fd,
                     (off_t)(t->written > 0 ? t->written + TAIL_LEN : 0));
  HVD__LOG(HVD__LOG_WARNING,
           "timeline: cannot write '%s': %s; it ends at its last whole "
           "event and nothing more is written to it",
           t->path, strerror(err));
}

/* Writes the buffer (whole events) and TAIL at the file's end, over the
 * last flush's TAIL, in one pwrite (write_at), so the file is valid JSON
 * after it: stdio wrote a buffer longer than its own in two writes, with
 * half of a flush in the file between them. (A signal that kills the
 * process inside a long pwrite can still cut it short.) A stream gets the
 * events alone, and TAIL once, at close. 0 or an errno. */
static int write_buf(hvd__timeline_t *t) {
  memcpy(t->buf + t->len, TAIL, TAIL_LEN);
  int err =
      write_at(t, t->buf, t->len + (t->stream ? 0 : TAIL_LEN), t->written);
  if (err != 0)
    return err;
  t->written += t->len;
  t->len = 0;
  t->start = 0;
  if (t->size > BUF_MAX) { /* back from a long event */
    char *buf = realloc(t->buf, BUF_MAX + TAIL_LEN);
    if (buf != NULL) {
      t->buf = buf;
      t->size = BUF_MAX;
    }
  }
  return 0;
}

static void flush_locked(hvd__timeline_t *t, double period) {
  double now = hvd__now();
  if (t->failed)
    return;
  if (period > 0 && now - t->last_flush < period && t->len < BUF_MAX / 2)
    return;
  t->last_flush = now;
  int err = write_buf(t);
  if (err != 0)
    write_failed(t, err);
}

void hvd__timeline_flush(hvd__timeline_t *t, double period) {
  if (t == NULL)
    return;
  pthread_mutex_lock(&t->mu);
  flush_locked(t, period);
  pthread_mutex_unlock(&t->mu);
}

void hvd__timeline_close(hvd__timeline_t *t) {
  if (t == NULL)
    return;
  hvd__timeline_flush(t, 0);
  if (t->stream && !t->failed)
    (void)write_at(t, TAIL, TAIL_LEN, 0);
  if (close(t->fd) != 0 && !t->failed) /* a network filesystem's late error */
    HVD__LOG(HVD__LOG_WARNING, "timeline: cannot close '%s': %s", t->path,
             strerror(errno));
  free_timeline(t);
}

void hvd__timeline_rank_path(const char *path, int rank, char *out, size_t n) {
  const char *slash = strrchr(path, '/');
  const char *dot = strrchr(path, '.');
  if (dot == NULL || (slash != NULL && dot < slash) || dot == path)
    snprintf(out, n, "%s.%d", path, rank);
  else
    snprintf(out, n, "%.*s.%d%s", (int)(dot - path), path, rank, dot);
}

void hvd__timeline_file_of(const char *path, int all_ranks, int rank, char *out,
                           size_t n) {
  if (all_ranks)
    hvd__timeline_rank_path(path, rank, out, n);
  else
    snprintf(out, n, "%s", path);
}

hvd_result_t hvd__timeline_start(MPI_Comm comm, int rank, int size,
                                 const char *path, int all_ranks, uint64_t cap,
                                 hvd__timeline_start_t *out) {
  hvd_result_t rc = HVD_SUCCESS;
  char file[HVD__PATH_MAX + 16];
  int here = path[0] != '\0' && (rank == 0 || all_ranks);
  memset(out, 0, sizeof *out);
  HVD__MPI_CHECK(MPI_Allreduce(&here, &out->any, 1, MPI_INT, MPI_MAX, comm));
  HVD__MPI_CHECK(MPI_Barrier(comm));
  out->epoch = hvd__now();
  if (here) {
    hvd__timeline_file_of(path, all_ranks, rank, file, sizeof file);
    out->t = hvd__timeline_open(file, rank, out->epoch, cap);
  }
  int bad = here && out->t == NULL ? rank : size, first_bad = 0;
  HVD__MPI_CHECK(MPI_Allreduce(&bad, &first_bad, 1, MPI_INT, MPI_MIN, comm));
  if (first_bad < size) {
    hvd__timeline_file_of(path, all_ranks, first_bad, file, sizeof file);
    if (bad != rank) /* the failing rank's own message stands */
      hvd__set_error(HVD_ERR_IO, "HVD_TIMELINE: rank %d cannot open '%s'",
                     first_bad, file);
    rc = HVD_ERR_IO;
  }
fail:
  if (rc != HVD_SUCCESS) {
    hvd__timeline_close(out->t);
    out->t = NULL;
  }
  return rc;
}
