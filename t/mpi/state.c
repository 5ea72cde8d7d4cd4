/*
 * state.c - hvd_state_* (committed training state for elastic jobs) at
 * any world size, exact values throughout:
 *   - argument errors with their messages;
 *   - in memory: a commit, then the model, the optimizer (its state, lr
 *     and steps) and the counters changed by training on; restore puts
 *     the commit back bit for bit; also with a sharded (ZeRO-1) optimizer;
 *   - a file every 2nd commit: none after the 1st, there after the 2nd; a
 *     new state over a fresh model and optimizer (as a relaunched job)
 *     restores the 2nd commit from the file, counters and commit count
 *     included; the file is a checkpoint with counters that
 *     hvd_checkpoint_load reads (ignoring the counters);
 *   - in memory, the copy failing on the last rank alone (a huge
 *     parameter there): every rank fails naming it, none restores;
 *   - a restore with a NULL state or restored on the last rank alone
 *     (the others' state with a file, or a commit in memory): every rank
 *     fails naming it, nothing restored, then a restore and an
 *     allreduce work;
 *   - in memory, the copy back failing on the last rank alone (its
 *     parameter on a device that no machine has): every rank fails
 *     naming it, then a restore and an allreduce work;
 *   - in memory, a parameter reshaped on the last rank alone since the
 *     commit: every rank fails the restore naming it, nothing changed;
 *     grown between two commits: the second copies it whole;
 *   - no file: a fresh start (restored 0, nothing changed);
 *   - a plain checkpoint (no counters) in its place: HVD_ERR_CORRUPT "... the
 * file has no counter 'epoch' ...";
 *   - file commits in the background (hvd_state_set_background): the
 *     file a synchronous commit writes, another save refused meanwhile
 *     naming hvd_state_wait, destroy (not collective) finishing the last
 *     write, a write's
 *     failure returned by the wait on every rank with its message;
 *   - counter names starting with "hvd." refused (hvd's own); a file of
 *     an earlier build with a program's "hvd.loss_scale" before the
 *     loss scaler's loads the scaler's;
 *   - hvd_elastic_restarts/previous_size from HVD_ELASTIC_*.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mpi.h>

#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

static int rank, size;

#define NP 3
static const int64_t counts[NP] = {5, 1, 1000};

typedef struct model {
  hvd_param_t p[NP];
  float v[NP][1000], g[NP][1000];
} model_t;

static void model_init(model_t *m, float base) {
  static const char *const names[NP] = {"w", "b", "big"};
  for (int i = 0; i < NP; i++) {
    for (int64_t j = 0; j < counts[i]; j++)
      m->v[i][j] = base + (float)(i * 1000 + j) * 0.25f;
    memset(m->g[i], 0, sizeof m->g[i]);
    m->p[i].name = names[i];
    m->p[i].value = hvd_tensor_make(m->v[i], HVD_FLOAT32, 1, &counts[i]);
    m->p[i].grad = hvd_tensor_make(m->g[i], HVD_FLOAT32, 1, &counts[i]);
  }
}

/* One distributed step with gradients from (k, rank). */
static int train(model_t *m, hvd_optimizer_t *o, int k) {
  int good = hvd_optimizer_zero_grad(o) == HVD_SUCCESS;
  for (int i = NP - 1; i >= 0; i--) {
    for (int64_t j = 0; j < counts[i]; j++)
      m->g[i][j] = (float)((j + k + rank) % 7) * 0.125f;
    good &= hvd_optimizer_grad_ready(o, i) == HVD_SUCCESS;
  }
  return good && hvd_optimizer_step(o) == HVD_SUCCESS;
}

static hvd_optimizer_t *adam(model_t *m, int shard) {
  hvd_adam_options_t ao;
  hvd_distributed_options_t d;
  hvd_optimizer_t *base = NULL, *o = NULL;
  hvd_adam_options_init(&ao);
  ao.lr = 0.01;
  hvd_distributed_options_init(&d);
  d.shard_optimizer_state = shard;
  if (hvd_adam_create(m->p, NP, &ao, &base) != HVD_SUCCESS ||
      hvd_distributed_optimizer(base, &d, &o) != HVD_SUCCESS)
    bail("optimizer: %s", hvd_last_error());
  return o;
}

static int same_model(const model_t *a, const model_t *b) {
  for (int i = 0; i < NP; i++)
    if (memcmp(a->v[i], b->v[i], sizeof(float) * (size_t)counts[i]) != 0)
      return 0;
  return 1;
}

/* The test's huge tensor must fail its malloc under AddressSanitizer
 * and ThreadSanitizer too (which abort on such a size unless told
 * otherwise; TSAN_OPTIONS from the environment still apply on top). */
const char *__asan_default_options(void);
const char *__asan_default_options(void) {
  return "allocator_may_return_null=1";
}
const char *__tsan_default_options(void);
const char *__tsan_default_options(void) {
  return "allocator_may_return_null=1";
}

/* hvd_state_commit(NULL) on the last rank alone: it takes part in the
 * commit's agreement, so every rank fails with its message and counts no
 * commit. (Before, it returned at once and the others waited for it.) */
static void test_null_on_one(void) {
  static float w[4] = {1, 2, 3, 4};
  int64_t four = 4, step = 7;
  int last = size - 1;
  hvd_param_t p = {"w", hvd_tensor_make(w, HVD_FLOAT32, 1, &four),
                   hvd_tensor_make(w, HVD_FLOAT32, 1, &four)};
  hvd_state_t *st = NULL;
  if (hvd_state_create(NULL, 1, &st) != HVD_SUCCESS ||
      hvd_state_add_params(st, &p, 1, NULL) != HVD_SUCCESS ||
      hvd_state_add_counter(st, "step", &step) != HVD_SUCCESS)
    bail("state: %s", hvd_last_error());
  char want[256] = "hvd_state_commit: state is NULL";
  if (last != 0)
    snprintf(want + strlen(want), sizeof want - strlen(want), " (on rank %d)",
             last);
  is_int(HVD_ERR_INVALID_ARG, hvd_state_commit(rank == last ? NULL : st),
         "commit with state NULL on rank %d alone: every rank fails", last);
  is_string(want, hvd_last_error(), "  with that rank's message");
  is_int(0, (int)hvd_state_commits(st), "  no rank counts the commit");
  is_int(HVD_SUCCESS, hvd_state_commit(st), "  then a commit works");
  is_int(1, (int)hvd_state_commits(st), "  and is counted");
  hvd_state_destroy(st);
}

/* "<fn>: <what>", naming rank r when it is not rank 0 (as
 * hvd__optim_agree does). */
static void from_rank(char *out, size_t cap, const char *msg, int r) {
  snprintf(out, cap, "%s", msg);
  if (r != 0)
    snprintf(out + strlen(out), cap - strlen(out), " (on rank %d)", r);
}

/* A collective after a failure: an allreduce of the ranks' numbers. */
static void allreduce_works(const char *what) {
  int32_t x = rank + 1, sum = -1;
  int64_t one = 1;
  hvd_tensor_t in = hvd_tensor_make(&x, HVD_INT32, 1, &one),
               out = hvd_tensor_make(&sum, HVD_INT32, 1, &one);
  is_int(HVD_SUCCESS, hvd_allreduce(what, &in, &out, HVD_SUM, 1.0, 1.0),
         "  then an allreduce works");
  is_int(size * (size + 1) / 2, sum, "  and sums the ranks");
}

/* One parameter w of 4 floats and a counter step: a state on path (NULL:
 * memory only). */
typedef struct small {
  float w[4];
  int64_t four, step;
  hvd_param_t p;
  hvd_state_t *st;
} small_t;

static void small_init(small_t *m, const char *path) {
  static const float w0[4] = {1, 2, 3, 4};
  memcpy(m->w, w0, sizeof m->w);
  m->four = 4;
  m->step = 7;
  m->p = (hvd_param_t){"w", hvd_tensor_make(m->w, HVD_FLOAT32, 1, &m->four),
                       hvd_tensor_make(m->w, HVD_FLOAT32, 1, &m->four)};
  m->st = NULL;
  if (hvd_state_create(path, 1, &m->st) != HVD_SUCCESS ||
      hvd_state_add_params(m->st, &m->p, 1, NULL) != HVD_SUCCESS ||
      hvd_state_add_counter(m->st, "step", &m->step) != HVD_SUCCESS)
    bail("state: %s", hvd_last_error());
}

/* hvd_state_restore with a NULL state (or restored) on the last rank
 * alone: every rank fails with its message, nothing restored, and the
 * next restore and an allreduce work. The other ranks' states: one with
 * a file and no commit in this process (they look for the file: before,
 * they waited in that broadcast for the stall inspector), and one in
 * memory with a commit (before, they restored it and succeeded). */
static void test_restore_null_on_one(const char *dir) {
  char path[1100], want[256];
  int last = size - 1, restored = -1;
  small_t m;
  snprintf(path, sizeof path, "%s/null-restore.ckpt", dir);
  small_init(&m, path);
  from_rank(want, sizeof want, "hvd_state_restore: state is NULL", last);
  is_int(HVD_ERR_INVALID_ARG,
         hvd_state_restore(rank == last ? NULL : m.st, &restored),
         "restore of a file state, NULL on rank %d alone: every rank fails",
         last);
  is_string(want, hvd_last_error(), "  with that rank's message");
  ok(restored == (rank == last ? -1 : 0), "  nothing restored (%d)",
     restored);
  is_int(HVD_SUCCESS, hvd_state_restore(m.st, &restored),
         "  then a restore works");
  is_int(0, restored, "  and finds no file");
  allreduce_works("hvd.test.state.null.file");
  hvd_state_destroy(m.st);

  small_init(&m, NULL);
  if (hvd_state_commit(m.st) != HVD_SUCCESS)
    bail("commit: %s", hvd_last_error());
  m.step = 9;
  restored = -1;
  is_int(HVD_ERR_INVALID_ARG,
         hvd_state_restore(rank == last ? NULL : m.st, &restored),
         "restore of a commit in memory, NULL on rank %d alone: every rank "
         "fails",
         last);
  is_string(want, hvd_last_error(), "  with that rank's message");
  ok(m.step == 9 && restored == (rank == last ? -1 : 0),
     "  nothing restored (%d, step %lld)", restored, (long long)m.step);
  from_rank(want, sizeof want, "hvd_state_restore: restored is NULL", last);
  is_int(HVD_ERR_INVALID_ARG,
         hvd_state_restore(m.st, rank == last ? NULL : &restored),
         "restore with restored NULL on rank %d alone: every rank fails",
         last);
  is_string(want, hvd_last_error(), "  with that rank's message");
  is_int(9, (int)m.step, "  nothing restored");
  is_int(HVD_SUCCESS, hvd_state_restore(m.st, &restored),
         "  then a restore works");
  ok(restored == 1 && m.step == 7, "  and restores the commit (%d, step %lld)",
     restored, (long long)m.step);
  allreduce_works("hvd.test.state.null.memory");
  hvd_state_destroy(m.st);
}

/* The copy back of a commit in memory failing on the last rank alone: its
 * w claims a device that no machine has (ordinal 1000; w is on the host
 * at the commit), so copying it back fails there (in a build without
 * CUDA, HVD_ERR_UNSUPPORTED "...: device tensors need a build with
 * CUDA"; with CUDA, cudaSetDevice's HVD_ERR_CUDA). Every rank fails with
 * that rank's code and message and restores nothing; then, w on the host
 * again, a restore puts the commit back everywhere and an allreduce
 * works. (Before, the other ranks restored and returned HVD_SUCCESS.) */
static void test_restore_fails_on_one(void) {
  int last = size - 1, restored = -1, cuda = hvd_cuda_built() != 0;
  char want[256], msg[512] = {0}, tail[64] = "";
  small_t m;
  small_init(&m, NULL);
  if (hvd_state_commit(m.st) != HVD_SUCCESS)
    bail("commit: %s", hvd_last_error());
  m.step = 9;
  m.w[0] = -1;
  if (rank == last)
    m.p.value.device = 1000;
  hvd_result_t rc = hvd_state_restore(m.st, &restored);
  m.p.value.device = HVD_CPU;
  snprintf(msg, sizeof msg, "%s", hvd_last_error());
  if (last != 0)
    snprintf(tail, sizeof tail, " (on rank %d)", last);
  size_t n = strlen(msg), t = strlen(tail);
  is_int(cuda ? HVD_ERR_CUDA : HVD_ERR_UNSUPPORTED, rc,
         "restore in memory failing on rank %d alone: every rank fails", last);
  if (cuda) {
    ok(strncmp(msg, "hvd_state_restore: cudaSetDevice: ", 34) == 0 &&
           n >= t && strcmp(msg + n - t, tail) == 0,
       "  with that rank's message (%s)", msg);
    ok(hvdt_same_on_all_ranks(msg, sizeof msg), "  the same on every rank");
  } else {
    from_rank(want, sizeof want,
              "hvd_state_restore: device tensors need a build with CUDA",
              last);
    is_string(want, msg, "  with that rank's message");
  }
  is_int(0, restored, "  restored 0 on every rank");
  is_int(HVD_SUCCESS, hvd_state_restore(m.st, &restored),
         "  then, w on the host again, a restore works");
  ok(restored == 1 && m.step == 7 && m.w[0] == 1,
     "  and puts the commit back (%d, step %lld, w[0] %g)", restored,
     (long long)m.step, (double)m.w[0]);
  allreduce_works("hvd.test.state.restore.fails");
  hvd_state_destroy(m.st);
}

/* w reshaped on the last rank alone since the commit in memory (2 floats
 * where 4 were committed): every rank fails the restore with that rank's
 * message before anything is copied back, so nothing changes on any
 * rank; w as committed again, the restore works. (Before, the other
 * ranks restored, and the last one copied back 8 of the 16 bytes, all
 * with HVD_SUCCESS; grown instead, it read past the copy.) Then w grown
 * on the last rank between two commits (2 floats, then 4): the second
 * commit copies all 4 (before, it wrote past the first one's copy, which
 * AddressSanitizer reports) and a restore puts them back. */
static void test_restore_reshaped(void) {
  int last = size - 1, restored = -1;
  int64_t two = 2;
  char want[256];
  small_t m;
  small_init(&m, NULL);
  if (hvd_state_commit(m.st) != HVD_SUCCESS)
    bail("commit: %s", hvd_last_error());
  m.step = 9;
  m.w[0] = m.w[3] = -1;
  if (rank == last)
    m.p.value = hvd_tensor_make(m.w, HVD_FLOAT32, 1, &two);
  from_rank(want, sizeof want,
            "hvd_state_restore: parameter 'w' has 8 bytes but 16 at the "
            "commit",
            last);
  is_int(HVD_ERR_INVALID_ARG, hvd_state_restore(m.st, &restored),
         "restore with w reshaped on rank %d alone: every rank fails", last);
  is_string(want, hvd_last_error(), "  with that rank's message");
  ok(restored == 0 && m.step == 9 && m.w[0] == -1 && m.w[3] == -1,
     "  nothing changed on any rank (%d, step %lld, w[0] %g)", restored,
     (long long)m.step, (double)m.w[0]);
  m.p.value = hvd_tensor_make(m.w, HVD_FLOAT32, 1, &m.four);
  is_int(HVD_SUCCESS, hvd_state_restore(m.st, &restored),
         "  then, w as committed, a restore works");
  ok(restored == 1 && m.step == 7 && m.w[0] == 1 && m.w[3] == 4,
     "  and puts the commit back (%d, step %lld, w[0] %g, w[3] %g)",
     restored, (long long)m.step, (double)m.w[0], (double)m.w[3]);
  allreduce_works("hvd.test.state.reshaped");
  hvd_state_destroy(m.st);

  small_init(&m, NULL);
  m.p.value = hvd_tensor_make(m.w, HVD_FLOAT32, 1, &two);
  if (hvd_state_commit(m.st) != HVD_SUCCESS)
    bail("commit: %s", hvd_last_error());
  if (rank == last)
    m.p.value = hvd_tensor_make(m.w, HVD_FLOAT32, 1, &m.four);
  is_int(HVD_SUCCESS, hvd_state_commit(m.st),
         "a commit with w grown on rank %d since the last", last);
  m.w[0] = m.w[3] = -1;
  is_int(HVD_SUCCESS, hvd_state_restore(m.st, &restored),
         "  then a restore works");
  ok(restored == 1 && m.w[0] == 1 && m.w[3] == (rank == last ? 4 : -1),
     "  and puts back what each rank committed (w[0] %g, w[3] %g)",
     (double)m.w[0], (double)m.w[3]);
  hvd_state_destroy(m.st);
}

/* A memory-only commit (path NULL) whose copy cannot be made on the last
 * rank alone: its parameter claims 2^50 floats there (4 PiB: no malloc
 * gives it; nothing reads it), as an allocation failure on one rank.
 * Every rank fails with that rank's HVD_ERR_NO_MEMORY and counts no
 * commit, and a restore restores nothing on every rank. (Before, the
 * other ranks kept their copy and restored it alone.) */
static void test_memory_fails_on_one(void) {
  static float w[4] = {1, 2, 3, 4};
  int64_t small = 4, huge = (int64_t)1 << 50, step = 7;
  int last = size - 1, restored = -1;
  hvd_param_t p = {"w", hvd_tensor_make(w, HVD_FLOAT32, 1, &small),
                   hvd_tensor_make(w, HVD_FLOAT32, 1, &small)};
  if (rank == last)
    p.value = hvd_tensor_make(w, HVD_FLOAT32, 1, &huge);
  hvd_state_t *st = NULL;
  if (hvd_state_create(NULL, 1, &st) != HVD_SUCCESS ||
      hvd_state_add_params(st, &p, 1, NULL) != HVD_SUCCESS ||
      hvd_state_add_counter(st, "step", &step) != HVD_SUCCESS)
    bail("state: %s", hvd_last_error());
  char want[256] = "hvd_state_commit: out of memory for the committed copy";
  if (last != 0)
    snprintf(want + strlen(want), sizeof want - strlen(want), " (on rank %d)",
             last);
  is_int(HVD_ERR_NO_MEMORY, hvd_state_commit(st),
         "memory commit failing on rank %d alone: every rank fails", last);
  is_string(want, hvd_last_error(), "  with that rank's message");
  is_int(0, (int)hvd_state_commits(st), "  no rank counts the commit");
  step = 9;
  is_int(HVD_SUCCESS, hvd_state_restore(st, &restored), "  restore works");
  ok(restored == 0 && step == 9,
     "  and restores nothing on every rank (restored %d, step %lld)", restored,
     (long long)step);
  hvd_state_destroy(st);
}

/* Each NULL or empty argument of the hvd_state_* calls, and the 17th
 * counter (at most 16): its code and exact message. */
static void test_null_args(hvd_state_t *st) {
  static const struct {
    int call;
    const char *msg;
  } want[] = {
      {0, "hvd_state_create: out is NULL"},
      {1, "hvd_state_add_params: state is NULL"},
      {2, "hvd_state_add_params: n is negative"},
      {3, "hvd_state_add_params: params is NULL"},
      {4, "hvd_state_add_counter: state is NULL"},
      {5, "hvd_state_add_counter: value is NULL"},
      {6, "hvd_state_add_counter: the name is empty or NULL"},
      {7, "hvd_state_add_counter: the name is empty or NULL"},
      {8, "hvd_state_commit: state is NULL"},
      {9, "hvd_state_restore: state is NULL"},
      {10, "hvd_state_restore: restored is NULL"},
  };
  int64_t v = 0;
  int restored = 0;
  hvd_param_t p;
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    hvd_result_t rc = HVD_SUCCESS;
    switch (want[i].call) {
    case 0:
      rc = hvd_state_create(NULL, 1, NULL);
      break;
    case 1:
      rc = hvd_state_add_params(NULL, &p, 1, NULL);
      break;
    case 2:
      rc = hvd_state_add_params(st, &p, -1, NULL);
      break;
    case 3:
      rc = hvd_state_add_params(st, NULL, 1, NULL);
      break;
    case 4:
      rc = hvd_state_add_counter(NULL, "c", &v);
      break;
    case 5:
      rc = hvd_state_add_counter(st, "c", NULL);
      break;
    case 6:
      rc = hvd_state_add_counter(st, "", &v);
      break;
    case 7:
      rc = hvd_state_add_counter(st, NULL, &v);
      break;
    case 8:
      rc = hvd_state_commit(NULL);
      break;
    case 9:
      rc = hvd_state_restore(NULL, &restored);
      break;
    case 10:
      rc = hvd_state_restore(st, NULL);
      break;
    }
    is_int(HVD_ERR_INVALID_ARG, rc, "%s: code", want[i].msg);
    is_string(want[i].msg, hvd_last_error(), "%s: message", want[i].msg);
  }
  /* the state holds counter 'a': 15 more fit, the 17th does not */
  static int64_t more[16];
  char name[16];
  int good = 1;
  for (int k = 0; k < 15; k++) {
    snprintf(name, sizeof name, "c%d", k);
    good &= hvd_state_add_counter(st, name, &more[k]) == HVD_SUCCESS;
  }
  ok(good, "16 counters in all");
  is_int(HVD_ERR_INVALID_ARG, hvd_state_add_counter(st, "c15", &more[15]),
         "a 17th counter");
  is_string("hvd_state_add_counter: 'c15': at most 16 counters",
            hvd_last_error(), "a 17th counter: message");
}

static void test_errors(void) {
  hvd_state_t *st = NULL;
  is_int(HVD_ERR_INVALID_ARG, hvd_state_create(NULL, 0, &st), "save_every 0");
  is_string("hvd_state_create: save_every 0 is below 1", hvd_last_error(),
            "... message");
  is_int(HVD_ERR_INVALID_ARG, hvd_state_create("", 1, &st), "empty path");
  is_int(HVD_SUCCESS, hvd_state_create(NULL, 1, &st), "memory only");
  int64_t a = 0;
  is_int(HVD_SUCCESS, hvd_state_add_counter(st, "a", &a), "counter a");
  is_int(HVD_ERR_INVALID_ARG, hvd_state_add_counter(st, "a", &a),
         "counter a again");
  is_string("hvd_state_add_counter: counter 'a' is there already",
            hvd_last_error(), "... message");
  model_t m;
  model_init(&m, 0);
  hvd_optimizer_t *o = adam(&m, 0);
  is_int(HVD_ERR_INVALID_ARG, hvd_state_add_params(st, m.p, 2, o),
         "params and optimizer of different counts");
  is_string("hvd_state_add_params: the optimizer has 3 parameters but n is 2",
            hvd_last_error(), "... message");
  is_int(HVD_SUCCESS, hvd_state_add_params(st, m.p, NP, o), "the model");
  is_int(HVD_ERR_INVALID_ARG, hvd_state_add_params(st, m.p, NP, o),
         "a second model");
  int restored = -1;
  is_int(HVD_SUCCESS, hvd_state_restore(st, &restored),
         "restore before any commit, no file");
  is_int(0, restored, "... nothing restored");
  test_null_args(st);
  hvd_state_destroy(st);
  hvd_state_destroy(NULL);
  hvd_optimizer_destroy(o);
}

/* commit, train on, restore: bit for bit */
static void test_memory(int shard) {
  const char *what = shard ? "sharded" : "unsharded";
  model_t m, saved;
  model_init(&m, 1);
  hvd_optimizer_t *o = adam(&m, shard);
  hvd_state_t *st = NULL;
  int64_t step = 0, epoch = 0;
  int good = hvd_state_create(NULL, 1, &st) == HVD_SUCCESS &&
             hvd_state_add_params(st, m.p, NP, o) == HVD_SUCCESS &&
             hvd_state_add_counter(st, "step", &step) == HVD_SUCCESS &&
             hvd_state_add_counter(st, "epoch", &epoch) == HVD_SUCCESS;
  for (int k = 0; k < 3; k++)
    good &= train(&m, o, k);
  step = 3, epoch = 1;
  good &= hvd_state_commit(st) == HVD_SUCCESS;
  saved = m;
  for (int k = 3; k < 6; k++)
    good &= train(&m, o, k);
  step = 6, epoch = 2;
  hvd_optimizer_set_lr(o, 0.5);
  int restored = 0;
  good &= hvd_state_restore(st, &restored) == HVD_SUCCESS && restored == 1;
  ok(good && same_model(&m, &saved) && step == 3 && epoch == 1 &&
         hvd_optimizer_lr(o) == 0.01 && hvd_optimizer_steps(o) == 3,
     "%s: restore puts back the commit: values, counters, lr, steps", what);
  /* the optimizer state too: two steps from the restored commit, twice,
   * give the same bits (without its state the second would go on from
   * the first's) */
  for (int k = 3; k < 5; k++)
    good &= train(&m, o, k);
  model_t first = m;
  good &= hvd_state_restore(st, &restored) == HVD_SUCCESS;
  for (int k = 3; k < 5; k++)
    good &= train(&m, o, k);
  ok(good && same_model(&m, &first),
     "%s: the optimizer state too: two steps from the restored commit, "
     "twice, give the same bits",
     what);
  is_int(1, (int)hvd_state_commits(st), "%s: one commit", what);
  hvd_state_destroy(st);
  hvd_optimizer_destroy(o);
}

static void test_file(const char *dir) {
  char path[1100];
  snprintf(path, sizeof path, "%s/model.state", dir);
  model_t m, at2;
  model_init(&m, 2);
  hvd_optimizer_t *o = adam(&m, 0);
  hvd_state_t *st = NULL;
  int64_t step = 0, epoch = 0;
  int good = hvd_state_create(path, 2, &st) == HVD_SUCCESS &&
             hvd_state_add_params(st, m.p, NP, o) == HVD_SUCCESS &&
             hvd_state_add_counter(st, "step", &step) == HVD_SUCCESS &&
             hvd_state_add_counter(st, "epoch", &epoch) == HVD_SUCCESS;
  struct stat sb;
  good &= train(&m, o, 0);
  step = 1;
  good &= hvd_state_commit(st) == HVD_SUCCESS;
  int none = stat(path, &sb) != 0;
  good &= train(&m, o, 1);
  step = 2, epoch = 7;
  good &= hvd_state_commit(st) == HVD_SUCCESS;
  at2 = m;
  int there = rank != 0 || stat(path, &sb) == 0;
  good &= train(&m, o, 2);
  step = 3;
  good &= hvd_state_commit(st) == HVD_SUCCESS; /* 3rd: memory only */
  ok(good && none && there,
     "save_every 2: no file after the 1st commit, one after the 2nd");

  /* a relaunched job: a fresh model and optimizer, a new state */
  model_t f;
  model_init(&f, -5);
  hvd_optimizer_t *fo = adam(&f, 0);
  hvd_state_t *fs = NULL;
  int64_t fstep = -1, fepoch = -1;
  int restored = 0;
  good = hvd_state_create(path, 2, &fs) == HVD_SUCCESS &&
         hvd_state_add_params(fs, f.p, NP, fo) == HVD_SUCCESS &&
         hvd_state_add_counter(fs, "epoch", &fepoch) == HVD_SUCCESS &&
         hvd_state_add_counter(fs, "step", &fstep) == HVD_SUCCESS;
  is_int(HVD_SUCCESS, hvd_state_restore(fs, &restored),
         "restore from the file");
  ok(good && restored == 1 && same_model(&f, &at2) && fstep == 2 &&
         fepoch == 7 && hvd_state_commits(fs) == 2 &&
         hvd_optimizer_steps(fo) == 2,
     "a new state restores the 2nd commit from the file: values, counters "
     "(by name), 2 commits, 2 optimizer steps");
  /* both go on equally: the optimizer state came back too */
  m = at2;
  hvd_state_restore(st, &restored); /* st's newest is the 3rd: back to it */
  good = train(&f, fo, 2) && same_model(&f, &m);
  ok(good, "the restored optimizer's next step equals the original's");

  /* the file is a checkpoint */
  model_t c;
  model_init(&c, 9);
  int64_t cstep = 0;
  is_int(HVD_SUCCESS, hvd_checkpoint_load(path, c.p, NP, NULL, &cstep),
         "hvd_checkpoint_load reads the state file");
  ok(same_model(&c, &at2) && cstep == 2,
     "... the 2nd commit's values, its commit number as the step");

  /* a plain checkpoint (no counters) where the state file should be */
  char v1[1100];
  snprintf(v1, sizeof v1, "%s/plain.ckpt", dir);
  is_int(HVD_SUCCESS, hvd_checkpoint_save(v1, c.p, NP, NULL, 4),
         "a plain checkpoint");
  hvd_state_t *ps = NULL;
  int64_t e = 0;
  hvd_state_create(v1, 1, &ps);
  hvd_state_add_params(ps, c.p, NP, NULL);
  hvd_state_add_counter(ps, "epoch", &e);
  char want[1400];
  snprintf(want, sizeof want,
           "hvd_checkpoint_load: '%s': the file has no counter 'epoch' (it "
           "was not saved by hvd_state_commit)",
           v1);
  is_int(HVD_ERR_CORRUPT, hvd_state_restore(ps, &restored),
         "restore from a plain checkpoint");
  is_string(want, hvd_last_error(), "... message");
  is_int(0, restored, "... nothing restored");
  hvd_state_destroy(ps);
  hvd_state_destroy(fs);
  hvd_state_destroy(st);
  hvd_optimizer_destroy(o);
  hvd_optimizer_destroy(fo);
}

/* A state of m and o committing to path every commit, in the background
 * when bg, with the counter step; bails on failure. */
static hvd_state_t *state_of(const char *path, model_t *m, hvd_optimizer_t *o,
                             int64_t *step, int bg) {
  hvd_state_t *st = NULL;
  if (hvd_state_create(path, 1, &st) != HVD_SUCCESS ||
      hvd_state_add_params(st, m->p, NP, o) != HVD_SUCCESS ||
      hvd_state_add_counter(st, "step", step) != HVD_SUCCESS ||
      hvd_state_set_background(st, bg) != HVD_SUCCESS)
    bail("hvd_state: %s", hvd_last_error());
  return st;
}

/* Counter names starting with "hvd." are hvd's own: refused, with the
 * name. A file of an earlier build that has a program's counter
 * "hvd.loss_scale" (7) before the loss scaler's own (scale 1024): a load
 * takes the scaler's, the last of the name, where it took the program's
 * 7 as a float64's bits (3.5e-323). */
static void test_reserved(const char *dir) {
  char path[1100];
  snprintf(path, sizeof path, "%s/reserved.ckpt", dir);
  model_t m;
  model_init(&m, 1);
  hvd_optimizer_t *o = adam(&m, 0);
  hvd_loss_scale_options_t l;
  hvd_loss_scale_options_init(&l);
  l.init_scale = 1024;
  if (hvd_optimizer_set_loss_scaling(o, &l) != HVD_SUCCESS)
    bail("%s", hvd_last_error());
  int64_t x = 7;
  hvd_state_t *st = NULL;
  if (hvd_state_create(path, 1, &st) != HVD_SUCCESS ||
      hvd_state_add_params(st, m.p, NP, o) != HVD_SUCCESS)
    bail("hvd_state: %s", hvd_last_error());
  is_int(HVD_ERR_INVALID_ARG, hvd_state_add_counter(st, "hvd.loss_scale", &x),
         "a counter named hvd.loss_scale is refused");
  is_string("hvd_state_add_counter: counter 'hvd.loss_scale': names starting "
            "with 'hvd.' are hvd's own (the loss scaler's counters)",
            hvd_last_error(), "... naming it");
  is_int(HVD_ERR_INVALID_ARG, hvd_state_add_counter(st, "hvd.epoch", &x),
         "... so is any hvd. name");
  is_int(HVD_SUCCESS, hvd_state_add_counter(st, "hvd_loss_scale", &x),
         "hvd_loss_scale is the program's");
  is_int(HVD_SUCCESS, hvd_state_commit(st), "... committed to a file");
  hvd_state_destroy(st);
  if (rank == 0) { /* as an earlier build wrote it: the program's renamed */
    size_t n = 0;
    unsigned char *img = hvdt_read_bytes(path, &n);
    unsigned char *at = memmem(img, n, "\016\0\0\0hvd_loss_scale", 18);
    if (at == NULL)
      bail("no counter hvd_loss_scale in %s", path);
    at[7] = '.';
    uint64_t sum = hvdt_sum64(img, n - 8);
    for (int i = 0; i < 8; i++)
      img[n - 8 + i] = (unsigned char)(sum >> (8 * i));
    hvdt_write_bytes(path, img, n);
    free(img);
  }
  model_t b;
  model_init(&b, 5);
  hvd_optimizer_t *ob = adam(&b, 0);
  if (hvd_optimizer_set_loss_scaling(ob, NULL) != HVD_SUCCESS)
    bail("%s", hvd_last_error());
  is_int(HVD_SUCCESS, hvd_checkpoint_load(path, b.p, NP, ob, NULL),
         "a file with a program's hvd.loss_scale before hvd's loads");
  is_double(1024, hvd_optimizer_loss_scale(ob), 0,
            "... the loss scale is the scaler's, not the program's counter");
  ok(same_model(&m, &b), "... and the values");
  hvd_optimizer_destroy(o);
  hvd_optimizer_destroy(ob);
}

/* hvd_state_set_background: a commit whose file is written by a thread.
 * While it is in flight, another save fails naming hvd_state_wait;
 * after the wait the file is the one a synchronous commit writes, byte
 * for byte; a commit waits for the previous write; destroy finishes the
 * last one, which a relaunched job restores (3 commits, the values); a
 * write into a missing directory: the commit succeeds, the wait fails on
 * every rank with rank 0's message naming hvd_state_commit. */
static void test_background(const char *dir) {
  char pa[1100], pb[1100], px[1100], bad[1100], want[3400];
  snprintf(pa, sizeof pa, "%s/bg.state", dir);
  snprintf(pb, sizeof pb, "%s/fg.state", dir);
  snprintf(px, sizeof px, "%s/other.ckpt", dir);
  snprintf(bad, sizeof bad, "%s/no/such/dir.state", dir);
  is_int(HVD_ERR_INVALID_ARG, hvd_state_set_background(NULL, 1),
         "background: set_background(NULL) fails");
  is_string("hvd_state_set_background: state is NULL", hvd_last_error(),
            "... the message");
  is_int(HVD_ERR_INVALID_ARG, hvd_state_wait(NULL),
         "background: hvd_state_wait(NULL) fails");
  is_string("hvd_state_wait: state is NULL", hvd_last_error(),
            "... the message");
  model_t m, f;
  model_init(&m, 3);
  hvd_optimizer_t *o = adam(&m, 0);
  int64_t step = 1;
  hvd_state_t *sa = state_of(pa, &m, o, &step, 1);
  int good = train(&m, o, 0) && hvd_state_commit(sa) == HVD_SUCCESS;
  ok(good, "background: a commit returns with its file in flight");
  snprintf(want, sizeof want,
           "hvd_checkpoint_save: '%s': the background save of '%s' is not "
           "waited for yet (hvd_state_wait)",
           px, pa);
  is_int(HVD_ERR_INVALID_ARG, hvd_checkpoint_save(px, m.p, NP, o, 1),
         "background: another save meanwhile fails on every rank");
  is_string(want, hvd_last_error(), "... naming hvd_state_wait");
  is_int(HVD_SUCCESS, hvd_state_wait(sa), "background: hvd_state_wait");
  is_int(HVD_SUCCESS, hvd_state_wait(sa), "... twice: nothing in flight");
  hvd_state_t *sb = state_of(pb, &m, o, &step, 0);
  is_int(HVD_SUCCESS, hvd_state_commit(sb), "a synchronous state's commit");
  ok(rank != 0 || hvdt_same_file(pa, pb),
     "background: its file is the synchronous commit's, byte for byte");
  hvd_state_destroy(sb);
  good = train(&m, o, 1) && hvd_state_commit(sa) == HVD_SUCCESS &&
         train(&m, o, 2) && hvd_state_commit(sa) == HVD_SUCCESS;
  ok(good, "background: two more commits, the second waiting for the first");
  model_t at3 = m;
  /* destroy finishes the third commit's write, and is not collective:
   * rank 0's returns while the others are in a barrier */
  if (rank == 0)
    hvd_state_destroy(sa);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank != 0)
    hvd_state_destroy(sa);
  model_init(&f, -4);
  hvd_optimizer_t *fo = adam(&f, 0);
  int64_t fstep = 0;
  int restored = 0;
  hvd_state_t *fs = state_of(pa, &f, fo, &fstep, 0);
  is_int(HVD_SUCCESS, hvd_state_restore(fs, &restored),
         "background: a relaunched job restores the file");
  ok(restored == 1 && hvd_state_commits(fs) == 3 && same_model(&f, &at3),
     "... of the 3rd commit (destroy finished its write): the values");
  hvd_state_destroy(fs);
  hvd_state_t *sd = state_of(bad, &m, o, &step, 1);
  is_int(HVD_SUCCESS, hvd_state_commit(sd),
         "background: a commit into a missing directory returns");
  long long pid0 = getpid();
  MPI_Bcast(&pid0, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD); /* rank 0's */
  snprintf(want, sizeof want,
           "hvd_state_commit: '%s': cannot create '%s.tmp.%lld': No such file "
           "or directory",
           bad, bad, pid0);
  is_int(HVD_ERR_IO, hvd_state_commit(sd),
         "... the next commit returns its failure on every rank");
  is_string(want, hvd_last_error(), "... with rank 0's message");
  is_int(HVD_ERR_IO, hvd_state_wait(sd),
         "... and the wait, the failure of that commit's own write");
  is_string(want, hvd_last_error(), "... the same message");
  is_int(HVD_SUCCESS, hvd_state_wait(sd), "... then nothing is in flight");
  hvd_state_destroy(sd);
  hvd_optimizer_destroy(o);
  hvd_optimizer_destroy(fo);
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  unsetenv("HVD_ELASTIC_RESTARTS");
  is_int(0, hvd_elastic_restarts(), "no HVD_ELASTIC_RESTARTS: launch 0");
  setenv("HVD_ELASTIC_RESTARTS", "2", 1);
  setenv("HVD_ELASTIC_PREVIOUS_SIZE", "5", 1);
  ok(hvd_elastic_restarts() == 2 && hvd_elastic_previous_size() == 5,
     "HVD_ELASTIC_RESTARTS=2, HVD_ELASTIC_PREVIOUS_SIZE=5");
  setenv("HVD_ELASTIC_RESTARTS", "x", 1);
  is_int(0, hvd_elastic_restarts(), "HVD_ELASTIC_RESTARTS=x: 0");
  unsetenv("HVD_ELASTIC_RESTARTS");
  unsetenv("HVD_ELASTIC_PREVIOUS_SIZE");
  hvd_state_t *st = NULL;
  hvd_state_create(NULL, 1, &st);
  is_int(HVD_ERR_NOT_INITIALIZED, hvd_state_commit(st),
         "commit before hvd_init");
  hvd_state_destroy(st);
  if (hvd_init() != HVD_SUCCESS)
    bail("hvd_init: %s", hvd_last_error());
  char dir[1024];
  hvdt_shared_tmpdir(dir, sizeof dir, "hvd-state");
  test_errors();
  test_memory(0);
  test_memory(1);
  test_null_on_one();
  test_memory_fails_on_one();
  test_restore_null_on_one(dir);
  test_restore_fails_on_one();
  test_restore_reshaped();
  test_file(dir);
  test_background(dir);
  test_reserved(dir);
  hvdt_remove_tmpdir(dir);
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
