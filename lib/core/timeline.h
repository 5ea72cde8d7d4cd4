/*
 * timeline.h - a Chrome-trace / Perfetto JSON timeline (HVD_TIMELINE). One
 * track per tensor: NEGOTIATE (submission to agreement, with each rank's
 * ready time), QUEUE (agreement to execution), MEMCPY_IN / MEMCPY_OUT
 * (fusion chunk copies), ALLREDUCE etc. (the collective); plus a CYCLE
 * track marking the start of every cycle that had work. The file is a
 * valid JSON array after every flush: the closing bracket is written with
 * the events, in one pwrite, and the next events overwrite it (a pipe,
 * FIFO or terminal, which has no place to write at, gets the events in
 * order and the bracket once, at close). Written by
 * the engine thread, and by the program's marks (a mutex per file); a file
 * stops at its cap (HVD_TIMELINE_MAX_BYTES, 0 or at least
 * HVD__TIMELINE_MIN_BYTES) with one TIMELINE_CAP event, or at a failed
 * write (cut back to its last whole event, one warning).
 */
#ifndef HVD_CORE_TIMELINE_H
#define HVD_CORE_TIMELINE_H

#include <mpi.h>
#include <stdint.h>

#include "internal.h"

typedef struct hvd__timeline hvd__timeline_t;

/* Opens path for writing (truncating) and writes its first events. `epoch`
 * is the aligned clock's zero on this rank (hvd__now() units). NULL with
 * the message set on failure: HVD_ERR_IO (cannot open or write),
 * HVD_ERR_INVALID_ARG (a cap, not 0, under HVD__TIMELINE_MIN_BYTES). */
hvd__timeline_t *hvd__timeline_open(const char *path, int rank, double epoch,
                                    uint64_t cap);
/* Flushes, closes the array, closes the file. Accepts NULL. */
void hvd__timeline_close(hvd__timeline_t *t);

/* A complete event on the track of `tensor`, from t0 to t1 (hvd__now()
 * units). args is a JSON object body without braces, or NULL. */
void hvd__timeline_span(hvd__timeline_t *t, const char *tensor,
                        const char *phase, double t0, double t1,
                        const char *args);
/* An instant event `name` at `at` on the track `track_name` (a tensor's,
 * or the program's "USER"); args as for spans. */
void hvd__timeline_instant(hvd__timeline_t *t, const char *track_name,
                           const char *name, double at, const char *args);
/* A counter event (Chrome's "C": a graph of value over time). */
void hvd__timeline_counter(hvd__timeline_t *t, const char *name, double at,
                           double value);
/* An instant event on the CYCLE track. */
void hvd__timeline_cycle(hvd__timeline_t *t, double at, long cycle);
/* Writes buffered events and re-closes the array if more than `period`
 * seconds passed since the last flush (0: always). */
void hvd__timeline_flush(hvd__timeline_t *t, double period);

/* "path" with ".<rank>" inserted before the extension ("tl.json" ->
 * "tl.1.json"). */
void hvd__timeline_rank_path(const char *path, int rank, char *out, size_t n);
/* The file a rank writes for HVD_TIMELINE path: path itself, or with
 * all_ranks its hvd__timeline_rank_path. */
void hvd__timeline_file_of(const char *path, int all_ranks, int rank, char *out,
                           size_t n);

/* What hvd__timeline_start sets up on every rank. */
typedef struct hvd__timeline_start {
  double epoch;       /* the aligned clock's zero (hvd__now() units) */
  int any;            /* some rank writes a timeline */
  hvd__timeline_t *t; /* this rank's file, or NULL */
} hvd__timeline_start_t;

/* Collective over comm: the aligned clock (every rank leaves a barrier at
 * about the same moment and takes that as zero) and the timeline files of
 * HVD_TIMELINE `path` (rank 0's, or with all_ranks every rank's
 * hvd__timeline_rank_path). Every rank fails together (HVD_ERR_IO) when
 * one could not open its file, naming the first that failed and the file;
 * then out->t is NULL. */
hvd_result_t hvd__timeline_start(MPI_Comm comm, int rank, int size,
                                 const char *path, int all_ranks, uint64_t cap,
                                 hvd__timeline_start_t *out);

#endif /* HVD_CORE_TIMELINE_H */
