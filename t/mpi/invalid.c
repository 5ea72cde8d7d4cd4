/*
 * invalid.c - every invalid argument is rejected on the calling rank,
 * before anything is sent, with HVD_ERR_INVALID_ARG (HVD_ERR_UNSUPPORTED
 * for device tensors) and an exact message; a valid collective works
 * after each. Also: calls before hvd_init(), and a name submitted twice.
 *
 * Run at 1 and 2 ranks.
 */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#define MSG_LEN 512

static int rank, size;

/* Checks the result and message of the call just made. Takes the message
 * first, before anything else can touch it. */
static void expect(hvd_result_t rc, hvd_result_t want_rc, const char *want,
                   const char *what) {
  char seen[MSG_LEN];
  snprintf(seen, sizeof seen, "%s", hvd_last_error());
  is_int(want_rc, rc, "%s: result", what);
  is_string(want, seen, "%s: message", what);
}

/* A correct allreduce: sum over ranks of rank+1+i. */
static void allreduce_works(const char *after) {
  hvdt_allreduce_works(NULL, HVD_INT32, 3, "then a valid allreduce (%s)",
                       after);
}

#define REJECT(call, want, what)                                               \
  do {                                                                         \
    expect((call), HVD_ERR_INVALID_ARG, (want), (what));                       \
    allreduce_works(what);                                                     \
  } while (0)

/* Shapes whose element or byte count wraps (2^32 x 2^32 float32 was 0
 * elements, an empty allreduce; [2^61] float64's bytes wrapped to 0 and
 * stuck the engine; [3, 2^62] was a negative count) are refused by every
 * entry that takes a shape, naming it; so are alltoall splits whose sum
 * wraps. */
static void test_overflow(void) {
  static float f[4];
  static const int64_t wrap0[] = {(int64_t)1 << 32, (int64_t)1 << 32},
                       bytes0[] = {(int64_t)1 << 61},
                       neg[] = {3, (int64_t)1 << 62};
  const char *big = "shape [4294967296, 4294967296] of float32 is more than "
                    "PTRDIFF_MAX bytes";
  char want[MSG_LEN];
  hvd_tensor_t t = hvd_tensor_make(f, HVD_FLOAT32, 2, wrap0), out, r = t;
  hvd_tensor_t b = hvd_tensor_make(f, HVD_FLOAT64, 1, bytes0);
  hvd_tensor_t n = hvd_tensor_make(f, HVD_FLOAT32, 2, neg);
  snprintf(want, sizeof want, "allreduce 'o': send %s", big);
  REJECT(hvd_allreduce("o", &t, &r, HVD_SUM, 1.0, 1.0), want,
         "[2^32, 2^32] float32 allreduce");
  REJECT(hvd_allreduce("o", &b, &b, HVD_SUM, 1.0, 1.0),
         "allreduce 'o': send shape [2305843009213693952] of float64 is more "
         "than PTRDIFF_MAX bytes",
         "[2^61] float64 allreduce");
  REJECT(hvd_allreduce("o", &n, &n, HVD_SUM, 1.0, 1.0),
         "allreduce 'o': send shape [3, 4611686018427387904] of float32 is "
         "more than PTRDIFF_MAX bytes",
         "[3, 2^62] float32 allreduce");
  hvd_tensor_t small = hvd_tensor_make(f, HVD_FLOAT32, 0, NULL);
  snprintf(want, sizeof want, "allreduce 'o': recv %s", big);
  REJECT(hvd_allreduce("o", &small, &r, HVD_SUM, 1.0, 1.0), want,
         "[2^32, 2^32] recv");
  snprintf(want, sizeof want, "broadcast 'o': %s", big);
  REJECT(hvd_broadcast("o", &t, 0), want, "broadcast");
  snprintf(want, sizeof want, "allgather 'o': send %s", big);
  REJECT(hvd_allgather("o", &t, &out), want, "allgather");
  snprintf(want, sizeof want, "alltoall 'o': send %s", big);
  REJECT(hvd_alltoall("o", &t, NULL, &out, NULL), want, "alltoall");
  snprintf(want, sizeof want, "reducescatter 'o': send %s", big);
  REJECT(hvd_reducescatter("o", &t, &out, HVD_SUM, 1.0, 1.0), want,
         "reducescatter");
  /* 0 rows of [2^40, 2^40] float32: no element, but a row of 2^82 bytes
   * (hvd__row_bytes wrapped): refused by each collective in rows. */
  static const int64_t rows0[] = {0, (int64_t)1 << 40, (int64_t)1 << 40};
  hvd_tensor_t z = hvd_tensor_make(NULL, HVD_FLOAT32, 3, rows0);
  const char *row = "a row of send shape [0, 1099511627776, 1099511627776] "
                    "of float32 (dimensions 1..) is more than PTRDIFF_MAX "
                    "bytes";
  snprintf(want, sizeof want, "allgather 'o': %s", row);
  REJECT(hvd_allgather("o", &z, &out), want, "allgather of a huge row");
  snprintf(want, sizeof want, "alltoall 'o': %s", row);
  REJECT(hvd_alltoall("o", &z, NULL, &out, NULL), want,
         "alltoall of a huge row");
  snprintf(want, sizeof want, "reducescatter 'o': %s", row);
  REJECT(hvd_reducescatter("o", &z, &out, HVD_SUM, 1.0, 1.0), want,
         "reducescatter of a huge row");
  const char *names[1] = {"o"};
  hvd_tensor_t sends[1] = {t}, recvs[1] = {r};
  snprintf(want, sizeof want,
           "hvd_grouped_allreduce: tensor 0: allreduce 'o': send %s", big);
  REJECT(hvd_grouped_allreduce(1, names, sends, recvs, HVD_SUM, 1.0, 1.0), want,
         "grouped allreduce");
  hvd_param_t p = {.name = "w", .value = t};
  snprintf(want, sizeof want, "hvd_verify_parameters 'w': %s", big);
  REJECT(hvd_verify_parameters(&p, 1), want, "hvd_verify_parameters");
  if (size > 1) { /* INT64_MAX + 2 + ... wrapped */
    int64_t splits[8], one[1] = {1};
    hvd_tensor_t u = hvd_tensor_make(f, HVD_FLOAT32, 1, one);
    for (int j = 0; j < size; j++)
      splits[j] = j == 0 ? INT64_MAX : 2;
    REJECT(hvd_alltoall("o", &u, splits, &out, NULL),
           "alltoall 'o': splits sum to more than INT64_MAX but shape[0] is 1",
           "splits whose sum wraps");
  } else {
    skip(3, "one split cannot wrap");
  }
}

int main(int argc, char **argv) {
  char want[MSG_LEN];
  float f[16], g[16];
  int32_t n32[16];
  int64_t one[1] = {4}, three[1] = {3};
  int64_t splits[8];
  hvd_tensor_t t, u, out;
  hvd_request_t *req = NULL;

  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  if (size > 7)
    bail("at most 7 ranks");
  memset(f, 0, sizeof f);
  memset(g, 0, sizeof g);
  memset(n32, 0, sizeof n32);
  memset(&out, 0, sizeof out);

  /* ---- Before hvd_init ---- */
  t = hvd_tensor_make(f, HVD_FLOAT32, 1, one);
  ok(!hvd_is_initialized(), "not initialised yet");
  ok(hvd_rank() == -1 && hvd_size() == -1 && hvd_local_rank() == -1 &&
         hvd_local_size() == -1 && hvd_cross_rank() == -1 &&
         hvd_cross_size() == -1 && hvd_is_homogeneous() == -1,
     "queries return -1 before hvd_init");
  expect(hvd_allreduce("a", &t, &t, HVD_SUM, 1.0, 1.0), HVD_ERR_NOT_INITIALIZED,
         "hvd_allreduce: hvd_init() has not been called",
         "hvd_allreduce before init");
  expect(hvd_allreduce_async("a", &t, &t, HVD_SUM, 1.0, 1.0, &req),
         HVD_ERR_NOT_INITIALIZED,
         "hvd_allreduce_async: hvd_init() has not been called",
         "hvd_allreduce_async before init");
  expect(hvd_broadcast("a", &t, 0), HVD_ERR_NOT_INITIALIZED,
         "hvd_broadcast: hvd_init() has not been called",
         "hvd_broadcast before init");
  expect(hvd_allgather("a", &t, &out), HVD_ERR_NOT_INITIALIZED,
         "hvd_allgather: hvd_init() has not been called",
         "hvd_allgather before init");
  expect(hvd_barrier(), HVD_ERR_NOT_INITIALIZED,
         "hvd_barrier: hvd_init() has not been called",
         "hvd_barrier before init");
  expect(hvd_join(NULL), HVD_ERR_NOT_INITIALIZED,
         "hvd_join: hvd_init() has not been called", "hvd_join before init");
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown before init succeeds");

  if (!is_int(HVD_SUCCESS, hvd_init(), "hvd_init"))
    bail("hvd_init: %s", hvd_last_error());
  ok(hvd_is_initialized(), "initialised");

  /* ---- Names and requests ---- */
  t = hvd_tensor_make(f, HVD_FLOAT32, 1, one);
  REJECT(hvd_allreduce(NULL, &t, &t, HVD_SUM, 1.0, 1.0),
         "allreduce: name is NULL or empty", "allreduce NULL name");
  REJECT(hvd_allreduce("", &t, &t, HVD_SUM, 1.0, 1.0),
         "allreduce: name is NULL or empty", "allreduce empty name");
  REJECT(hvd_broadcast(NULL, &t, 0), "broadcast: name is NULL or empty",
         "broadcast NULL name");
  REJECT(hvd_allgather("", &t, &out), "allgather: name is NULL or empty",
         "allgather empty name");
  REJECT(hvd_allreduce_async("req", &t, &t, HVD_SUM, 1.0, 1.0, NULL),
         "allreduce 'req': req is NULL", "allreduce_async NULL req");
  REJECT(hvd_broadcast_async("req", &t, 0, NULL),
         "broadcast 'req': req is NULL", "broadcast_async NULL req");
  REJECT(hvd_barrier_async(NULL), "barrier: req is NULL",
         "barrier_async NULL req");
  int done = -1;
  REJECT(hvd_wait(NULL), "hvd_wait: req is NULL", "hvd_wait(NULL)");
  REJECT(hvd_test(NULL, &done), "hvd_test: req is NULL", "hvd_test(NULL)");
  is_int(0, done, "hvd_test(NULL) sets *done to 0");
  REJECT(hvd_cuda_stream_wait(NULL, NULL), "hvd_cuda_stream_wait: req is NULL",
         "hvd_cuda_stream_wait(NULL)");

  /* ---- Tensors ---- */
  REJECT(hvd_allreduce("t", NULL, &t, HVD_SUM, 1.0, 1.0),
         "allreduce 't': send tensor is NULL", "allreduce NULL send");
  REJECT(hvd_allreduce("t", &t, NULL, HVD_SUM, 1.0, 1.0),
         "allreduce 't': recv tensor is NULL", "allreduce NULL recv");
  REJECT(hvd_broadcast("t", NULL, 0), "broadcast 't': tensor is NULL",
         "broadcast NULL tensor");
  REJECT(hvd_allgather("t", &t, NULL), "allgather 't': recv tensor is NULL",
         "allgather NULL recv");
  REJECT(hvd_reducescatter("t", NULL, &out, HVD_SUM, 1.0, 1.0),
         "reducescatter 't': send tensor is NULL", "reducescatter NULL send");

  /* In place (send == recv), so only the one tensor is wrong. */
  u = hvd_tensor_make(f, HVD_FLOAT32, 1, one);
  u.ndim = -1;
  REJECT(hvd_allreduce("nd", &u, &u, HVD_SUM, 1.0, 1.0),
         "allreduce 'nd': ndim -1 is out of range 0..8", "ndim -1");
  u.ndim = 9;
  REJECT(hvd_broadcast("nd", &u, 0),
         "broadcast 'nd': ndim 9 is out of range 0..8", "ndim 9");
  {
    int64_t neg[2] = {2, -3};
    u = hvd_tensor_make(f, HVD_FLOAT32, 2, neg);
    REJECT(hvd_allreduce("neg", &u, &u, HVD_SUM, 1.0, 1.0),
           "allreduce 'neg': shape[1] is -3", "negative dimension");
  }
  u = hvd_tensor_make(f, HVD_FLOAT32, 1, one);
  u.dtype = (hvd_dtype_t)42;
  REJECT(hvd_allreduce("dt", &u, &u, HVD_SUM, 1.0, 1.0),
         "allreduce 'dt': unknown dtype 42", "unknown dtype 42");
  REJECT(hvd_allreduce("op", &t, &t, (hvd_op_t)9, 1.0, 1.0),
         "allreduce 'op': unknown op 9", "allreduce unknown op 9");
  REJECT(hvd_reducescatter("op", &t, &out, (hvd_op_t)9, 1.0, 1.0),
         "reducescatter 'op': unknown op 9", "reducescatter unknown op 9");

  u = hvd_tensor_make(NULL, HVD_FLOAT32, 1, one);
  t = hvd_tensor_make(g, HVD_FLOAT32, 1, one);
  REJECT(hvd_allreduce("data", &u, &t, HVD_SUM, 1.0, 1.0),
         "allreduce 'data': send data is NULL", "NULL data with 4 elements");
  {
    /* NULL data is fine when there are no elements. */
    int64_t zero[1] = {0};
    u = hvd_tensor_make(NULL, HVD_FLOAT32, 1, zero);
    hvd_result_t rc = hvd_allreduce("empty", &u, &u, HVD_SUM, 1.0, 1.0);
    tap_note("%s", hvd_last_error());
    is_int(HVD_SUCCESS, rc, "NULL data with 0 elements is accepted");
  }

  /* ---- Roots, recv, scale factors ---- */
  t = hvd_tensor_make(f, HVD_FLOAT32, 1, one);
  snprintf(want, sizeof want,
           "broadcast 'root': root %d is out of range for %d ranks", size,
           size);
  REJECT(hvd_broadcast("root", &t, size), want, "root == size");
  snprintf(want, sizeof want,
           "broadcast 'root': root -1 is out of range for %d ranks", size);
  REJECT(hvd_broadcast("root", &t, -1), want, "root -1");

  u = hvd_tensor_make(n32, HVD_INT32, 1, one);
  REJECT(hvd_allreduce("rd", &t, &u, HVD_SUM, 1.0, 1.0),
         "allreduce 'rd': recv dtype int32 differs from send dtype float32",
         "recv dtype differs");
  u = hvd_tensor_make(g, HVD_FLOAT32, 1, three);
  REJECT(hvd_allreduce("rs", &t, &u, HVD_SUM, 1.0, 1.0),
         "allreduce 'rs': recv shape [3] differs from send shape [4]",
         "recv shape differs");

  u = hvd_tensor_make(n32, HVD_INT32, 1, one);
  REJECT(hvd_allreduce("ps", &u, &u, HVD_SUM, 0.5, 1.0),
         "allreduce 'ps': prescale 0.5 needs a floating-point dtype, not int32",
         "int32 prescale 0.5");
  REJECT(hvd_allreduce("ps", &u, &u, HVD_AVERAGE, 1.0, 2.0),
         "allreduce 'ps': postscale 2 needs a floating-point dtype, not int32",
         "int32 postscale 2");
  {
    int64_t n64[4] = {0, 0, 0, 0};
    u = hvd_tensor_make(n64, HVD_INT64, 1, one);
    REJECT(hvd_reducescatter("ps", &u, &out, HVD_SUM, 0.5, 1.0),
           "reducescatter 'ps': prescale 0.5 needs a floating-point dtype, "
           "not int64",
           "reducescatter int64 prescale 0.5");
  }

  /* ---- Collectives that need a dimension 0 ---- */
  u = hvd_tensor_make(f, HVD_FLOAT32, 0, one);
  REJECT(hvd_allgather("z", &u, &out),
         "allgather 'z': needs at least 1 dimension", "allgather of a scalar");
  REJECT(hvd_alltoall("z", &u, NULL, &out, NULL),
         "alltoall 'z': needs at least 1 dimension", "alltoall of a scalar");
  REJECT(hvd_reducescatter("z", &u, &out, HVD_SUM, 1.0, 1.0),
         "reducescatter 'z': needs at least 1 dimension",
         "reducescatter of a scalar");

  /* ---- Alltoall splits ---- */
  {
    int64_t rows[1] = {6};
    u = hvd_tensor_make(f, HVD_FLOAT32, 1, rows);
    /* Sum to 6, but the last is -1 (at one rank, the only one is -1). */
    for (int j = 0; j < size; j++)
      splits[j] = 1;
    splits[size - 1] = -1;
    if (size > 1)
      splits[0] = 6 - (size - 2) + 1;
    snprintf(want, sizeof want, "alltoall 'sp': splits[%d] is -1", size - 1);
    REJECT(hvd_alltoall("sp", &u, splits, &out, NULL), want, "negative split");

    for (int j = 0; j < size; j++)
      splits[j] = 1;
    rows[0] = size + 1;
    u = hvd_tensor_make(f, HVD_FLOAT32, 1, rows);
    snprintf(want, sizeof want,
             "alltoall 'sp': splits sum to %d but shape[0] is %d", size,
             size + 1);
    REJECT(hvd_alltoall("sp", &u, splits, &out, NULL), want,
           "splits sum differs from shape[0]");

    if (size > 1) {
      rows[0] = 2 * size + 1;
      u = hvd_tensor_make(f, HVD_FLOAT32, 1, rows);
      snprintf(want, sizeof want,
               "alltoall 'sp': shape[0] %d does not divide evenly among %d "
               "ranks; pass splits",
               2 * size + 1, size);
      REJECT(hvd_alltoall("sp", &u, NULL, &out, NULL), want,
             "uneven split without splits");
    } else {
      skip(4, "every shape[0] divides among 1 rank");
    }
  }

  test_overflow();

  /* ---- Device tensors: unsupported without CUDA; with CUDA, a tensor
   * on another GPU than the rank's is refused (t/gpu/collectives checks
   * the whole message on a GPU; here cuda:1000 is surely not ours) ---- */
  if (!hvd_cuda_built()) {
    u = hvd_tensor_make(f, HVD_FLOAT32, 1, one);
    u.device = 0;
    expect(hvd_allreduce("dev", &u, &u, HVD_SUM, 1.0, 1.0), HVD_ERR_UNSUPPORTED,
           "allreduce 'dev': device 0 tensors are not supported by this build",
           "device tensor");
    allreduce_works("device tensor");
  } else {
    static const char head[] =
        "allreduce 'dev': tensor is on cuda:1000 but this rank ";
    char seen[MSG_LEN];
    u = hvd_tensor_make(f, HVD_FLOAT32, 1, one);
    u.device = 1000;
    hvd_result_t rc = hvd_allreduce("dev", &u, &u, HVD_SUM, 1.0, 1.0);
    snprintf(seen, sizeof seen, "%s", hvd_last_error());
    is_int(HVD_ERR_INVALID_ARG, rc, "device tensor on another GPU: result");
    tap_note("message: %s", seen);
    ok(strncmp(seen, head, sizeof head - 1) == 0 &&
           (strstr(seen, " uses cuda:") != NULL ||
            strstr(seen, " has no CUDA device") != NULL),
       "device tensor on another GPU: message");
    allreduce_works("device tensor on another GPU");
  }

  /* ---- A name already in flight on this rank ----
   * Each rank in turn submits 'dup' first, alone, so it cannot complete,
   * and submits it again; only then do the others submit theirs. (Alone
   * in the job, a rank's first 'dup' may complete at once.) */
  if (size == 1) {
    skip(5, "a request is surely in flight only with 2 ranks or more");
  } else {
    hvd_result_t first = HVD_ERR_INTERNAL, again = HVD_ERR_INTERNAL;
    hvd_result_t waited = HVD_ERR_INTERNAL;
    char again_msg[MSG_LEN] = "";
    int values_ok = 1;
    for (int h = 0; h < size; h++) {
      float x[4], y[4], z[4];
      hvd_result_t rc1 = HVD_ERR_INTERNAL, rc2, rcw;
      hvd_request_t *r1 = NULL, *r2 = NULL;
      for (int i = 0; i < 4; i++)
        x[i] = (float)(rank + i);
      t = hvd_tensor_make(x, HVD_FLOAT32, 1, one);
      u = hvd_tensor_make(y, HVD_FLOAT32, 1, one);
      if (rank == h) {
        hvd_tensor_t v = hvd_tensor_make(z, HVD_FLOAT32, 1, one);
        rc1 = hvd_allreduce_async("dup", &t, &u, HVD_SUM, 1.0, 1.0, &r1);
        rc2 = hvd_allreduce_async("dup", &t, &v, HVD_SUM, 1.0, 1.0, &r2);
        snprintf(again_msg, sizeof again_msg, "%s", hvd_last_error());
        first = rc1;
        again = rc2;
      }
      MPI_Barrier(MPI_COMM_WORLD);
      if (rank != h)
        rc1 = hvd_allreduce_async("dup", &t, &u, HVD_SUM, 1.0, 1.0, &r1);
      rcw = rc1 == HVD_SUCCESS ? hvd_wait(r1) : rc1;
      if (rank == h)
        waited = rcw;
      for (int i = 0; i < 4; i++)
        if (rcw != HVD_SUCCESS ||
            y[i] != (float)(size * (size - 1) / 2 + size * i))
          values_ok = 0;
    }
    is_int(HVD_SUCCESS, first, "dup: first submission accepted");
    is_int(HVD_ERR_INVALID_ARG, again, "dup: second submission rejected");
    is_string(
        "allreduce 'dup': a collective named 'dup' is already in flight on "
        "this rank",
        again_msg, "dup: message");
    is_int(HVD_SUCCESS, waited, "dup: the first one then completes");
    ok(values_ok, "dup: every round summed correctly");
  }
  allreduce_works("duplicate name");

  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
