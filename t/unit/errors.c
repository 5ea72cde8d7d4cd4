/*
 * errors.c - what libhvd does before hvd_init(): result strings, dtype and
 * op names, tensor helpers, build facts, and every call refusing to run
 * (hvd_gpu_timing in a build without CUDA: "built without CUDA").
 * One process, no mpiexec, never calls hvd_init().
 */
#include "hvd.h"
#include "tap.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/json.h"

static const struct {
  hvd_result_t rc;
  const char *text;
} results[] = {
    {HVD_SUCCESS, "success"},
    {HVD_ERR_NOT_INITIALIZED, "hvd_init() has not been called"},
    {HVD_ERR_INVALID_ARG, "invalid argument"},
    {HVD_ERR_MISMATCH, "ranks disagree on a collective"},
    {HVD_ERR_SHUTDOWN, "hvd has been shut down"},
    {HVD_ERR_MPI, "MPI call failed"},
    {HVD_ERR_NO_MEMORY, "out of memory"},
    {HVD_ERR_SYSTEM, "system call failed"},
    {HVD_ERR_UNSUPPORTED, "not supported by this build or backend"},
    {HVD_ERR_STALL, "collective stalled: some ranks never submitted it"},
    {HVD_ERR_CUDA, "CUDA call failed"},
    {HVD_ERR_NCCL, "NCCL call failed"},
    {HVD_ERR_IO, "file input/output failed"},
    {HVD_ERR_CORRUPT, "data is corrupt or does not match"},
    {HVD_ERR_INTERNAL, "internal error in hvd"},
};

static const struct {
  hvd_dtype_t dtype;
  size_t size;
  const char *name;
} dtypes[] = {
    {HVD_UINT8, 1, "uint8"},     {HVD_INT8, 1, "int8"},
    {HVD_INT32, 4, "int32"},     {HVD_INT64, 8, "int64"},
    {HVD_FLOAT16, 2, "float16"}, {HVD_BFLOAT16, 2, "bfloat16"},
    {HVD_FLOAT32, 4, "float32"}, {HVD_FLOAT64, 8, "float64"},
};

static const struct {
  hvd_op_t op;
  const char *name;
} ops[] = {
    {HVD_SUM, "sum"}, {HVD_AVERAGE, "average"}, {HVD_MIN, "min"},
    {HVD_MAX, "max"}, {HVD_PRODUCT, "product"}, {HVD_ADASUM, "adasum"},
};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void test_strings(void) {
  is_int(15, HVD_RESULT_COUNT, "15 result codes");
  for (int i = 0; i < COUNT(results); i++) {
    is_int(i, results[i].rc, "result %d has code %d", i, i);
    is_string(results[i].text, hvd_strerror(results[i].rc), "hvd_strerror(%d)",
              results[i].rc);
  }
  is_string("unknown result", hvd_strerror(HVD_RESULT_COUNT),
            "hvd_strerror(HVD_RESULT_COUNT)");
  is_string("unknown result", hvd_strerror((hvd_result_t)-1),
            "hvd_strerror(-1)");
  is_string("unknown result", hvd_strerror((hvd_result_t)1000),
            "hvd_strerror(1000)");

  is_int(8, HVD_DTYPE_COUNT, "8 dtypes");
  for (int i = 0; i < COUNT(dtypes); i++) {
    is_int(i, dtypes[i].dtype, "dtype %s is %d", dtypes[i].name, i);
    is_int((long long)dtypes[i].size,
           (long long)hvd_dtype_size(dtypes[i].dtype), "hvd_dtype_size(%s)",
           dtypes[i].name);
    is_string(dtypes[i].name, hvd_dtype_name(dtypes[i].dtype),
              "hvd_dtype_name(%d)", i);
  }
  const int bad_dtypes[] = {HVD_DTYPE_COUNT, -1, 42};
  for (int i = 0; i < COUNT(bad_dtypes); i++) {
    is_int(0, (long long)hvd_dtype_size((hvd_dtype_t)bad_dtypes[i]),
           "hvd_dtype_size(%d) is 0", bad_dtypes[i]);
    is_string("unknown", hvd_dtype_name((hvd_dtype_t)bad_dtypes[i]),
              "hvd_dtype_name(%d)", bad_dtypes[i]);
  }

  is_int(6, HVD_OP_COUNT, "6 ops");
  for (int i = 0; i < COUNT(ops); i++) {
    is_int(i, ops[i].op, "op %s is %d", ops[i].name, i);
    is_string(ops[i].name, hvd_op_name(ops[i].op), "hvd_op_name(%d)", i);
  }
  const int bad_ops[] = {HVD_OP_COUNT, -1, 9};
  for (int i = 0; i < COUNT(bad_ops); i++)
    is_string("unknown", hvd_op_name((hvd_op_t)bad_ops[i]), "hvd_op_name(%d)",
              bad_ops[i]);
}

static void test_tensors(void) {
  float x = 1.5f;
  double buf[60];
  const int64_t shape3[] = {3, 4, 5};
  const int64_t zero[] = {3, 0, 2};
  const int64_t nine[] = {1, 2, 1, 2, 1, 2, 1, 2, 3};
  hvd_tensor_t t;

  t = hvd_tensor_make(&x, HVD_FLOAT32, 0, NULL);
  ok(t.data == &x, "scalar: data is the caller's");
  is_int(HVD_FLOAT32, t.dtype, "scalar: dtype");
  is_int(0, t.ndim, "scalar: ndim 0");
  is_int(HVD_CPU, t.device, "scalar: device is HVD_CPU");
  is_int(1, hvd_tensor_numel(&t), "scalar: numel 1");

  t = hvd_tensor_make(buf, HVD_FLOAT64, 3, shape3);
  ok(t.data == buf, "[3, 4, 5]: data is the caller's");
  is_int(HVD_FLOAT64, t.dtype, "[3, 4, 5]: dtype");
  is_int(3, t.ndim, "[3, 4, 5]: ndim");
  ok(t.shape[0] == 3 && t.shape[1] == 4 && t.shape[2] == 5,
     "[3, 4, 5]: shape copied");
  is_int(HVD_CPU, t.device, "[3, 4, 5]: device");
  is_int(60, hvd_tensor_numel(&t), "[3, 4, 5]: numel 60");

  t = hvd_tensor_make(buf, HVD_INT8, 3, zero);
  is_int(0, hvd_tensor_numel(&t), "[3, 0, 2]: numel 0");

  t = hvd_tensor_make(buf, HVD_UINT8, 1, shape3);
  is_int(3, hvd_tensor_numel(&t), "[3]: numel 3");

  t = hvd_tensor_make(buf, HVD_UINT8, -1, shape3);
  is_int(0, t.ndim, "ndim -1 is clamped to 0");
  t = hvd_tensor_make(buf, HVD_UINT8, 9, nine);
  is_int(HVD_MAX_DIMS, t.ndim, "ndim 9 is clamped to 8");
  is_int(16, hvd_tensor_numel(&t), "ndim 9 clamped: numel of 8 dims");

  /* products past INT64_MAX: -1, not a wrapped count (0, or negative) */
  const int64_t wrap0[] = {(int64_t)1 << 32, (int64_t)1 << 32};
  const int64_t wrapneg[] = {3, (int64_t)1 << 62};
  const int64_t emptybig[] = {(int64_t)1 << 40, (int64_t)1 << 40, 0};
  t = hvd_tensor_make(buf, HVD_FLOAT32, 2, wrap0);
  is_int(-1, hvd_tensor_numel(&t), "[2^32, 2^32]: numel -1 (overflow)");
  t = hvd_tensor_make(buf, HVD_FLOAT32, 2, wrapneg);
  is_int(-1, hvd_tensor_numel(&t), "[3, 2^62]: numel -1 (overflow)");
  t = hvd_tensor_make(buf, HVD_FLOAT32, 3, emptybig);
  is_int(0, hvd_tensor_numel(&t), "[2^40, 2^40, 0]: numel 0");
  t = hvd_tensor_make(buf, HVD_FLOAT32, 2, wrap0);
  t.shape[1] = -2;
  is_int(-1, hvd_tensor_numel(&t), "[2^32, -2]: numel -1 (negative)");

  hvd_tensor_free(NULL);
  ok(1, "hvd_tensor_free(NULL) returns");
  t = hvd_tensor_make(NULL, HVD_FLOAT32, 0, NULL);
  hvd_tensor_free(&t);
  ok(t.data == NULL, "hvd_tensor_free of a tensor with NULL data");
}

static void test_build(void) {
  is_string("0.1.0", hvd_version(), "hvd_version()");
  is_int(100, HVD_VERSION, "HVD_VERSION");
  is_int(10203, HVD_VERSION_CODE(1, 2, 3), "HVD_VERSION_CODE(1, 2, 3)");
  is_string(hvd_version(), HVD_VERSION_STRING,
            "HVD_VERSION_STRING (hvd_version.h) is the library's version");
  char parts[32];
  snprintf(parts, sizeof parts, "%d.%d.%d", HVD_VERSION_MAJOR,
           HVD_VERSION_MINOR, HVD_VERSION_PATCH);
  is_string(hvd_version(), parts, "HVD_VERSION_MAJOR.MINOR.PATCH agree");
  is_int(1, hvd_mpi_built(), "hvd_mpi_built()");
  ok(hvd_cuda_built() >= 0, "hvd_cuda_built() >= 0");
  ok(hvd_nccl_built() >= 0, "hvd_nccl_built() >= 0");
  diag("hvd_cuda_built() = %d, hvd_nccl_built() = %d", hvd_cuda_built(),
       hvd_nccl_built());
}

/* base/json.h, the escaper of the timeline and the tools' --json. */
typedef struct sink {
  char buf[128];
  size_t len;
  int calls;
} sink_t;

static void sink_put(void *ctx, const char *p, size_t n) {
  sink_t *k = ctx;
  memcpy(k->buf + k->len, p, n);
  k->len += n;
  k->buf[k->len] = '\0';
  k->calls++;
}

/* One escaped string against its exact expected text. */
static void escapes(const char *in, const char *want, const char *what) {
  sink_t k = {{0}, 0, 0};
  hvd__json_escape(in, sink_put, &k);
  is_string(want, k.buf, "json: %s", what);
}

/* Valid UTF-8 passes whole; each byte that begins no valid sequence is
 * \ufffd, and the bytes after it are read afresh. */
static void test_json_utf8(void) {
  escapes("\xc2\x80\xdf\xbf", "\xc2\x80\xdf\xbf", "2-byte U+0080, U+07FF kept");
  escapes("\xe0\xa0\x80\xe2\x82\xac\xed\x9f\xbf\xef\xbf\xbf",
          "\xe0\xa0\x80\xe2\x82\xac\xed\x9f\xbf\xef\xbf\xbf",
          "3-byte U+0800, U+20AC, U+D7FF, U+FFFF kept");
  escapes("\xf0\x90\x80\x80\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf",
          "\xf0\x90\x80\x80\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf",
          "4-byte U+10000, U+1F600, U+10FFFF kept");
  escapes("bad\xff\xfe", "bad\\ufffd\\ufffd", "0xff, 0xfe: one each");
  escapes("a\x80"
          "b\xbf"
          "c",
          "a\\ufffdb\\ufffdc", "lone continuation bytes");
  escapes("\xc0\xaf\xc1\xbf", "\\ufffd\\ufffd\\ufffd\\ufffd",
          "overlong 2-byte (0xc0, 0xc1 leads)");
  escapes("\xe0\x80\xaf", "\\ufffd\\ufffd\\ufffd", "overlong 3-byte");
  escapes("\xf0\x80\x80\xaf", "\\ufffd\\ufffd\\ufffd\\ufffd",
          "overlong 4-byte");
  escapes("\xed\xa0\x80x\xed\xbf\xbf",
          "\\ufffd\\ufffd\\ufffdx\\ufffd\\ufffd\\ufffd",
          "surrogates U+D800, U+DFFF");
  escapes("\xf4\x90\x80\x80\xf5\x80\x80\x80",
          "\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd",
          "past U+10FFFF (0xf4 0x90, 0xf5)");
  escapes("\xe2\x82", "\\ufffd\\ufffd", "3-byte cut short at the end");
  escapes("\xf0\x9f\x98", "\\ufffd\\ufffd\\ufffd",
          "4-byte cut short at the end");
  escapes("\xc3x\xe2\x82\\", "\\ufffdx\\ufffd\\ufffd\\\\",
          "cut short before ASCII; a backslash after");
}

static void test_json(void) {
  sink_t k = {{0}, 0, 0};
  hvd__json_escape("plain name/0", sink_put, &k);
  is_string("plain name/0", k.buf, "json: plain text passes as it is");
  is_int(1, k.calls, "json: in one piece");
  k = (sink_t){{0}, 0, 0};
  hvd__json_escape("a\"b\\c\n\x01\xc3\xa9", sink_put, &k);
  is_string("a\\\"b\\\\c\\u000a\\u0001\xc3\xa9", k.buf,
            "json: quote, backslash, controls escaped; UTF-8 kept");
  k = (sink_t){{0}, 0, 0};
  hvd__json_escape("", sink_put, &k);
  is_int(0, k.calls, "json: an empty string puts nothing");
  test_json_utf8();
}

static void test_queries(void) {
  is_int(0, hvd_is_initialized(), "hvd_is_initialized() is 0");
  is_int(-1, hvd_rank(), "hvd_rank() before init");
  is_int(-1, hvd_size(), "hvd_size() before init");
  is_int(-1, hvd_local_rank(), "hvd_local_rank() before init");
  is_int(-1, hvd_local_size(), "hvd_local_size() before init");
  is_int(-1, hvd_cross_rank(), "hvd_cross_rank() before init");
  is_int(-1, hvd_cross_size(), "hvd_cross_size() before init");
  is_int(-1, hvd_is_homogeneous(), "hvd_is_homogeneous() before init");
}

/* rc must be HVD_ERR_NOT_INITIALIZED with "<fn>: hvd_init() has not been
 * called" as the last error. */
static void refused(hvd_result_t rc, const char *fn) {
  char want[128];
  snprintf(want, sizeof want, "%s: hvd_init() has not been called", fn);
  is_int(HVD_ERR_NOT_INITIALIZED, rc, "%s before init: result", fn);
  is_string(want, hvd_last_error(), "%s before init: message", fn);
}

static void test_not_initialized(void) {
  float a[6] = {1, 2, 3, 4, 5, 6}, b[6];
  const int64_t shape[] = {6};
  int64_t splits[1] = {6}, recv_splits[1];
  hvd_tensor_t send = hvd_tensor_make(a, HVD_FLOAT32, 1, shape);
  hvd_tensor_t recv = hvd_tensor_make(b, HVD_FLOAT32, 1, shape);
  hvd_tensor_t out = hvd_tensor_make(NULL, HVD_FLOAT32, 0, NULL);
  hvd_request_t *req = NULL;
  int done = -1, last = -1;

  refused(hvd_allreduce("w", &send, &recv, HVD_SUM, 1.0, 1.0), "hvd_allreduce");
  refused(hvd_allreduce_async("w", &send, &recv, HVD_SUM, 1.0, 1.0, &req),
          "hvd_allreduce_async");
  refused(hvd_broadcast("w", &send, 0), "hvd_broadcast");
  refused(hvd_broadcast_async("w", &send, 0, &req), "hvd_broadcast_async");
  refused(hvd_allgather("w", &send, &out), "hvd_allgather");
  refused(hvd_allgather_async("w", &send, &out, &req), "hvd_allgather_async");
  refused(hvd_alltoall("w", &send, splits, &out, recv_splits), "hvd_alltoall");
  refused(hvd_alltoall_async("w", &send, NULL, &out, NULL, &req),
          "hvd_alltoall_async");
  refused(hvd_reducescatter("w", &send, &out, HVD_SUM, 1.0, 1.0),
          "hvd_reducescatter");
  refused(hvd_reducescatter_async("w", &send, &out, HVD_MAX, 1.0, 1.0, &req),
          "hvd_reducescatter_async");
  refused(hvd_barrier(), "hvd_barrier");
  refused(hvd_barrier_async(&req), "hvd_barrier_async");
  refused(hvd_join(&last), "hvd_join");
  refused(hvd_join_async(&last, &req), "hvd_join_async");
  refused(hvd_wait(NULL), "hvd_wait");
  refused(hvd_test(NULL, &done), "hvd_test");
  refused(hvd_cuda_stream_wait(NULL, NULL), "hvd_cuda_stream_wait");
  ok(out.data == NULL, "no output was allocated");
  ok(a[0] == 1 && a[5] == 6, "send data untouched");

  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown() before init");
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown() again");
  is_int(0, hvd_is_initialized(), "still not initialised");
}

/* hvd_gpu_timing: out NULL first; then a build without CUDA refuses it
 * whatever the state, one with CUDA as any call before hvd_init. */
static void test_gpu_timing(void) {
  hvd_gpu_timing_t t;
  is_int(HVD_ERR_INVALID_ARG, hvd_gpu_timing(NULL, 0),
         "hvd_gpu_timing(NULL): result");
  is_string("hvd_gpu_timing: out is NULL", hvd_last_error(),
            "hvd_gpu_timing(NULL): message");
  if (hvd_cuda_built()) {
    refused(hvd_gpu_timing(&t, 0), "hvd_gpu_timing");
    return;
  }
  is_int(HVD_ERR_UNSUPPORTED, hvd_gpu_timing(&t, 1),
         "hvd_gpu_timing without CUDA: result");
  is_string("hvd_gpu_timing: hvd was built without CUDA", hvd_last_error(),
            "hvd_gpu_timing without CUDA: message");
}

int main(void) {
  is_string("", hvd_last_error(), "hvd_last_error() is empty at first");
  test_strings();
  test_tensors();
  test_build();
  test_json();
  test_queries();
  test_not_initialized();
  test_gpu_timing();
  done_testing();
  return tap_exit_status();
}
