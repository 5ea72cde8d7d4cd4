/*
 * nccl.c - the host stand-in for NCCL (standin.h): communicators of any
 * ranks of MPI_COMM_WORLD in any order, blocking or non-blocking, whose
 * collectives move host bytes ("device memory" of the stand-in's cudart.c)
 * with MPI point-to-point messages on MPI_COMM_WORLD, under tags of their
 * own (three per communicator, from its ncclUniqueId), so they never meet
 * the program's own MPI traffic (hvd's communicators are duplicates;
 * collective traffic never matches point-to-point).
 *  - As NCCL's bootstrap: the unique id holds the world rank of the
 *    process that made it (the root); at init every member sends the root
 *    its communicator rank and world rank, and the root sends every member
 *    the table, which maps communicator ranks to world ranks from then on.
 *
 *  - Every call checks what NCCL needs: a live communicator, buffers of
 *    device memory on the communicator's device holding count elements, a
 *    stream of that device, a state that allows the call. A communicator
 *    used while its state is ncclInProgress, one destroyed while it still
 *    works, or ranks that disagree on a collective (each message carries
 *    the operation, type, count, root and a per-pair sequence number) end
 *    the process with a message.
 *  - The exchange happens at the call, or at ncclGroupEnd for grouped
 *    calls: every message posted, then waited for (MPI_Test, naps). The
 *    results are then written, so the work is complete when the call
 *    returns; events on the stream still answer cudaErrorNotReady a few
 *    times (cudart.c).
 *  - Blocking communicators return ncclSuccess. Non-blocking ones return
 *    ncclInProgress from ncclCommInitRankConfig, from every collective
 *    outside a group, from ncclGroupEnd and from ncclCommFinalize, and
 *    ncclCommGetAsyncError says ncclInProgress HVD_STANDIN_POLLS times
 *    before the state becomes ncclSuccess (or the injected error).
 *  - Faults (standin.h): the faulty rank still does its part of the MPI
 *    exchange, so its peers finish that collective. A communicator that
 *    is aborted sends each peer a notice saying how many messages it had
 *    sent that peer and taken from it. A peer's exchange that needs more
 *    of it than that (a later collective) is given up and its stream never
 *    finishes, as a real collective whose peer is gone: hvd's
 *    HVD_NCCL_TIMEOUT ends it. One that needs no more finishes, whether
 *    the notice came before, during or after it: what a peer that did its
 *    part leaves behind does not depend on when its notice is read.
 */
#include <config.h>

#include <mpi.h>
#include <nccl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ops/reduce.h"
#include "standin.h"

#define COMM_MAGIC 0x4e43434c434f4d4dull /* "NCCLCOMM" */
#define ID_MAGIC "hvd-standin-nccl"

/* ---- errors --------------------------------------------------------- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER; /* registry, last */
static char last_error[512];

/* Sets what ncclGetLastError says, and returns r. */
static ncclResult_t set_last(ncclResult_t r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static ncclResult_t set_last(ncclResult_t r, const char *fmt, ...) {
  va_list ap;
  pthread_mutex_lock(&mu);
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  pthread_mutex_unlock(&mu);
  return r;
}

const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm; /* as NCCL: the process's last message, whatever comm */
  return last_error;
}

const char *ncclGetErrorString(ncclResult_t result) {
  switch (result) { /* NCCL 2.28's words */
  case ncclSuccess:
    return "no error";
  case ncclUnhandledCudaError:
    return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
  case ncclSystemError:
    return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
  case ncclInternalError:
    return "internal error - please report this issue to the NCCL developers";
  case ncclInvalidArgument:
    return "invalid argument (run with NCCL_DEBUG=WARN for details)";
  case ncclInvalidUsage:
    return "invalid usage (run with NCCL_DEBUG=WARN for details)";
  case ncclRemoteError:
    return "remote process exited or there was a network error";
  case ncclInProgress:
    return "NCCL operation in progress";
  default:
    return "unknown result code";
  }
}

ncclResult_t ncclGetVersion(int *version) {
  if (version == NULL)
    return set_last(ncclInvalidArgument, "stand-in: ncclGetVersion(NULL)");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- communicators -------------------------------------------------- */

struct ncclComm {
  uint64_t magic;
  struct ncclComm *next; /* the registry of live communicators */
  unsigned long serial;  /* never reused; streams wait on it */
  int rank, size, dev, blocking;
  int *world;              /* communicator rank -> MPI_COMM_WORLD rank */
  uint64_t id;             /* the unique id's hash: alike on every rank */
  long exchanges;          /* begun so far (the order check) */
  int tag;                 /* data; tag + 1: abort notices; tag + 2: boot */
  ncclResult_t state;      /* what ncclCommGetAsyncError says */
  ncclResult_t next_state; /* after polls_left more polls (InProgress: never) */
  int polls_left;
  long calls;                /* communication calls so far */
  long async_at, hang_at;    /* the faults: at call number N+1; -1 none */
  ncclResult_t async_result; /* ncclRemoteError or ncclSystemError */
  int hanging;               /* its work never finishes (mu) */
  int busy;                  /* a thread is in an exchange on it (mu) */
  int gone;                  /* rank + 1 of the first peer that aborted */
  int finalized;
  int watch;                /* notes posted: wait_all watches them */
  int64_t *sent, *received; /* messages per peer (sequence numbers) */
  int64_t *taken;           /* from each peer, in exchanges that finished */
  MPI_Request *notes;       /* abort notices from each peer */
  int64_t *note_in;         /* per peer: [sent to us, taken from us] */
  unsigned char *left;      /* per peer: its notice came */
};

static struct ncclComm *registry;
static unsigned long serials;
static int last_blocking = -1;

int standin_nccl_last_blocking(void) {
  pthread_mutex_lock(&mu);
  int b = last_blocking;
  pthread_mutex_unlock(&mu);
  return b;
}

int standin_nccl_hanging(unsigned long serial) {
  int h = 0;
  pthread_mutex_lock(&mu);
  for (struct ncclComm *c = registry; c != NULL; c = c->next)
    if (c->serial == serial)
      h = c->hanging;
  pthread_mutex_unlock(&mu);
  return h;
}

/* Dies unless comm is live. */
static void need_comm(ncclComm_t comm, const char *who) {
  int found = 0;
  pthread_mutex_lock(&mu);
  for (struct ncclComm *c = registry; c != NULL && !found; c = c->next)
    found = c == comm;
  pthread_mutex_unlock(&mu);
  if (!found)
    standin_die("%s: communicator %p is not live (never made, or destroyed "
                "or aborted already)",
                who, (void *)comm);
}

static void set_hanging(ncclComm_t comm) {
  pthread_mutex_lock(&mu);
  comm->hanging = 1;
  pthread_mutex_unlock(&mu);
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
  static unsigned long made;
  if (uniqueId == NULL)
    return set_last(ncclInvalidArgument, "stand-in: ncclGetUniqueId(NULL)");
  memset(uniqueId, 0, sizeof *uniqueId);
  pthread_mutex_lock(&mu);
  unsigned long k = ++made;
  pthread_mutex_unlock(&mu);
  int initialized = 0, wrank = 0;
  MPI_Initialized(&initialized);
  if (!initialized)
    standin_die("ncclGetUniqueId: MPI is not initialised (the stand-in runs "
                "NCCL over MPI)");
  MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
  snprintf(uniqueId->internal, sizeof uniqueId->internal, "%s %ld %lu root %d",
           ID_MAGIC, (long)getpid(), k, wrank);
  return ncclSuccess;
}

/* The world rank of the process that made the id. */
static int id_root(const ncclUniqueId *id) {
  const char *p = strstr(id->internal, " root ");
  if (p == NULL)
    standin_die("ncclCommInitRank: a unique id without its root");
  return atoi(p + 6);
}

/* The bootstrap (see the top): fills comm->world. */
static void bootstrap(ncclComm_t comm, uint64_t id, int root) {
  int wrank = 0, n = comm->size;
  MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
  int mine[3] = {(int)(id & 0x7fffffff), comm->rank, wrank};
  if (wrank != root) {
    MPI_Send(mine, 3, MPI_INT, root, comm->tag + 2, MPI_COMM_WORLD);
    MPI_Recv(comm->world, n, MPI_INT, root, comm->tag + 2, MPI_COMM_WORLD,
             MPI_STATUS_IGNORE);
    if (comm->world[comm->rank] != wrank)
      standin_die("ncclCommInitRank: the root's table puts rank %d at world "
                  "rank %d, not %d",
                  comm->rank, comm->world[comm->rank], wrank);
    return;
  }
  for (int q = 0; q < n; q++)
    comm->world[q] = -1;
  comm->world[comm->rank] = wrank;
  for (int k = 1; k < n; k++) {
    int got[3];
    MPI_Recv(got, 3, MPI_INT, MPI_ANY_SOURCE, comm->tag + 2, MPI_COMM_WORLD,
             MPI_STATUS_IGNORE);
    if (got[0] != mine[0] || got[1] < 0 || got[1] >= n ||
        comm->world[got[1]] != -1)
      standin_die("ncclCommInitRank on world rank %d (the root): world rank "
                  "%d says it is rank %d of another or the same place (ids "
                  "%d, %d)",
                  wrank, got[2], got[1], got[0], mine[0]);
    comm->world[got[1]] = got[2];
  }
  for (int q = 0; q < n; q++)
    if (q != comm->rank)
      MPI_Send(comm->world, n, MPI_INT, comm->world[q], comm->tag + 2,
               MPI_COMM_WORLD);
}

/* FNV-1a of the id. */
static uint64_t id_hash(const ncclUniqueId *id) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < sizeof id->internal; i++)
    h = (h ^ (unsigned char)id->internal[i]) * 0x100000001b3ull;
  return h;
}

/* "R:N[:kind]" of a fault for this rank: N, or -1 when the fault is not
 * for this rank (or unset). */
static long fault_at(const char *name, int rank, ncclResult_t *kind) {
  const char *v = getenv(name);
  if (v == NULL || v[0] == '\0')
    return -1;
  char *end;
  long r = strtol(v, &end, 10), n = -1;
  if (end != v && *end == ':') {
    const char *p = end + 1;
    n = strtol(p, &end, 10);
    if (end == p)
      n = -1;
  }
  if (n < 0 || r < 0)
    standin_die("%s='%s' is not RANK:CALLS", name, v);
  if (kind != NULL) {
    if (strcmp(end, "") == 0 || strcmp(end, ":remote") == 0)
      *kind = ncclRemoteError;
    else if (strcmp(end, ":system") == 0)
      *kind = ncclSystemError;
    else
      standin_die("%s='%s': after RANK:CALLS only :remote or :system", name, v);
  } else if (*end != '\0') {
    standin_die("%s='%s' is not RANK:CALLS", name, v);
  }
  return r == rank ? n : -1;
}

struct msg;
static int all_covered(ncclComm_t comm, const struct msg *m, int n);

/* Reads the abort notices that came (comm->left, comm->gone). */
static void read_notes(ncclComm_t comm) {
  while (comm->watch) {
    int idx = MPI_UNDEFINED, flag = 0;
    MPI_Testany(comm->size, comm->notes, &idx, &flag, MPI_STATUS_IGNORE);
    if (!flag || idx == MPI_UNDEFINED)
      return;
    comm->left[idx] = 1;
    if (comm->gone == 0)
      comm->gone = idx + 1;
  }
}

/* Waits for n requests (messages m, or NULL: no notices watched yet): 1
 * when every request finished, 0 when a peer that aborted never sent, or
 * never took, one of m (requests left as they are). Dies after
 * HVD_STANDIN_NCCL_PATIENCE seconds (default 60). */
static int wait_all(ncclComm_t comm, MPI_Request *reqs, int n, MPI_Status *st,
                    const char *who, const struct msg *m) {
  double t0 = now_s();
  int patience = standin_env_int("HVD_STANDIN_NCCL_PATIENCE", 60, 1000000);
  for (unsigned spin = 0;; spin++) {
    int done = 0;
    if (m != NULL) {
      read_notes(comm);
      if (comm->gone != 0 && !all_covered(comm, m, n))
        return 0;
    }
    MPI_Testall(n, reqs, &done, st);
    if (done)
      return 1;
    if (now_s() - t0 > patience)
      standin_die("%s on rank %d: no peer answered for %d s "
                  "(HVD_STANDIN_NCCL_PATIENCE): the ranks disagree on the "
                  "NCCL calls, or one stopped making them without "
                  "ncclCommAbort",
                  who, comm->rank, patience);
    if (spin > 100) {
      struct timespec ts = {0, spin > 2000 ? 1000000 : 20000};
      nanosleep(&ts, NULL);
    }
  }
}

/* What each rank tells the others at init. */
typedef struct hello {
  int rank, size;
  uint64_t id;
  char host[MPI_MAX_PROCESSOR_NAME];
  char bus[32];
} hello_t;

/* The exchange of hellos: ncclInvalidUsage when two ranks share a GPU,
 * dies when the ranks disagree on the communicator. */
static ncclResult_t hello(ncclComm_t comm, uint64_t id) {
  int n = comm->size, len = 0;
  hello_t mine, *all = calloc((size_t)n, sizeof *all);
  MPI_Request *reqs = calloc(2 * (size_t)n, sizeof *reqs);
  MPI_Status *st = calloc(2 * (size_t)n, sizeof *st);
  if (all == NULL || reqs == NULL || st == NULL)
    standin_die("out of memory");
  memset(&mine, 0, sizeof mine);
  mine.rank = comm->rank;
  mine.size = n;
  mine.id = id;
  /* NCCL's host hash: from NCCL_HOSTID when set, else the host name */
  const char *hostid = getenv("NCCL_HOSTID");
  if (hostid != NULL && hostid[0] != '\0')
    snprintf(mine.host, sizeof mine.host, "%s", hostid);
  else
    MPI_Get_processor_name(mine.host, &len);
  if (cudaDeviceGetPCIBusId(mine.bus, sizeof mine.bus, comm->dev) !=
      cudaSuccess)
    standin_die("ncclCommInitRank: no bus id for cuda:%d", comm->dev);
  all[comm->rank] = mine;
  int m = 0;
  for (int q = 0; q < n; q++)
    if (q != comm->rank) {
      MPI_Isend(&mine, (int)sizeof mine, MPI_BYTE, comm->world[q], comm->tag,
                MPI_COMM_WORLD, &reqs[m++]);
      MPI_Irecv(&all[q], (int)sizeof mine, MPI_BYTE, comm->world[q],
                comm->tag, MPI_COMM_WORLD, &reqs[m++]);
    }
  (void)wait_all(comm, reqs, m, st, "ncclCommInitRank", NULL);
  ncclResult_t r = ncclSuccess;
  for (int q = 0; q < n; q++) {
    if (all[q].rank != q || all[q].size != n || all[q].id != id)
      standin_die("ncclCommInitRank on rank %d: rank %d says it is rank %d "
                  "of %d (this rank: of %d), with %s unique id",
                  comm->rank, q, all[q].rank, all[q].size, n,
                  all[q].id == id ? "the same" : "another");
    for (int k = 0; k < q && r == ncclSuccess; k++)
      if (strcmp(all[k].host, all[q].host) == 0 &&
          strcmp(all[k].bus, all[q].bus) == 0)
        r = set_last(ncclInvalidUsage,
                     "stand-in: Duplicate GPU detected : rank %d and rank %d "
                     "both on CUDA device %s",
                     q, k, all[q].bus);
  }
  free(all);
  free(reqs);
  free(st);
  return r;
}

static void comm_free(ncclComm_t comm);

/* After an operation: its state, as the comm's kind of blocking says.
 * Returns what the call returns. */
static ncclResult_t progress(ncclComm_t comm, ncclResult_t next) {
  if (comm->blocking) {
    comm->state = next;
    return ncclSuccess;
  }
  comm->state = ncclInProgress;
  comm->next_state = next;
  comm->polls_left = standin_polls();
  return ncclInProgress;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks,
                                    ncclUniqueId commId, int rank,
                                    ncclConfig_t *config) {
  static const char who[] = "ncclCommInitRankConfig";
  int initialized = 0, wsize = 0, wrank = 0, blocking = 1, flag = 0;
  if (comm == NULL)
    return set_last(ncclInvalidArgument, "stand-in: %s: comm is NULL", who);
  *comm = NULL;
  if (config != NULL) {
    if (config->magic != 0xcafebeef || config->size != sizeof *config)
      return set_last(
          ncclInvalidArgument,
          "stand-in: %s: config not made by NCCL_CONFIG_INITIALIZER", who);
    if (config->blocking != NCCL_CONFIG_UNDEF_INT)
      blocking = config->blocking != 0;
  }
  if (strncmp(commId.internal, ID_MAGIC, strlen(ID_MAGIC)) != 0)
    return set_last(ncclInvalidArgument,
                    "stand-in: %s: the unique id was not made by "
                    "ncclGetUniqueId",
                    who);
  MPI_Initialized(&initialized);
  if (!initialized)
    standin_die("%s: MPI is not initialised (the stand-in runs NCCL over MPI)",
                who);
  MPI_Comm_size(MPI_COMM_WORLD, &wsize);
  MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
  if (nranks < 1 || nranks > wsize || rank < 0 || rank >= nranks)
    standin_die("%s: rank %d of %d, in a world of %d", who, rank, nranks,
                wsize);
  struct ncclComm *c = calloc(1, sizeof *c);
  if (c != NULL) {
    c->sent = calloc((size_t)nranks, sizeof *c->sent);
    c->received = calloc((size_t)nranks, sizeof *c->received);
    c->notes = calloc((size_t)nranks, sizeof *c->notes);
    c->taken = calloc((size_t)nranks, sizeof *c->taken);
    c->note_in = calloc(2 * (size_t)nranks, sizeof *c->note_in);
    c->left = calloc((size_t)nranks, sizeof *c->left);
    c->world = calloc((size_t)nranks, sizeof *c->world);
  }
  if (c == NULL || !c->sent || !c->received || !c->taken || !c->notes ||
      !c->note_in || !c->left || !c->world)
    standin_die("out of memory");
  uint64_t id = id_hash(&commId);
  int *ub = NULL;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  long span = (flag && *ub > 0x4000 ? *ub : 32767) - 0x3e00;
  c->magic = COMM_MAGIC;
  c->id = id;
  c->rank = rank;
  c->size = nranks;
  c->dev = standin_current_device(); /* as NCCL: the current device */
  c->blocking = blocking;
  c->tag = 0x3e00 + 3 * (int)(id % (uint64_t)(span / 3 - 1));
  c->async_at =
      fault_at("HVD_STANDIN_NCCL_ASYNC_ERROR", rank, &c->async_result);
  c->hang_at = fault_at("HVD_STANDIN_NCCL_HANG", rank, NULL);
  pthread_mutex_lock(&mu);
  c->serial = ++serials;
  c->next = registry;
  registry = c;
  last_blocking = blocking;
  pthread_mutex_unlock(&mu);

  /* every rank does its part of the exchange, the faulty one too */
  bootstrap(c, id, id_root(&commId));
  ncclResult_t r = hello(c, id);
  for (int q = 0; q < nranks; q++)
    if (q == rank)
      c->notes[q] = MPI_REQUEST_NULL;
    else
      MPI_Irecv(&c->note_in[2 * q], 2, MPI_INT64_T, c->world[q], c->tag + 1,
                MPI_COMM_WORLD, &c->notes[q]);
  c->watch = 1;
  /* the ranks these faults are for; -1 when unset */
  int hang = standin_env_int("HVD_STANDIN_NCCL_INIT_HANG", -1, 1 << 20);
  int fail_rank = standin_env_int("HVD_STANDIN_NCCL_INIT_FAIL", -1, 1 << 20);
  if (r == ncclSuccess && fail_rank == rank)
    r = set_last(ncclSystemError,
                 "stand-in: %s failed on rank %d as asked "
                 "(HVD_STANDIN_NCCL_INIT_FAIL=%d)",
                 config != NULL ? who : "ncclCommInitRank", rank, rank);
  *comm = c;
  if (blocking) {
    if (hang == rank)
      standin_die("HVD_STANDIN_NCCL_INIT_HANG=%d on a blocking communicator: "
                  "ncclCommInitRank would never return on rank %d",
                  rank, rank);
    c->state = r;
    if (r != ncclSuccess) { /* NCCL frees a communicator that failed */
      *comm = NULL;
      comm_free(c);
    }
    return r;
  }
  (void)progress(c, r);
  if (hang == rank)
    c->next_state = ncclInProgress; /* never finishes */
  return ncclInProgress;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId,
                              int rank) {
  return ncclCommInitRankConfig(comm, nranks, commId, rank, NULL);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  need_comm(comm, "ncclCommGetAsyncError");
  if (asyncError == NULL)
    return set_last(ncclInvalidArgument,
                    "stand-in: ncclCommGetAsyncError: asyncError is NULL");
  if (comm->state == ncclInProgress && comm->next_state != ncclInProgress) {
    if (comm->polls_left > 0)
      comm->polls_left--;
    else
      comm->state = comm->next_state;
  }
  *asyncError = comm->state;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  need_comm(comm, "ncclCommCount");
  *count = comm->size;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  need_comm(comm, "ncclCommUserRank");
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
  need_comm(comm, "ncclCommCuDevice");
  *device = comm->dev;
  return ncclSuccess;
}

/* Leaves the registry: cancels the notices still awaited. */
static void comm_free(ncclComm_t comm) {
  pthread_mutex_lock(&mu);
  for (struct ncclComm **p = &registry; *p != NULL; p = &(*p)->next)
    if (*p == comm) {
      *p = comm->next;
      break;
    }
  pthread_mutex_unlock(&mu);
  for (int q = 0; q < comm->size && comm->watch; q++)
    if (comm->notes[q] != MPI_REQUEST_NULL) {
      MPI_Cancel(&comm->notes[q]);
      MPI_Wait(&comm->notes[q], MPI_STATUS_IGNORE);
    }
  free(comm->sent);
  free(comm->received);
  free(comm->taken);
  free(comm->notes);
  free(comm->note_in);
  free(comm->left);
  free(comm->world);
  comm->magic = 0;
  free(comm);
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == NULL)
    return ncclSuccess;
  need_comm(comm, "ncclCommAbort");
  /* tell the peers what they had from us and we from them (eager
   * messages; nobody waits for them here) */
  for (int q = 0; q < comm->size; q++)
    if (q != comm->rank) {
      MPI_Request req;
      int64_t note[2] = {comm->sent[q], comm->taken[q]};
      MPI_Isend(note, 2, MPI_INT64_T, comm->world[q], comm->tag + 1,
                MPI_COMM_WORLD, &req);
      MPI_Wait(&req, MPI_STATUS_IGNORE);
    }
  unsigned long serial = comm->serial;
  comm_free(comm);
  standin_order_device_idle(); /* its kernels end */
  standin_nccl_aborted(serial); /* and what waited behind them fires */
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  need_comm(comm, "ncclCommFinalize");
  if (comm->state == ncclInProgress)
    standin_die("ncclCommFinalize on rank %d: the communicator is still "
                "ncclInProgress (poll ncclCommGetAsyncError first)",
                comm->rank);
  if (comm->finalized)
    return set_last(ncclInvalidUsage,
                    "stand-in: ncclCommFinalize called twice on rank %d",
                    comm->rank);
  comm->finalized = 1;
  if (comm->state != ncclSuccess)
    return comm->state;
  int hung;
  pthread_mutex_lock(&mu);
  hung = comm->hanging;
  pthread_mutex_unlock(&mu);
  if (hung && comm->blocking)
    standin_die("ncclCommFinalize on rank %d: a collective never completes; "
                "a blocking finalize never returns (ncclCommAbort instead)",
                comm->rank);
  ncclResult_t r = progress(comm, ncclSuccess);
  if (hung)
    comm->next_state = ncclInProgress; /* flushing never ends */
  return r;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == NULL)
    return ncclSuccess;
  need_comm(comm, "ncclCommDestroy");
  int hung;
  pthread_mutex_lock(&mu);
  hung = comm->hanging;
  pthread_mutex_unlock(&mu);
  if (comm->state == ncclInProgress)
    standin_die("ncclCommDestroy on rank %d: the communicator is still "
                "ncclInProgress (wait for it, or ncclCommAbort)",
                comm->rank);
  if (hung)
    standin_die("ncclCommDestroy on rank %d: a collective never completes, "
                "so destroy would wait forever (ncclCommAbort instead)",
                comm->rank);
  comm_free(comm);
  return ncclSuccess;
}

/* ---- operations ---------------------------------------------------------
 */

typedef enum {
  OP_ALLREDUCE,
  OP_BROADCAST,
  OP_ALLGATHER,
  OP_REDUCESCATTER,
  OP_SEND,
  OP_RECV
} kind_t;

static const char *const kind_names[] = {"ncclAllReduce", "ncclBroadcast",
                                         "ncclAllGather", "ncclReduceScatter",
                                         "ncclSend",      "ncclRecv"};

/* Every communication call this process made, by kind (under mu). */
static long kind_calls[sizeof kind_names / sizeof kind_names[0]];

long standin_nccl_calls(const char *call) {
  long n = -1;
  pthread_mutex_lock(&mu);
  for (size_t k = 0; k < sizeof kind_names / sizeof kind_names[0]; k++)
    if (strcmp(kind_names[k], call) == 0)
      n = kind_calls[k];
  pthread_mutex_unlock(&mu);
  return n;
}

enum { FAULT_NONE, FAULT_HANG, FAULT_ASYNC };

typedef struct op {
  kind_t kind;
  const void *send;
  void *recv;
  size_t count; /* per rank for allgather (send), reducescatter (recv) */
  ncclDataType_t type;
  ncclRedOp_t redop;
  int root; /* broadcast; peer of send/recv */
  ncclComm_t comm;
  cudaStream_t stream;
  int fault; /* this call is the faulty one: FAULT_ASYNC or FAULT_HANG */
} op_t;

/* What travels before each message's bytes. */
/* At most this many other communicators of a process in an order check. */
#define ORDER_MAX 8

typedef struct hdr {
  int32_t kind, type, redop, root;
  int64_t count, seq;
  /* HVD_STANDIN_NCCL_ORDER=1 (order_take): the sender's exchanges so far
   * on its other communicators when it started this one; the ranks must
   * agree on every communicator they share (order_check). Not part of
   * what the ranks must say alike (HDR_SAME). */
  int32_t norder;
  uint64_t oid[ORDER_MAX];
  int64_t ocount[ORDER_MAX];
} hdr_t;
#define HDR_SAME offsetof(hdr_t, norder)

static size_t type_size(ncclDataType_t t) {
  switch (t) {
  case ncclInt8:
  case ncclUint8:
    return 1;
  case ncclFloat16:
  case ncclBfloat16:
    return 2;
  case ncclInt32:
  case ncclUint32:
  case ncclFloat32:
    return 4;
  case ncclInt64:
  case ncclUint64:
  case ncclFloat64:
    return 8;
  default:
    return 0;
  }
}

/* hvd's dtype for an NCCL type it reduces; -1 for the others. */
static int hvd_type(ncclDataType_t t) {
  switch (t) {
  case ncclInt8:
    return HVD_INT8;
  case ncclUint8:
    return HVD_UINT8;
  case ncclInt32:
    return HVD_INT32;
  case ncclInt64:
    return HVD_INT64;
  case ncclFloat16:
    return HVD_FLOAT16;
  case ncclBfloat16:
    return HVD_BFLOAT16;
  case ncclFloat32:
    return HVD_FLOAT32;
  case ncclFloat64:
    return HVD_FLOAT64;
  default:
    return -1;
  }
}

static int hvd_redop(ncclRedOp_t op) {
  switch (op) {
  case ncclSum:
    return HVD_SUM;
  case ncclProd:
    return HVD_PRODUCT;
  case ncclMin:
    return HVD_MIN;
  case ncclMax:
    return HVD_MAX;
  default:
    return -1; /* ncclAvg and custom ops: not here */
  }
}

/* The calling thread's group (as NCCL: groups are per thread). */
static _Thread_local int depth;
static _Thread_local op_t *group;
static _Thread_local size_t ngroup, group_cap;

/* Stricter than NCCL, which gives undefined results: a call whose send
 * and receive buffers overlap other than in place ends the process. In
 * place is recv == send (allreduce, broadcast), send == recv + rank *
 * count (allgather), recv == send + rank * count (reducescatter); n is a
 * rank's bytes, p the ranks. */
static void check_overlap(const op_t *o, size_t n, size_t p, int rank,
                          const char *w) {
  if (o->send == NULL || o->recv == NULL || n == 0 ||
      o->kind == OP_SEND || o->kind == OP_RECV)
    return;
  const char *sb = o->send, *rb = o->recv, *slot;
  size_t sn = n, rn = n;
  const char *rule;
  switch (o->kind) {
  case OP_ALLGATHER:
    rn = n * p;
    slot = rb + (size_t)rank * n;
    rule = "sendbuff == recvbuff + rank * sendcount";
    if (sb == slot)
      return;
    break;
  case OP_REDUCESCATTER:
    sn = n * p;
    slot = sb + (size_t)rank * n;
    rule = "recvbuff == sendbuff + rank * recvcount";
    if (rb == slot)
      return;
    break;
  default:
    rule = "recvbuff == sendbuff";
    if (sb == rb)
      return;
    break;
  }
  if (sb < rb + rn && rb < sb + sn)
    standin_die("%s: sendbuff %p (%zu bytes) and recvbuff %p (%zu bytes) "
                "overlap, but not in place (%s): NCCL's result would be "
                "undefined",
                w, (const void *)sb, sn, (const void *)rb, rn, rule);
}

/* Checks one call; 0 and fills *o, or the error to return. */
static ncclResult_t check_op(op_t *o) {
  const char *who = kind_names[o->kind];
  ncclComm_t c = o->comm;
  need_comm(c, who);
  if (c->state == ncclInProgress)
    standin_die("%s on rank %d: the communicator is still ncclInProgress "
                "(poll ncclCommGetAsyncError until it is not)",
                who, c->rank);
  if (c->finalized)
    standin_die("%s on rank %d: after ncclCommFinalize", who, c->rank);
  if (c->state != ncclSuccess)
    return c->state; /* as NCCL: the asynchronous error */
  size_t es = type_size(o->type);
  if (es == 0)
    return set_last(ncclInvalidArgument, "stand-in: %s: datatype %d", who,
                    (int)o->type);
  if ((o->kind == OP_ALLREDUCE || o->kind == OP_REDUCESCATTER) &&
      (hvd_type(o->type) < 0 || hvd_redop(o->redop) < 0))
    return set_last(ncclInvalidArgument,
                    "stand-in: %s: reduction %d of datatype %d is not "
                    "implemented",
                    who, (int)o->redop, (int)o->type);
  if ((o->kind == OP_BROADCAST || o->kind == OP_SEND || o->kind == OP_RECV) &&
      (o->root < 0 || o->root >= c->size))
    return set_last(ncclInvalidArgument, "stand-in: %s: rank %d of %d", who,
                    o->root, c->size);
  char w[96];
  snprintf(w, sizeof w, "%s on rank %d", who, c->rank);
  int stream_dev = standin_stream_device(o->stream, w);
  if (stream_dev != c->dev)
    standin_die("%s: the stream is on cuda:%d, the communicator on cuda:%d", w,
                stream_dev, c->dev);
  size_t n = o->count * es, p = (size_t)c->size;
  switch (o->kind) {
  case OP_ALLREDUCE:
    standin_need_device_on(o->send, n, c->dev, w, "sendbuff");
    standin_need_device_on(o->recv, n, c->dev, w, "recvbuff");
    break;
  case OP_BROADCAST:
    if (c->rank == o->root)
      standin_need_device_on(o->send, n, c->dev, w, "sendbuff");
    standin_need_device_on(o->recv, n, c->dev, w, "recvbuff");
    break;
  case OP_ALLGATHER:
    standin_need_device_on(o->send, n, c->dev, w, "sendbuff");
    standin_need_device_on(o->recv, n * p, c->dev, w, "recvbuff");
    break;
  case OP_REDUCESCATTER:
    standin_need_device_on(o->send, n * p, c->dev, w, "sendbuff");
    standin_need_device_on(o->recv, n, c->dev, w, "recvbuff");
    break;
  case OP_SEND:
    standin_need_device_on(o->send, n, c->dev, w, "sendbuff");
    break;
  case OP_RECV:
    standin_need_device_on(o->recv, n, c->dev, w, "recvbuff");
    break;
  }
  check_overlap(o, n, p, c->rank, w);
  if (o->send != NULL && (o->kind != OP_BROADCAST || c->rank == o->root))
    standin_access(o->stream, o->send,
                   o->kind == OP_REDUCESCATTER ? n * p : n, 0, w, "sendbuff");
  if (o->recv != NULL)
    standin_access(o->stream, o->recv, o->kind == OP_ALLGATHER ? n * p : n, 1,
                   w, "recvbuff");
  c->calls++;
  pthread_mutex_lock(&mu);
  kind_calls[o->kind]++;
  pthread_mutex_unlock(&mu);
  o->fault = c->calls == c->async_at + 1  ? FAULT_ASYNC
             : c->calls == c->hang_at + 1 ? FAULT_HANG
                                          : FAULT_NONE;
  return ncclSuccess;
}

/* ---- NCCL's order rule ---------------------------------------------------
 * Calls on different communicators must be issued in the same order on
 * every rank that shares them, or NCCL may deadlock (kernels of one wait
 * for peers stuck in the other's). With HVD_STANDIN_NCCL_ORDER=1 every
 * exchange counts as one issue on its communicator, and its messages
 * carry how many exchanges the sender had begun on each of its other
 * communicators at that moment: a receiver that shares one of them and
 * had begun another number there ends the process naming both. (Ranks
 * that issue in opposite orders from one thread deadlock here as with
 * NCCL, until HVD_STANDIN_NCCL_PATIENCE; the check catches the orders
 * that do not deadlock every time, as from several threads.) */
static int order_on = -1;

/* Counts this exchange on c and snapshots the others into h. */
static void order_take(ncclComm_t c, hdr_t *h) {
  h->norder = 0;
  pthread_mutex_lock(&mu);
  if (order_on < 0)
    order_on = standin_env_int("HVD_STANDIN_NCCL_ORDER", 0, 1);
  c->exchanges++;
  for (struct ncclComm *x = registry; order_on && x != NULL; x = x->next)
    if (x != c && h->norder < ORDER_MAX) {
      h->oid[h->norder] = x->id;
      h->ocount[h->norder++] = x->exchanges;
    }
  pthread_mutex_unlock(&mu);
}

/* Dies when got (from world rank `from`) and mine disagree on the order
 * of a communicator both hold. */
static void order_check(ncclComm_t c, const hdr_t *mine, const hdr_t *got,
                        int from) {
  int wrank = 0;
  for (int i = 0; i < got->norder; i++)
    for (int j = 0; j < mine->norder; j++)
      if (got->oid[i] == mine->oid[j] && got->ocount[i] != mine->ocount[j]) {
        MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
        standin_die("NCCL's order rule broken: world rank %d began its "
                    "exchange %ld on communicator %016llx (%d ranks) after "
                    "%lld on communicator %016llx, world rank %d after %lld: "
                    "ranks must issue calls on the communicators they share "
                    "in one order",
                    wrank, c->exchanges, (unsigned long long)c->id, c->size,
                    (long long)mine->ocount[j],
                    (unsigned long long)got->oid[i], from,
                    (long long)got->ocount[i]);
      }
}

/* One message of an exchange. */
typedef struct msg {
  int op, peer, is_send;
  hdr_t h;      /* what it says (send) or must say (receive) */
  char *buf;    /* header and bytes */
  size_t bytes; /* of data */
} msg_t;

/* 1 when every message of m with a peer that aborted is one it sent us,
 * or took from us, before it did: those finish, the others never. */
static int all_covered(ncclComm_t comm, const struct msg *m, int n) {
  for (int k = 0; k < n; k++) {
    int q = m[k].peer;
    if (comm->left[q] &&
        m[k].h.seq >= comm->note_in[2 * q + (m[k].is_send ? 1 : 0)])
      return 0;
  }
  return 1;
}

/* The message that peer q must get from this rank for o (*h filled), or
 * that this rank must get from q; bytes of data; 0: none. */
static int plan_msg(const op_t *o, int q, int is_send, hdr_t *h,
                    const char **data, size_t *bytes) {
  ncclComm_t c = o->comm;
  size_t es = type_size(o->type), n = o->count * es;
  int me = c->rank, kind = o->kind;
  *data = NULL;
  *bytes = n;
  switch (o->kind) {
  case OP_ALLREDUCE:
  case OP_ALLGATHER:
    if (q == me)
      return 0;
    *data = o->send;
    break;
  case OP_BROADCAST:
    if (q == me || (is_send ? me != o->root : q != o->root))
      return 0;
    *data = o->send;
    break;
  case OP_REDUCESCATTER:
    if (q == me)
      return 0;
    *data = (const char *)o->send + (size_t)q * n;
    break;
  case OP_SEND:
    if (!is_send || q != o->root)
      return 0;
    *data = o->send;
    break;
  case OP_RECV:
    if (is_send || q != o->root)
      return 0;
    kind = OP_SEND; /* what the peer's message says */
    break;
  }
  memset(h, 0, sizeof *h);
  h->kind = kind;
  h->type = (int32_t)o->type;
  h->redop = kind == OP_ALLREDUCE || kind == OP_REDUCESCATTER ? o->redop : 0;
  h->root = kind == OP_BROADCAST ? o->root : 0;
  h->count = (int64_t)o->count;
  return 1;
}

static void describe(const hdr_t *h, char *buf, size_t len) {
  snprintf(buf, len, "%s(count %lld, datatype %d, op %d, root %d) #%lld",
           h->kind >= 0 && h->kind <= OP_RECV ? kind_names[h->kind] : "?",
           (long long)h->count, (int)h->type, (int)h->redop, (int)h->root,
           (long long)h->seq);
}

/* The reduction of o (allreduce, or this rank's block of a reducescatter)
 * over every rank, in rank order, into out: mine is this rank's part, the
 * others come from the nin received messages in[]. */
static void reduce(const op_t *o, msg_t **in, int nin, const char *mine,
                   char *out) {
  ncclComm_t c = o->comm;
  size_t n = o->count * type_size(o->type);
  for (int q = 0; q < c->size; q++) {
    const char *src = mine;
    if (q != c->rank)
      for (int k = 0; k < nin; k++)
        if (in[k]->peer == q)
          src = in[k]->buf + sizeof(hdr_t);
    if (q == 0)
      memcpy(out, src, n);
    else
      hvd__reduce_into(out, src, (int64_t)o->count,
                       (hvd_dtype_t)hvd_type(o->type),
                       (hvd_op_t)hvd_redop(o->redop));
  }
}

/* Runs ops[0..n) of one communicator: every message posted, waited for,
 * checked, then the results written. A communicator that hangs, or whose
 * peer is gone, exchanges nothing: its streams never finish. Returns the
 * asynchronous error that a fault injects, else ncclSuccess. */
static ncclResult_t exchange_ops(ncclComm_t c, op_t *ops, int n) {
  int p = c->size, fault = FAULT_NONE;
  ncclResult_t async = ncclSuccess;
  for (int i = 0; i < n; i++) {
    fault = ops[i].fault > fault ? ops[i].fault : fault;
    standin_stream_nccl(ops[i].stream, c->serial); /* its work is queued */
  }
  read_notes(c);
  pthread_mutex_lock(&mu);
  int stuck = c->hanging;
  pthread_mutex_unlock(&mu);
  if (!stuck) {
    msg_t *m = calloc(2 * (size_t)n * (size_t)p + 1, sizeof *m);
    MPI_Request *reqs = calloc(2 * (size_t)n * (size_t)p + 1, sizeof *reqs);
    MPI_Status *st = calloc(2 * (size_t)n * (size_t)p + 1, sizeof *st);
    char **mine = calloc((size_t)n, sizeof *mine);
    msg_t **in = calloc((size_t)p, sizeof *in); /* one op's receives */
    if (m == NULL || reqs == NULL || st == NULL || mine == NULL || in == NULL)
      standin_die("out of memory");
    int nm = 0;
    hdr_t order;
    order_take(c, &order);
    for (int i = 0; i < n; i++) {
      const op_t *o = &ops[i];
      size_t es = type_size(o->type), own = o->count * es;
      /* our own contribution, as it is now (ops of a group are concurrent) */
      const char *src = o->kind == OP_REDUCESCATTER
                            ? (const char *)o->send + (size_t)c->rank * own
                            : o->send;
      if (o->kind != OP_RECV && o->kind != OP_SEND &&
          (o->kind != OP_BROADCAST || c->rank == o->root)) {
        mine[i] = malloc(own + 1);
        if (mine[i] == NULL)
          standin_die("out of memory");
        memcpy(mine[i], src, own);
      }
      for (int q = 0; q < p; q++)
        for (int is_send = 1; is_send >= 0; is_send--) {
          msg_t *x = &m[nm];
          const char *data;
          if (!plan_msg(o, q, is_send, &x->h, &data, &x->bytes))
            continue;
          if (x->bytes > (size_t)INT32_MAX - sizeof(hdr_t))
            standin_die("%s: %zu bytes is more than one MPI message carries "
                        "here",
                        kind_names[o->kind], x->bytes);
          x->op = i;
          x->peer = q;
          x->is_send = is_send;
          x->h.seq = is_send ? c->sent[q]++ : c->received[q]++;
          x->h.norder = order.norder;
          memcpy(x->h.oid, order.oid, sizeof order.oid);
          memcpy(x->h.ocount, order.ocount, sizeof order.ocount);
          x->buf = malloc(sizeof(hdr_t) + x->bytes);
          if (x->buf == NULL)
            standin_die("out of memory");
          int len = (int)(sizeof(hdr_t) + x->bytes);
          if (is_send) {
            memcpy(x->buf, &x->h, sizeof x->h);
            memcpy(x->buf + sizeof(hdr_t), data, x->bytes);
            MPI_Isend(x->buf, len, MPI_BYTE, c->world[q], c->tag,
                      MPI_COMM_WORLD, &reqs[nm]);
          } else {
            MPI_Irecv(x->buf, len, MPI_BYTE, c->world[q], c->tag,
                      MPI_COMM_WORLD, &reqs[nm]);
          }
          nm++;
        }
    }
    if (wait_all(c, reqs, nm, st, kind_names[ops[0].kind], m)) {
      for (int k = 0; k < nm; k++) { /* do the ranks agree? */
        hdr_t got;
        int len = 0;
        if (m[k].is_send)
          continue;
        c->taken[m[k].peer]++;
        MPI_Get_count(&st[k], MPI_BYTE, &len);
        memcpy(&got, m[k].buf, sizeof got);
        if ((size_t)len != sizeof(hdr_t) + m[k].bytes ||
            memcmp(&got, &m[k].h, HDR_SAME) != 0) {
          char a[160], b[160];
          describe(&m[k].h, a, sizeof a);
          describe(&got, b, sizeof b);
          standin_die("rank %d runs %s with rank %d, which runs %s (%d "
                      "bytes): the ranks disagree on the NCCL calls",
                      c->rank, a, m[k].peer, b, len);
        }
        order_check(c, &m[k].h, &got, c->world[m[k].peer]);
      }
      for (int i = 0; i < n; i++) { /* the results */
        const op_t *o = &ops[i];
        size_t bytes = o->count * type_size(o->type);
        int nin = 0;
        for (int k = 0; k < nm; k++)
          if (m[k].op == i && !m[k].is_send)
            in[nin++] = &m[k];
        switch (o->kind) {
        case OP_ALLREDUCE:
        case OP_REDUCESCATTER: {
          char *out = malloc(bytes + 1);
          if (out == NULL)
            standin_die("out of memory");
          reduce(o, in, nin, mine[i], out);
          memcpy(o->recv, out, bytes);
          free(out);
          break;
        }
        case OP_BROADCAST:
          memmove(o->recv,
                  c->rank == o->root ? mine[i] : in[0]->buf + sizeof(hdr_t),
                  bytes);
          break;
        case OP_ALLGATHER:
          for (int q = 0; q < p; q++) {
            const char *src = mine[i];
            for (int k = 0; k < nin; k++)
              if (in[k]->peer == q)
                src = in[k]->buf + sizeof(hdr_t);
            memmove((char *)o->recv + (size_t)q * bytes, src, bytes);
          }
          break;
        case OP_RECV:
          memcpy(o->recv, in[0]->buf + sizeof(hdr_t), bytes);
          break;
        case OP_SEND:
          break;
        }
      }
    } else { /* a peer is gone: give the exchange up */
      for (int k = 0; k < nm; k++)
        if (reqs[k] != MPI_REQUEST_NULL) {
          if (!m[k].is_send) {
            MPI_Cancel(&reqs[k]);
            MPI_Wait(&reqs[k], MPI_STATUS_IGNORE);
          } else {
            MPI_Request_free(&reqs[k]); /* sent when it can be */
            m[k].buf = NULL;            /* (its buffer stays: a leak) */
          }
        }
      stuck = 1;
    }
    for (int k = 0; k < nm; k++)
      free(m[k].buf);
    for (int i = 0; i < n; i++)
      free(mine[i]);
    free(mine);
    free(in);
    free(m);
    free(reqs);
    free(st);
  }
  if (fault != FAULT_NONE && !stuck) { /* it did its part; now it fails */
    if (fault == FAULT_ASYNC)
      async =
          set_last(c->async_result,
                   "stand-in: asynchronous %s on rank %d after %ld calls as "
                   "asked (HVD_STANDIN_NCCL_ASYNC_ERROR)",
                   c->async_result == ncclRemoteError ? "ncclRemoteError"
                                                      : "ncclSystemError",
                   c->rank, c->async_at);
    stuck = 1;
  }
  if (stuck) {
    set_hanging(c);
    for (int i = 0; i < n; i++)
      standin_stream_hang(ops[i].stream, c->serial);
  }
  return async;
}

/* exchange_ops, on one thread at a time: NCCL's communicators are not
 * for two threads at once (its calls on one communicator would
 * interleave), so a second thread's call while one is in an exchange
 * ends the process. (A call after the first has returned, from any
 * thread, is fine, as with NCCL.) */
static ncclResult_t exchange(ncclComm_t c, op_t *ops, int n) {
  pthread_mutex_lock(&mu);
  int busy = c->busy;
  c->busy = 1;
  pthread_mutex_unlock(&mu);
  if (busy)
    standin_die("%s on rank %d: another thread is in a call on the same "
                "communicator: NCCL's communicators are not for two "
                "threads at once",
                kind_names[ops[0].kind], c->rank);
  ncclResult_t r = exchange_ops(c, ops, n);
  pthread_mutex_lock(&mu);
  c->busy = 0;
  pthread_mutex_unlock(&mu);
  return r;
}

/* A call: queued in a group, else run now. */
static ncclResult_t submit(op_t *o) {
  ncclResult_t r = check_op(o);
  if (r != ncclSuccess)
    return r;
  if (depth > 0) {
    if (ngroup == group_cap) {
      size_t cap = group_cap ? 2 * group_cap : 64;
      op_t *g = realloc(group, cap * sizeof *g);
      if (g == NULL)
        standin_die("out of memory");
      group = g;
      group_cap = cap;
    }
    group[ngroup++] = *o;
    return ncclSuccess;
  }
  if (o->kind == OP_SEND || o->kind == OP_RECV)
    standin_die("%s on rank %d outside ncclGroupStart/End: would deadlock "
                "unless the peer's matching call comes first",
                kind_names[o->kind], o->comm->rank);
  return progress(o->comm, exchange(o->comm, o, 1));
}

/* (nccl.h declares these two without a prototype) */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

ncclResult_t ncclGroupStart(void) {
  depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (depth == 0)
    return set_last(ncclInvalidUsage,
                    "stand-in: ncclGroupEnd without ncclGroupStart");
  if (--depth > 0)
    return ncclSuccess;
  ncclResult_t ret = ncclSuccess;
  size_t done = 0;
  while (done < ngroup) { /* each communicator's calls, in order */
    ncclComm_t c = group[done].comm;
    size_t k = done;
    op_t *ops = malloc((ngroup - done) * sizeof *ops);
    int n = 0;
    if (ops == NULL)
      standin_die("out of memory");
    for (; k < ngroup; k++)
      if (group[k].comm == c) {
        ops[n++] = group[k];
        group[k].comm = NULL;
      }
    if (progress(c, exchange(c, ops, n)) == ncclInProgress)
      ret = ncclInProgress;
    free(ops);
    while (done < ngroup && group[done].comm == NULL)
      done++;
  }
  ngroup = 0;
  free(group); /* thread-local: a thread that ends leaves nothing behind */
  group = NULL;
  group_cap = 0;
  return ret;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  op_t o = {OP_ALLREDUCE, sendbuff, recvbuff, count,  datatype,
            op,           0,        comm,     stream, 0};
  return submit(&o);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  op_t o = {OP_BROADCAST, sendbuff, recvbuff, count,  datatype,
            ncclSum,      root,     comm,     stream, 0};
  return submit(&o);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff,
                           size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  op_t o = {OP_ALLGATHER, sendbuff, recvbuff, sendcount, datatype,
            ncclSum,      0,        comm,     stream,    0};
  return submit(&o);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff,
                               size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  op_t o = {OP_REDUCESCATTER, sendbuff, recvbuff, recvcount,
            datatype,         op,       0,        comm,
            stream,           0};
  return submit(&o);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count,
                      ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  op_t o = {OP_SEND, sendbuff, NULL, count,  datatype,
            ncclSum, peer,     comm, stream, 0};
  return submit(&o);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype,
                      int peer, ncclComm_t comm, cudaStream_t stream) {
  op_t o = {OP_RECV, NULL, recvbuff, count,  datatype,
            ncclSum, peer, comm,     stream, 0};
  return submit(&o);
}
