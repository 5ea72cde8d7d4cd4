/*
 * collectives_demo.c - every hvd collective, run and checked on all ranks.
 *
 *   mpirun -np 2 examples/collectives_demo
 *
 * Each rank fills its inputs from its rank number, so the result of every
 * collective is known in closed form. Every rank checks its own result and
 * prints what is wrong on stderr; then the ranks gather their verdicts and
 * rank 0 prints one line per collective ("allreduce average: ok"). The
 * program exits 1 on every rank if any check failed on any rank.
 *
 * Only the public API (hvd.h) is used; tensors are host memory. It takes
 * no arguments: --help prints the line above, anything else exits 2.
 */
#include <hvd.h>

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define HOST_LEN 64    /* bytes of host name gathered per rank */
#define REPORT_RANKS 8 /* rank 0 lists the topology of this many ranks */

static int checks_run;    /* verdicts gathered */
static int checks_failed; /* verdicts with some rank failing */

/* Says on stderr which call failed on this rank and why. Returns 1 if rc is
 * HVD_SUCCESS, else 0. */
static int call_ok(hvd_result_t rc, const char *call) {
  if (rc == HVD_SUCCESS)
    return 1;
  fprintf(stderr, "[rank %d] %s failed: %s: %s\n", hvd_rank(), call,
          hvd_strerror(rc), hvd_last_error());
  return 0;
}

/* Says on stderr what a check found wrong on this rank. Returns 0. */
static int wrong(const char *what, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "[rank %d] %s: ", hvd_rank(), what);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  return 0;
}

/* Checks that t is a host tensor of dtype with the given 2-D shape. */
static int has_shape(const char *what, const hvd_tensor_t *t, hvd_dtype_t dtype,
                     int64_t rows, int64_t cols) {
  if (t->dtype != dtype || t->ndim != 2 || t->shape[0] != rows ||
      t->shape[1] != cols || (rows * cols > 0 && t->data == NULL))
    return wrong(what,
                 "result is %s with ndim %d, shape [%lld, %lld]; expected "
                 "%s [%lld, %lld]",
                 hvd_dtype_name(t->dtype), t->ndim, (long long)t->shape[0],
                 t->ndim > 1 ? (long long)t->shape[1] : -1LL,
                 hvd_dtype_name(dtype), (long long)rows, (long long)cols);
  return 1;
}

/* Every rank hands in its verdict on `what`; rank 0 prints the line. Returns
 * 0 if the verdicts could not be gathered (the job cannot go on). */
static int agree(const char *what, int ok) {
  int32_t mine = ok ? 1 : 0;
  int64_t one = 1;
  hvd_tensor_t send = hvd_tensor_make(&mine, HVD_INT32, 1, &one);
  hvd_tensor_t all = {0};
  int size = hvd_size(), failed = 0;

  if (!call_ok(hvd_allgather("demo.verdict", &send, &all),
               "hvd_allgather (verdicts)"))
    return 0;
  if (all.ndim != 1 || all.shape[0] != size) {
    fprintf(stderr, "[rank %d] verdicts: got %lld, expected %d\n", hvd_rank(),
            all.ndim == 1 ? (long long)all.shape[0] : -1LL, size);
    hvd_tensor_free(&all);
    return 0;
  }
  const int32_t *v = all.data;
  for (int r = 0; r < size; r++)
    failed += !v[r];
  checks_run++;
  checks_failed += failed > 0;
  if (hvd_rank() == 0) {
    if (failed == 0) {
      printf("%s: ok\n", what);
    } else {
      printf("%s: FAILED on rank", what);
      for (int r = 0; r < size; r++)
        if (!v[r])
          printf(" %d", r);
      printf(" (see stderr)\n");
    }
    fflush(stdout);
  }
  hvd_tensor_free(&all);
  return 1;
}

/* Rank 0's report header: the build, and each rank's node, local and cross
 * place. t holds 5 numbers per rank (see show_topology), hosts HOST_LEN
 * bytes per rank. */
static void print_topology(const int32_t *t, const char *hosts, int size) {
  int cuda = hvd_cuda_built(), nccl = hvd_nccl_built(), nodes = 0;

  for (int r = 0; r < size; r++)
    if (t[5 * r] == 0) /* local rank 0 of a node: cross size = node count */
      nodes = t[5 * r + 3];
  printf("hvd %s collectives demo: %d rank%s on %d node%s, ", hvd_version(),
         size, size == 1 ? "" : "s", nodes, nodes == 1 ? "" : "s");
  if (t[4])
    printf("%d per node\n", t[1]);
  else
    printf("not the same number on each\n");
  printf("build: MPI %s, CUDA ", hvd_mpi_built() ? "yes" : "no");
  if (cuda)
    printf("%d.%d", cuda / 1000, cuda % 1000 / 10);
  else
    printf("no");
  if (nccl)
    printf(", NCCL %d.%d.%d\n", nccl / 10000, nccl % 10000 / 100, nccl % 100);
  else
    printf(", NCCL no\n");
  for (int r = 0; r < size && r < REPORT_RANKS; r++) {
    const int32_t *e = t + 5 * r;
    printf("  rank %d on %.*s: local %d of %d, cross %d of %d\n", r,
           HOST_LEN - 1, hosts + (size_t)HOST_LEN * r, e[0], e[1], e[2], e[3]);
  }
  if (size > REPORT_RANKS)
    printf("  ... and %d more\n", size - REPORT_RANKS);
  fflush(stdout);
}

/* Every rank checks that its own place in the topology is consistent and
 * sends it, with its node name, to everyone; rank 0 prints them. */
static int show_topology(void) {
  const char *what = "topology";
  int rank = hvd_rank(), size = hvd_size(), ok = 1;
  int32_t mine[5] = {hvd_local_rank(), hvd_local_size(), hvd_cross_rank(),
                     hvd_cross_size(), hvd_is_homogeneous()};
  unsigned char host[HOST_LEN] = {0};
  const char *env = getenv("HVD_HOSTNAME");
  int64_t ishape[2] = {1, 5}, hshape[2] = {1, HOST_LEN};
  hvd_tensor_t isend = hvd_tensor_make(mine, HVD_INT32, 2, ishape);
  hvd_tensor_t hsend = hvd_tensor_make(host, HVD_UINT8, 2, hshape);
  hvd_tensor_t iall = {0}, hall = {0};

  if (env != NULL && env[0] != '\0')
    snprintf((char *)host, HOST_LEN, "%s", env);
  else if (gethostname((char *)host, HOST_LEN - 1) != 0)
    snprintf((char *)host, HOST_LEN, "?");
  host[HOST_LEN - 1] = '\0';

  if (mine[0] < 0 || mine[0] >= mine[1] || mine[2] < 0 || mine[2] >= mine[3] ||
      mine[1] > size || mine[3] > size ||
      (mine[4] && mine[1] * mine[3] != size))
    ok = wrong(what,
               "local %d/%d, cross %d/%d, homogeneous %d do not fit %d ranks",
               mine[0], mine[1], mine[2], mine[3], mine[4], size);

  if (!call_ok(hvd_allgather("demo.topology", &isend, &iall),
               "hvd_allgather (topology)") ||
      !call_ok(hvd_allgather("demo.hosts", &hsend, &hall),
               "hvd_allgather (hosts)"))
    ok = 0;
  else if (!has_shape(what, &iall, HVD_INT32, size, 5) ||
           !has_shape(what, &hall, HVD_UINT8, size, HOST_LEN))
    ok = 0;
  else if (rank == 0)
    print_topology(iall.data, hall.data, size);
  hvd_tensor_free(&iall);
  hvd_tensor_free(&hall);
  return agree(what, ok);
}

/* Sum, with the async form: rank r sends (r + 1) * (i + 1) in element i, so
 * element i of the sum is (i + 1) * P (P + 1) / 2. */
static int demo_allreduce_sum(void) {
  const char *what = "allreduce sum";
  int rank = hvd_rank(), size = hvd_size(), ok = 1;
  float send[10], recv[10];
  int64_t shape[2] = {2, 5};
  hvd_tensor_t s = hvd_tensor_make(send, HVD_FLOAT32, 2, shape);
  hvd_tensor_t d = hvd_tensor_make(recv, HVD_FLOAT32, 2, shape);
  hvd_request_t *req = NULL;

  for (int i = 0; i < 10; i++) {
    send[i] = (float)((rank + 1) * (i + 1));
    recv[i] = -1.0f;
  }
  if (!call_ok(hvd_allreduce_async("demo.sum", &s, &d, HVD_SUM, 1.0, 1.0, &req),
               "hvd_allreduce_async") ||
      !call_ok(hvd_wait(req), "hvd_wait (allreduce sum)")) {
    ok = 0;
  } else {
    for (int i = 0; i < 10 && ok; i++) {
      float want = (float)((i + 1) * size * (size + 1) / 2);
      if (recv[i] != want)
        ok = wrong(what, "element %d is %g, expected %g", i, recv[i], want);
    }
  }
  return agree(what, ok);
}

/* Average, in place (send == recv): rank r holds 2 r + i in element i, so
 * the average is P - 1 + i. */
static int demo_allreduce_average(void) {
  const char *what = "allreduce average";
  int rank = hvd_rank(), size = hvd_size(), ok = 1;
  float x[6];
  int64_t shape[1] = {6};
  hvd_tensor_t t = hvd_tensor_make(x, HVD_FLOAT32, 1, shape);

  for (int i = 0; i < 6; i++)
    x[i] = (float)(2 * rank + i);
  if (!call_ok(hvd_allreduce("demo.average", &t, &t, HVD_AVERAGE, 1.0, 1.0),
               "hvd_allreduce")) {
    ok = 0;
  } else {
    for (int i = 0; i < 6 && ok; i++) {
      float want = (float)(size - 1 + i);
      if (x[i] != want)
        ok = wrong(what, "element %d is %g, expected %g", i, x[i], want);
    }
  }
  return agree(what, ok);
}

/* Rank 0's values replace everyone else's. */
static int demo_broadcast(void) {
  const char *what = "broadcast from rank 0";
  int rank = hvd_rank(), ok = 1;
  float x[4];
  int64_t shape[1] = {4};
  hvd_tensor_t t = hvd_tensor_make(x, HVD_FLOAT32, 1, shape);

  for (int i = 0; i < 4; i++)
    x[i] = rank == 0 ? 0.25f + (float)i : -1.0f;
  if (!call_ok(hvd_broadcast("demo.broadcast", &t, 0), "hvd_broadcast")) {
    ok = 0;
  } else {
    for (int i = 0; i < 4 && ok; i++)
      if (x[i] != 0.25f + (float)i)
        ok = wrong(what, "element %d is %g, expected %g", i, x[i],
                   0.25f + (float)i);
  }
  return agree(what, ok);
}

/* Rank r contributes r % 3 + 1 rows of 3 columns; row j of rank r holds
 * 100 r + 10 j + c. The result is every rank's rows in rank order. */
static int demo_allgather(void) {
  const char *what = "allgather (rows differ per rank)";
  int rank = hvd_rank(), size = hvd_size(), ok = 1;
  float send[9];
  int64_t shape[2] = {rank % 3 + 1, 3}, total = 0;
  hvd_tensor_t s = hvd_tensor_make(send, HVD_FLOAT32, 2, shape);
  hvd_tensor_t d = {0};

  for (int j = 0; j < shape[0]; j++)
    for (int c = 0; c < 3; c++)
      send[3 * j + c] = (float)(100 * rank + 10 * j + c);
  for (int r = 0; r < size; r++)
    total += r % 3 + 1;
  if (!call_ok(hvd_allgather("demo.allgather", &s, &d), "hvd_allgather")) {
    ok = 0;
  } else if (!has_shape(what, &d, HVD_FLOAT32, total, 3)) {
    ok = 0;
  } else {
    const float *got = d.data;
    int64_t row = 0;
    for (int r = 0; r < size && ok; r++)
      for (int j = 0; j < r % 3 + 1 && ok; j++, row++)
        for (int c = 0; c < 3 && ok; c++) {
          float want = (float)(100 * r + 10 * j + c);
          if (got[3 * row + c] != want)
            ok = wrong(what, "row %lld column %d is %g, expected %g",
                       (long long)row, c, got[3 * row + c], want);
        }
  }
  hvd_tensor_free(&d);
  return agree(what, ok);
}

/* Rank r sends (r + j) % 2 + 1 rows to rank j, each row {r, j, k}. Rank j
 * receives, in rank order, the rows addressed to it. */
static int demo_alltoall(void) {
  const char *what = "alltoall (uneven splits)";
  int rank = hvd_rank(), size = hvd_size(), ok = 1;
  int64_t *splits = calloc((size_t)size, sizeof *splits);
  int64_t *recv_splits = calloc((size_t)size, sizeof *recv_splits);
  int32_t *send = calloc((size_t)size * 2 * 3, sizeof *send);
  int64_t shape[2] = {0, 3}, total = 0;
  hvd_tensor_t s, d = {0};

  if (splits == NULL || recv_splits == NULL || send == NULL) {
    ok = wrong(what, "out of memory");
    goto done;
  }
  for (int j = 0; j < size; j++) {
    splits[j] = (rank + j) % 2 + 1;
    for (int k = 0; k < splits[j]; k++, shape[0]++) {
      send[3 * shape[0] + 0] = rank;
      send[3 * shape[0] + 1] = j;
      send[3 * shape[0] + 2] = k;
    }
    total += (j + rank) % 2 + 1; /* rows rank j sends to this rank */
  }
  s = hvd_tensor_make(send, HVD_INT32, 2, shape);
  if (!call_ok(hvd_alltoall("demo.alltoall", &s, splits, &d, recv_splits),
               "hvd_alltoall")) {
    ok = 0;
  } else if (!has_shape(what, &d, HVD_INT32, total, 3)) {
    ok = 0;
  } else {
    const int32_t *got = d.data;
    int64_t row = 0;
    for (int r = 0; r < size && ok; r++) {
      int64_t n = (r + rank) % 2 + 1;
      if (recv_splits[r] != n) {
        ok = wrong(what, "recv_splits[%d] is %lld, expected %lld", r,
                   (long long)recv_splits[r], (long long)n);
        break;
      }
      for (int64_t k = 0; k < n && ok; k++, row++) {
        const int32_t *g = got + 3 * row;
        if (g[0] != r || g[1] != rank || g[2] != k)
          ok = wrong(what, "row %lld is {%d, %d, %d}, expected {%d, %d, %lld}",
                     (long long)row, g[0], g[1], g[2], r, rank, (long long)k);
      }
    }
  }
done:
  hvd_tensor_free(&d);
  free(send);
  free(recv_splits);
  free(splits);
  return agree(what, ok);
}

/* N = 2 P + 1 rows of 2 columns, so the rows do not divide evenly: rank q
 * gets N / P rows, plus one if q < N % P. Rank r sends (r + 1) (2 i + c), so
 * the sum is (2 i + c) P (P + 1) / 2. */
static int demo_reducescatter(void) {
  const char *what = "reducescatter sum (uneven rows)";
  int rank = hvd_rank(), size = hvd_size(), ok = 1;
  int64_t n = 2 * (int64_t)size + 1;
  int64_t mine = n / size + (rank < n % size);
  int64_t first = rank * (n / size) + (rank < n % size ? rank : n % size);
  int64_t shape[2] = {n, 2};
  float *send = calloc((size_t)n * 2, sizeof *send);
  hvd_tensor_t s, d = {0};

  if (send == NULL) {
    ok = wrong(what, "out of memory");
    goto done;
  }
  for (int64_t i = 0; i < n; i++)
    for (int c = 0; c < 2; c++)
      send[2 * i + c] = (float)((rank + 1) * (2 * i + c));
  s = hvd_tensor_make(send, HVD_FLOAT32, 2, shape);
  if (!call_ok(
          hvd_reducescatter("demo.reducescatter", &s, &d, HVD_SUM, 1.0, 1.0),
          "hvd_reducescatter")) {
    ok = 0;
  } else if (!has_shape(what, &d, HVD_FLOAT32, mine, 2)) {
    ok = 0;
  } else {
    const float *got = d.data;
    for (int64_t i = 0; i < mine && ok; i++)
      for (int c = 0; c < 2 && ok; c++) {
        float want = (float)((2 * (first + i) + c) * size * (size + 1) / 2);
        if (got[2 * i + c] != want)
          ok = wrong(what, "row %lld column %d is %g, expected %g",
                     (long long)i, c, got[2 * i + c], want);
      }
  }
done:
  hvd_tensor_free(&d);
  free(send);
  return agree(what, ok);
}

/* The async barrier, polled with hvd_test as a training loop would. */
static int demo_barrier(void) {
  const char *what = "barrier";
  hvd_request_t *req = NULL;
  int done = 0, ok = 1;
  struct timespec nap = {0, 100 * 1000};

  if (!call_ok(hvd_barrier_async(&req), "hvd_barrier_async"))
    return agree(what, 0);
  while (!done) {
    hvd_result_t rc = hvd_test(req, &done);
    if (rc != HVD_SUCCESS) {
      ok = call_ok(rc, "hvd_test (barrier)");
      if (!done) /* the request was not freed: we cannot tell its state */
        return agree(what, 0);
      break;
    }
    if (!done)
      nanosleep(&nap, NULL);
  }
  return agree(what, ok);
}

/* Uneven data: rank r has r + 1 batches. Each batch allreduces 1.0 (sum);
 * ranks that ran out of data have joined and count as 0, so batch b sums to
 * P - b. The last rank has the most batches, so it joins last. */
static int demo_join(void) {
  const char *what = "join (uneven batches)";
  int rank = hvd_rank(), size = hvd_size(), ok = 1, last = -1;
  int64_t one = 1;

  for (int b = 0; b <= rank && ok; b++) {
    float g = 1.0f;
    hvd_tensor_t t = hvd_tensor_make(&g, HVD_FLOAT32, 1, &one);
    if (!call_ok(hvd_allreduce("demo.join.grad", &t, &t, HVD_SUM, 1.0, 1.0),
                 "hvd_allreduce (join)"))
      ok = 0;
    else if (g != (float)(size - b))
      ok = wrong(what, "batch %d summed to %g, expected %d", b, g, size - b);
  }
  if (!call_ok(hvd_join(&last), "hvd_join"))
    ok = 0;
  else if (last != size - 1)
    ok = wrong(what, "last rank to join is %d, expected %d", last, size - 1);
  return agree(what, ok);
}

int main(int argc, char **argv) {
  int (*const steps[])(void) = {
      show_topology,      demo_allreduce_sum, demo_allreduce_average,
      demo_broadcast,     demo_allgather,     demo_alltoall,
      demo_reducescatter, demo_barrier,       demo_join,
  };
  if (argc > 1) { /* before MPI: no launcher needed */
    int help = strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0;
    fputs("usage: mpirun -np N collectives_demo (every hvd collective, "
          "checked on all ranks; no arguments)\n",
          help ? stdout : stderr);
    if (!help)
      fprintf(stderr, "collectives_demo: unexpected argument '%s'\n", argv[1]);
    return help ? 0 : 2;
  }
  hvd_result_t rc = hvd_init();

  if (rc != HVD_SUCCESS) {
    fprintf(stderr, "collectives_demo: hvd_init failed: %s: %s\n",
            hvd_strerror(rc), hvd_last_error());
    return 1;
  }
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++)
    if (!steps[i]()) {
      fprintf(stderr, "[rank %d] collectives_demo: cannot go on\n", hvd_rank());
      hvd_shutdown();
      return 1;
    }
  if (hvd_rank() == 0) {
    if (checks_failed == 0)
      printf("all %d checks passed on %d rank%s\n", checks_run, hvd_size(),
             hvd_size() == 1 ? "" : "s");
    else
      printf("%d of %d checks FAILED\n", checks_failed, checks_run);
    fflush(stdout);
  }
  rc = hvd_shutdown();
  if (!call_ok(rc, "hvd_shutdown"))
    return 1;
  return checks_failed == 0 ? 0 : 1;
}
