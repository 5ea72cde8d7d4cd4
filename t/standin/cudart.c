/*
 * cudart.c - the host stand-in for the part of the CUDA runtime that
 * libhvd, lib/optim/device.c and the t/gpu tests call (standin.h says what
 * it models). Compiled against the real <cuda_runtime_api.h>, so every
 * definition matches CUDA's declaration; libcudart is not linked.
 *
 *  - Devices: HVD_STANDIN_DEVICES of them (default 4), filtered by
 *    CUDA_VISIBLE_DEVICES; each has its own PCI bus id and UUID, so
 *    hvd_init's binding check can tell them apart. The current device is
 *    per thread (device 0 at first), as in CUDA.
 *  - Memory: cudaMalloc'd and cudaHostAlloc'd blocks are kept in one table.
 *    New device memory is filled with 0xa5 (not zero, as on a GPU). A copy
 *    whose kind disagrees with where its pointers live, a range past the
 *    end of an allocation, a device pointer while another device is
 *    current, cudaFree of anything but a live cudaMalloc pointer and
 *    cudaFreeHost of anything but a live cudaHostAlloc pointer end the
 *    process with a message. What was never freed is reported at exit.
 *  - Streams and events: the work runs at the call. Each recorded event
 *    answers cudaErrorNotReady HVD_STANDIN_POLLS times before
 *    cudaSuccess, so polling loops run; an event recorded on a stream that
 *    a hung NCCL collective holds never finishes until that communicator
 *    is aborted (nccl.c); the abort fires every event recorded behind its
 *    work (standin_nccl_aborted), as a GPU whose NCCL kernels the abort
 *    ends. Synchronizing such a stream ends the process
 *    (on a GPU it would never return). Streams made with a priority are
 *    hvd's: the events pending on them are counted (standin_peak_in_flight),
 *    and their thread may not allocate or free while any is pending
 *    (events made with cudaEventDisableTiming, as hvd's groups' are:
 *    timing events mark no work in flight).
 *    cudaEventElapsedTime is as strict as CUDA (an event made with
 *    cudaEventDisableTiming or never recorded, one not yet complete) and
 *    measures the host times at which the two events fired: when
 *    recorded, or, on a stream that standin_stream_busy made busy (the
 *    caller's compute still running) or that waits for an event of one,
 *    when that device time is over; such an event is cudaErrorNotReady
 *    until then, and cudaEventSynchronize and cudaStreamSynchronize wait
 *    for it. cudaStreamPerThread is a blocking stream of each thread and
 *    device of its own, as CUDA's (not the legacy stream).
 *  - Pinned memory (cudaHostAlloc, cudaMallocHost) is in the stream order
 *    (below): an asynchronous copy into it is deferred until the host sees
 *    it finish, and the host may not change the source of one out of it
 *    before then.
 */
#include <config.h>

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "standin.h"

#define MAX_DEVICES 8

/* ---- messages, environment ------------------------------------------ */

void standin_die(const char *fmt, ...) {
  va_list ap;
  char msg[1024];
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "hvd stand-in: %s\n", msg);
  fflush(stderr);
  abort();
}

int standin_env_int(const char *name, int def, int max) {
  const char *v = getenv(name);
  if (v == NULL || v[0] == '\0')
    return def;
  char *end;
  long x = strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > max)
    standin_die("%s='%s' is not a whole number from 0 to %d", name, v, max);
  return (int)x;
}

int standin_polls(void) {
  return standin_env_int("HVD_STANDIN_POLLS", 2, 1000000);
}

/* Sleeps about us microseconds. */
static void nap(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- devices ----------------------------------------------------------- */

static pthread_once_t devices_once = PTHREAD_ONCE_INIT;
static int ndevices;              /* visible */
static int physical[MAX_DEVICES]; /* ordinal -> the machine's device */
static _Thread_local int current; /* per thread, as in CUDA */
static _Thread_local cudaError_t last_error = cudaSuccess;

static void devices_init(void) {
  int machine = standin_env_int("HVD_STANDIN_DEVICES", 4, MAX_DEVICES);
  const char *vis = getenv("CUDA_VISIBLE_DEVICES");
  if (vis == NULL) {
    for (int i = 0; i < machine; i++)
      physical[ndevices++] = i;
    return;
  }
  /* as CUDA: the devices listed, up to the first entry that is not one */
  const char *p = vis;
  while (*p != '\0' && ndevices < MAX_DEVICES) {
    char *end;
    long x = strtol(p, &end, 10);
    if (end == p || x < 0 || x >= machine)
      break;
    int dup = 0;
    for (int i = 0; i < ndevices; i++)
      dup |= physical[i] == (int)x;
    if (dup)
      break;
    physical[ndevices++] = (int)x;
    p = end;
    while (*p == ' ')
      p++;
    if (*p != ',')
      break;
    p++;
  }
}

static int device_count(void) {
  pthread_once(&devices_once, devices_init);
  return ndevices;
}

static cudaError_t fail(cudaError_t e) {
  last_error = e;
  return e;
}

int standin_current_device(void) {
  if (device_count() == 0)
    standin_die("CUDA was used on a machine whose stand-in has no devices");
  return current;
}

cudaError_t cudaGetDeviceCount(int *count) {
  *count = device_count();
  return *count ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) {
  if (device_count() == 0)
    return fail(cudaErrorNoDevice);
  if (device < 0 || device >= device_count())
    return fail(cudaErrorInvalidDevice);
  current = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
  if (device_count() == 0)
    return fail(cudaErrorNoDevice);
  *device = current;
  return cudaSuccess;
}

/* Device i's PCI bus number: distinct per device of the machine. */
static int bus_of(int i) { return 0x1b + 0x1c * physical[i]; }

cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device) {
  if (device < 0 || device >= device_count())
    return fail(cudaErrorInvalidDevice);
  if (pciBusId == NULL || len <= 0)
    return fail(cudaErrorInvalidValue);
  snprintf(pciBusId, (size_t)len, "0000:%02X:00.0", bus_of(device));
  return cudaSuccess;
}

/* cudaDevAttrPageableMemoryAccess: 0, as on a GPU without HMM or ATS,
 * unless HVD_STANDIN_PAGEABLE_ACCESS=1; any other attribute is refused
 * (hvd asks for none). */
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr,
                                   int device) {
  if (device < 0 || device >= device_count())
    return fail(cudaErrorInvalidDevice);
  if (value == NULL || attr != cudaDevAttrPageableMemoryAccess)
    return fail(cudaErrorInvalidValue);
  const char *v = getenv("HVD_STANDIN_PAGEABLE_ACCESS");
  *value = v != NULL && strcmp(v, "1") == 0;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
  if (device < 0 || device >= device_count())
    return fail(cudaErrorInvalidDevice);
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "hvd stand-in GPU %d (host memory)",
           physical[device]);
  for (int i = 0; i < 16; i++) /* a UUID per device of the machine */
    prop->uuid.bytes[i] = (char)(0x5a ^ (i * 17) ^ (physical[device] << 4));
  prop->totalGlobalMem = (size_t)80 << 30;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->pciDomainID = 0;
  prop->pciBusID = bus_of(device);
  prop->pciDeviceID = 0;
  prop->l2CacheSize = 50 << 20;
  prop->unifiedAddressing = 1;
  return cudaSuccess;
}

/* ---- errors ------------------------------------------------------------ */

cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

/* CUDA 13's own names and words for the results the stand-in gives. */
static const struct {
  cudaError_t e;
  const char *name, *text;
} errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice",
     "invalid device ordinal"},
    {cudaErrorNoDevice, "cudaErrorNoDevice",
     "no CUDA-capable device is detected"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle",
     "invalid resource handle"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer",
     "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const char *cudaGetErrorName(cudaError_t error) {
  for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
    if (errors[i].e == error)
      return errors[i].name;
  return "unrecognized error code";
}

const char *cudaGetErrorString(cudaError_t error) {
  for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
    if (errors[i].e == error)
      return errors[i].text;
  return "unrecognized error code";
}

/* ---- memory ------------------------------------------------------------ */

typedef struct alloc {
  char *base;
  size_t size; /* at least 1 */
  int dev;     /* the device current when it was made */
  int pinned;  /* cudaHostAlloc (host memory) rather than cudaMalloc */
} alloc_t;

static pthread_mutex_t mem_mu = PTHREAD_MUTEX_INITIALIZER;
static alloc_t *allocs; /* sorted by base */
static size_t nallocs, allocs_cap;
static long live[2]; /* device, pinned */
static size_t live_bytes[2];
static pthread_once_t report_once = PTHREAD_ONCE_INIT;

/* Index of the last allocation with base <= p, or -1. mem_mu held. */
static long below(const void *p) {
  long lo = 0, hi = (long)nallocs - 1, at = -1;
  while (lo <= hi) {
    long mid = (lo + hi) / 2;
    if ((uintptr_t)allocs[mid].base <= (uintptr_t)p) {
      at = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return at;
}

/* The allocation holding p, copied into *out; 0 when none. */
static int lookup(const void *p, alloc_t *out) {
  int found = 0;
  pthread_mutex_lock(&mem_mu);
  long i = below(p);
  if (i >= 0 && (uintptr_t)p < (uintptr_t)allocs[i].base + allocs[i].size) {
    *out = allocs[i];
    found = 1;
  }
  pthread_mutex_unlock(&mem_mu);
  return found;
}

static void leak_report(void) {
  pthread_mutex_lock(&mem_mu);
  if (live[0] > 0 || live[1] > 0)
    fprintf(stderr,
            "hvd stand-in: at exit, %ld device allocations (%zu bytes) and "
            "%ld pinned host allocations (%zu bytes) were never freed\n",
            live[0], live_bytes[0], live[1], live_bytes[1]);
  pthread_mutex_unlock(&mem_mu);
}

static void report_at_exit(void) { atexit(leak_report); }

static cudaError_t track(void **out, size_t n, int pinned) {
  pthread_once(&report_once, report_at_exit);
  size_t size = n ? n : 1;
  char *p = malloc(size);
  if (p == NULL)
    return fail(cudaErrorMemoryAllocation);
  memset(p, 0xa5, size); /* neither memory kind starts zeroed */
  pthread_mutex_lock(&mem_mu);
  if (nallocs == allocs_cap) {
    size_t cap = allocs_cap ? 2 * allocs_cap : 256;
    alloc_t *a = realloc(allocs, cap * sizeof *a);
    if (a == NULL)
      standin_die("out of memory for the allocation table");
    allocs = a;
    allocs_cap = cap;
  }
  long at = below(p) + 1;
  memmove(&allocs[at + 1], &allocs[at],
          (nallocs - (size_t)at) * sizeof *allocs);
  allocs[at] = (alloc_t){p, size, current, pinned};
  nallocs++;
  live[pinned]++;
  live_bytes[pinned] += size;
  pthread_mutex_unlock(&mem_mu);
  *out = p;
  return cudaSuccess;
}

/* Removes the allocation that starts at p, of kind pinned; dies when p is
 * not one. */
static void untrack(void *p, int pinned, const char *who) {
  alloc_t a = {0};
  pthread_mutex_lock(&mem_mu);
  long i = below(p);
  int found = i >= 0 && allocs[i].base == (char *)p;
  if (found)
    a = allocs[i];
  if (found && a.pinned == pinned) {
    memmove(&allocs[i], &allocs[i + 1],
            (nallocs - (size_t)i - 1) * sizeof *allocs);
    nallocs--;
    live[pinned]--;
    live_bytes[pinned] -= a.size;
  }
  pthread_mutex_unlock(&mem_mu);
  if (!found) {
    alloc_t in;
    if (lookup(p, &in))
      standin_die("%s(%p): not the start of an allocation (%zu bytes into "
                  "a %zu-byte %s block)",
                  who, p, (size_t)((char *)p - in.base), in.size,
                  in.pinned ? "pinned host" : "device");
    standin_die("%s(%p): not a live %s allocation (host memory, or freed "
                "already)",
                who, p, pinned ? "cudaHostAlloc" : "cudaMalloc");
  }
  if (a.pinned != pinned)
    standin_die("%s(%p): a %s allocation (use %s)", who, p,
                a.pinned ? "pinned host" : "device",
                a.pinned ? "cudaFreeHost" : "cudaFree");
  if (!pinned && a.dev != current)
    standin_die("%s(%p): memory of cuda:%d freed while cuda:%d is current "
                "(on a GPU this makes a context on cuda:%d)",
                who, p, a.dev, current, current);
  free(p);
}

long standin_device_allocations(void) {
  pthread_mutex_lock(&mem_mu);
  long n = live[0];
  pthread_mutex_unlock(&mem_mu);
  return n;
}

long standin_pinned_allocations(void) {
  pthread_mutex_lock(&mem_mu);
  long n = live[1];
  pthread_mutex_unlock(&mem_mu);
  return n;
}

int standin_device_of(const void *p) {
  alloc_t a;
  return lookup(p, &a) && !a.pinned ? a.dev : -1;
}

void standin_need_device_on(const void *p, size_t n, int dev, const char *who,
                            const char *what) {
  alloc_t a;
  if (n == 0)
    return;
  if (!lookup(p, &a) || a.pinned)
    standin_die("%s: %s %p (%zu bytes) is not device memory (%s)", who, what, p,
                n, lookup(p, &a) ? "pinned host memory" : "host memory");
  size_t off = (size_t)((const char *)p - a.base);
  if (n > a.size - off)
    standin_die("%s: %s %p (%zu bytes) runs %zu bytes past the end of its "
                "%zu-byte device allocation",
                who, what, p, n, n - (a.size - off), a.size);
  if (a.dev != dev)
    standin_die("%s: %s %p is memory of cuda:%d, not of cuda:%d", who, what, p,
                a.dev, dev);
}

void standin_need_device(const void *p, size_t n, const char *who,
                         const char *what) {
  char w[160];
  if (n == 0)
    return;
  snprintf(w, sizeof w, "%s (cuda:%d current)", who, standin_current_device());
  standin_need_device_on(p, n, standin_current_device(), w, what);
}

/* Host memory: pageable or pinned, not device memory. */
static void need_host(const void *p, size_t n, const char *who,
                      const char *what) {
  alloc_t a;
  if (n > 0 && lookup(p, &a) && !a.pinned)
    standin_die("%s: %s %p is device memory of cuda:%d, not host memory", who,
                what, p, a.dev);
  if (n > 0 && p == NULL)
    standin_die("%s: %s is NULL", who, what);
}

/* HVD_STANDIN_CUDA_MALLOC_LIMIT=R:BYTES: on world rank R (Open MPI's
 * OMPI_COMM_WORLD_RANK), a cudaMalloc of more than BYTES fails with
 * cudaErrorMemoryAllocation, as on a GPU whose memory is used up. Read at
 * every call, so a test may change it. */
/* hvd's engine thread (the one that made a stream with a priority) never
 * allocates or frees while its groups are in flight: on a GPU cudaFree
 * and cudaFreeHost wait for the whole device, and cudaMalloc may, which
 * stalls the engine behind its own collectives, or deadlocks when one
 * waits for a peer that waits for this rank. Ends the process. */
static __thread int engine_thread;
static int priority_pending(void);

static void no_alloc_in_flight(const char *who) {
  int n = engine_thread ? priority_pending() : 0;
  if (n > 0)
    standin_die("%s on hvd's engine thread while %d device group(s) of its "
                "are in flight: on a GPU it waits for the device, "
                "mid-collective (complete them first)",
                who, n);
}

static int malloc_refused(size_t size) {
  const char *v = getenv("HVD_STANDIN_CUDA_MALLOC_LIMIT"),
             *me = getenv("OMPI_COMM_WORLD_RANK");
  int r = -1;
  unsigned long long limit = 0;
  if (v == NULL || *v == '\0')
    return 0;
  if (sscanf(v, "%d:%llu", &r, &limit) != 2)
    standin_die("HVD_STANDIN_CUDA_MALLOC_LIMIT='%s': R:BYTES", v);
  return r == (me != NULL ? atoi(me) : 0) && size > limit;
}

static atomic_long malloc_calls;

long standin_malloc_calls(void) { return atomic_load(&malloc_calls); }

cudaError_t cudaMalloc(void **devPtr, size_t size) {
  atomic_fetch_add(&malloc_calls, 1);
  if (devPtr == NULL)
    return fail(cudaErrorInvalidValue);
  (void)standin_current_device();
  no_alloc_in_flight("cudaMalloc");
  if (malloc_refused(size)) {
    *devPtr = NULL;
    return fail(cudaErrorMemoryAllocation);
  }
  return track(devPtr, size, 0);
}



cudaError_t cudaFree(void *devPtr) {
  atomic_fetch_add(&malloc_calls, 1);
  no_alloc_in_flight("cudaFree");
  if (devPtr != NULL)
    untrack(devPtr, 0, "cudaFree");
  standin_order_device_idle(); /* cudaFree waits for the device, as CUDA */
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
  (void)flags;
  if (pHost == NULL)
    return fail(cudaErrorInvalidValue);
  no_alloc_in_flight("cudaHostAlloc");
  return track(pHost, size, 1);
}

cudaError_t cudaMallocHost(void **ptr, size_t size) {
  return cudaHostAlloc(ptr, size, 0);
}

cudaError_t cudaFreeHost(void *ptr) {
  no_alloc_in_flight("cudaFreeHost");
  /* it waits for the device, as CUDA: copies into the block land first */
  standin_order_device_idle();
  if (ptr != NULL)
    untrack(ptr, 1, "cudaFreeHost");
  return cudaSuccess;
}

/* cudaPointerGetAttributes calls so far. */
static _Atomic long pointer_queries;

long standin_pointer_queries(void) { return atomic_load(&pointer_queries); }

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes,
                                     const void *ptr) {
  alloc_t a;
  atomic_fetch_add(&pointer_queries, 1);
  if (attributes == NULL)
    return fail(cudaErrorInvalidValue);
  memset(attributes, 0, sizeof *attributes);
  attributes->device = -2;
  attributes->type = cudaMemoryTypeUnregistered;
  if (lookup(ptr, &a)) {
    attributes->device = a.dev;
    attributes->type = a.pinned ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
    attributes->devicePointer = (void *)ptr;
    attributes->hostPointer = a.pinned ? (void *)ptr : NULL;
  }
  return cudaSuccess;
}

static const char *kind_name(enum cudaMemcpyKind kind) {
  switch (kind) {
  case cudaMemcpyHostToHost:
    return "cudaMemcpyHostToHost";
  case cudaMemcpyHostToDevice:
    return "cudaMemcpyHostToDevice";
  case cudaMemcpyDeviceToHost:
    return "cudaMemcpyDeviceToHost";
  case cudaMemcpyDeviceToDevice:
    return "cudaMemcpyDeviceToDevice";
  default:
    return "cudaMemcpyDefault";
  }
}

/* Checks a copy's pointers against its kind (order_copy makes it). */
static cudaError_t copy(void *dst, const void *src, size_t count,
                        enum cudaMemcpyKind kind, const char *who) {
  char w[96];
  snprintf(w, sizeof w, "%s(%s)", who, kind_name(kind));
  if (count == 0)
    return cudaSuccess;
  switch (kind) {
  case cudaMemcpyHostToHost:
    need_host(dst, count, w, "dst");
    need_host(src, count, w, "src");
    break;
  case cudaMemcpyHostToDevice:
    standin_need_device(dst, count, w, "dst");
    need_host(src, count, w, "src");
    break;
  case cudaMemcpyDeviceToHost:
    need_host(dst, count, w, "dst");
    standin_need_device(src, count, w, "src");
    break;
  case cudaMemcpyDeviceToDevice:
    standin_need_device(dst, count, w, "dst");
    standin_need_device(src, count, w, "src");
    break;
  case cudaMemcpyDefault:
    if (standin_device_of(dst) >= 0)
      standin_need_device(dst, count, w, "dst");
    if (standin_device_of(src) >= 0)
      standin_need_device(src, count, w, "src");
    break;
  default:
    return fail(cudaErrorInvalidMemcpyDirection);
  }
  return cudaSuccess;
}

static void order_copy(cudaStream_t stream, void *dst, const void *src,
                       size_t n, int sync, const char *who);

/* On the legacy stream, and synchronous (the host sees it finish). */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count,
                       enum cudaMemcpyKind kind) {
  cudaError_t r = copy(dst, src, count, kind, "cudaMemcpy");
  if (r == cudaSuccess && count > 0)
    order_copy(NULL, dst, src, count, 1, "cudaMemcpy");
  return r;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
                            enum cudaMemcpyKind kind, cudaStream_t stream) {
  (void)standin_stream_device(stream, "cudaMemcpyAsync");
  cudaError_t r = copy(dst, src, count, kind, "cudaMemcpyAsync");
  if (r == cudaSuccess && count > 0)
    order_copy(stream, dst, src, count, 0, "cudaMemcpyAsync");
  return r;
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
  standin_need_device(devPtr, count, "cudaMemset", "devPtr");
  /* on the legacy stream, and not synchronous for device memory */
  standin_access(NULL, devPtr, count, 1, "cudaMemset", "devPtr");
  if (count > 0)
    memset(devPtr, value, count);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count,
                            cudaStream_t stream) {
  (void)standin_stream_device(stream, "cudaMemsetAsync");
  standin_need_device(devPtr, count, "cudaMemsetAsync", "devPtr");
  standin_access(stream, devPtr, count, 1, "cudaMemsetAsync", "devPtr");
  if (count > 0)
    memset(devPtr, value, count);
  return cudaSuccess;
}

/* ---- streams and events ---------------------------------------------- */

#define STREAM_MAGIC 0x53545245414d5f31ull /* "STREAM_1" */
#define EVENT_MAGIC 0x4556454e545f5f31ull  /* "EVENT__1" */

/* Stream order (HVD_STANDIN_STREAM_ORDER, on by default): work runs at
 * the call, but the stand-in keeps the order a GPU would guarantee, as
 * vector clocks: each stream counts its operations (vc[its id]) and knows
 * how far it is ordered after every other stream; an event carries its
 * stream's clock when recorded; cudaStreamWaitEvent merges an event's
 * clock into a stream's; what the host has seen finish (a stream or event
 * synchronised, an event queried done, a synchronous copy) merges into
 * the host's clock, which every later operation inherits. The default
 * stream is the legacy one: it and the blocking streams of its device
 * (cudaStreamPerThread's too) order each other. Device and pinned memory
 * that an operation reads or writes is recorded (range, stream, count);
 * work of another stream that reads or writes it before it is ordered
 * after that write, or writes it before it is ordered after that read,
 * ends the process, naming both: on a GPU it would read stale data, or
 * overwrite what is still to be read, some of the time.
 *
 * The host's own loads and stores of pinned memory cannot be seen, so an
 * asynchronous copy that involves it is modelled at the latest moment a
 * GPU may run it (deterministically): a copy into pinned memory leaves
 * POISON (0xa5) there and its bytes (read at the call) land only when the
 * host sees the copy finish (stream or event synchronised, event queried
 * done, cudaStreamQuery done, cudaDeviceSynchronize, cudaFree,
 * cudaFreeHost, a later synchronous copy after it) or when later work
 * ordered after it touches those bytes: a host that reads early reads
 * 0xa5s, and one that wrote there meanwhile ends the process when it
 * lands. A copy out of pinned memory runs at the call, on a snapshot of
 * the source: if the host changed the source before it saw the copy
 * finish, the process ends then (a GPU may have copied the new bytes).
 * HVD_STANDIN_POLLS counts only how soon the host sees events fire. */
#define ORDER_STREAMS 64

typedef struct stream {
  uint64_t magic;
  int dev;
  unsigned long hung; /* the NCCL communicator it waits for; 0: none */
  int id;             /* in the clocks, 1..ORDER_STREAMS-1; 0: not yet */
  int blocking;       /* made without cudaStreamNonBlocking */
  int priority;       /* made by cudaStreamCreateWithPriority */
  int per_thread;     /* a thread's cudaStreamPerThread (not destroyed) */
  int pending;        /* events recorded here the host has not seen fire */
  unsigned long nccl; /* the communicator whose work was enqueued here last */
  double busy_until;  /* its device time runs until then (standin_stream_busy,
                         or waits for events that fire later) */
  uint64_t vc[ORDER_STREAMS];
  struct stream *next;
} stream_t;

typedef struct event {
  uint64_t magic;
  int dev;
  unsigned flags;     /* cudaEventCreateWithFlags's */
  int recorded;       /* cudaEventRecord was called on it */
  double at;          /* when it fires: at the call, or when its stream's
                         device time reaches it (busy_until) */
  int polls_left;     /* cudaErrorNotReady answers still to give */
  stream_t *pending;  /* recorded there, not yet seen to fire by the host */
  int counted;        /* in pending->pending (not a timing event) */
  unsigned long hung; /* recorded behind a hung collective of this comm */
  unsigned long behind; /* recorded behind work of this communicator */
  int id;             /* its stream's id when recorded (0: order off) */
  uint64_t vc[ORDER_STREAMS]; /* its stream's clock when recorded */
  struct event *next;
} event_t;

static pthread_mutex_t sync_mu = PTHREAD_MUTEX_INITIALIZER;
static stream_t *streams;              /* live, created here */
static stream_t defaults[MAX_DEVICES]; /* each device's default stream */
static event_t *events;
static long nstreams, nevents, not_ready;
static int peak_pending; /* most events pending at once on one priority stream */

/* cudaStreamPerThread: the calling thread's own blocking stream of each
 * device, made at its first use, which the legacy stream and it order
 * each other as any blocking stream (not the other blocking streams, nor
 * other threads' per-thread streams); gone with its thread. */
static pthread_key_t per_thread_key;
static pthread_once_t per_thread_once = PTHREAD_ONCE_INIT;
static void stream_unlink_locked(stream_t *s);

static void per_thread_end(void *v) {
  stream_t **mine = v;
  pthread_mutex_lock(&sync_mu);
  for (int d = 0; d < MAX_DEVICES; d++)
    if (mine[d] != NULL) {
      stream_unlink_locked(mine[d]);
      free(mine[d]);
    }
  pthread_mutex_unlock(&sync_mu);
  free(mine);
}

static void per_thread_init(void) {
  if (pthread_key_create(&per_thread_key, per_thread_end) != 0)
    standin_die("pthread_key_create failed");
}

/* The calling thread's per-thread stream of device dev (sync_mu held). */
static stream_t *per_thread_locked(int dev) {
  pthread_once(&per_thread_once, per_thread_init);
  stream_t **mine = pthread_getspecific(per_thread_key);
  if (mine == NULL) {
    mine = calloc(MAX_DEVICES, sizeof *mine);
    if (mine == NULL || pthread_setspecific(per_thread_key, mine) != 0) {
      pthread_mutex_unlock(&sync_mu);
      standin_die("out of memory for a per-thread stream");
    }
  }
  if (mine[dev] == NULL) {
    stream_t *s = calloc(1, sizeof *s);
    if (s == NULL) {
      pthread_mutex_unlock(&sync_mu);
      standin_die("out of memory for a per-thread stream");
    }
    *s = (stream_t){.magic = STREAM_MAGIC, .dev = dev, .blocking = 1,
                    .per_thread = 1, .next = streams};
    streams = s;
    mine[dev] = s;
  }
  return mine[dev];
}

/* The stream behind handle s (sync_mu held); dies when s is not one. */
static stream_t *stream_locked(cudaStream_t s, const char *who) {
  if (s == NULL || s == cudaStreamLegacy) {
    int dev = standin_current_device();
    defaults[dev].dev = dev;
    return &defaults[dev];
  }
  if (s == cudaStreamPerThread)
    return per_thread_locked(standin_current_device());
  for (stream_t *p = streams; p != NULL; p = p->next)
    if ((cudaStream_t)p == s)
      return p;
  pthread_mutex_unlock(&sync_mu);
  standin_die("%s: stream %p is not a live stream (destroyed already?)", who,
              (void *)s);
}

static event_t *event_locked(cudaEvent_t e, const char *who) {
  for (event_t *p = events; p != NULL; p = p->next)
    if ((cudaEvent_t)p == e)
      return p;
  pthread_mutex_unlock(&sync_mu);
  standin_die("%s: event %p is not a live event (destroyed already?)", who,
              (void *)e);
}


/* The host has seen e fire, or e is recorded again or destroyed
 * (sync_mu held): it is no longer pending on its stream. */
static void event_seen(event_t *e) {
  if (e->pending != NULL && e->counted)
    e->pending->pending--;
  e->pending = NULL;
}

/* ---- stream order ------------------------------------------------------ */

/* A read or a write of tracked memory not yet ordered before the host. */
typedef struct orec {
  uintptr_t lo, hi; /* device or pinned memory read or written */
  int id;           /* by this stream */
  int write;
  uint64_t seq; /* as its operation number seq */
  /* pinned memory only: a write's bytes still to land there (the copy is
   * deferred), or a read's snapshot of what it read (the host must not
   * change it before it saw the read finish); NULL: none */
  char *data;
  char who[64];
} orec_t;

static int order_on = -1;
static uint64_t host_vc[ORDER_STREAMS];
static uint64_t id_seq[ORDER_STREAMS]; /* the last count of each id */
static int id_used[ORDER_STREAMS];
static orec_t *recs; /* in call order */
static size_t nrecs, recs_cap;
static size_t nrecs_of[ORDER_STREAMS];   /* records of each stream id */
static uint64_t maxseq_of[ORDER_STREAMS]; /* their highest seq, or more */
static size_t deferred; /* copies into pinned memory not yet landed */

/* What a deferred copy into pinned memory leaves there until it lands:
 * the stand-in's byte for memory nobody wrote. */
#define POISON 0xa5

static void vc_merge(uint64_t *dst, const uint64_t *src) {
  for (int i = 0; i < ORDER_STREAMS; i++)
    if (src[i] > dst[i])
      dst[i] = src[i];
}

/* Whether records of id remain (sync_mu held). */
static int id_recorded(int id) {
  for (size_t i = 0; i < nrecs; i++)
    if (recs[i].id == id)
      return 1;
  return 0;
}

/* s's id, given at its first operation (sync_mu held): preferably one no
 * record names (a destroyed stream's work may still be unordered: a new
 * stream of its id would pass for it). */
static int stream_id(stream_t *s) {
  for (int pass = 0; pass < 2 && s->id == 0; pass++)
    for (int i = 1; i < ORDER_STREAMS && s->id == 0; i++)
      if (!id_used[i] && (pass == 1 || !id_recorded(i))) {
        id_used[i] = 1;
        s->id = i;
        s->vc[i] = id_seq[i]; /* counts go on from the id's last stream */
      }
  if (s->id == 0) {
    pthread_mutex_unlock(&sync_mu);
    standin_die("more than %d live streams", ORDER_STREAMS - 1);
  }
  return s->id;
}

static int is_default(const stream_t *s) {
  return s >= defaults && s < defaults + MAX_DEVICES;
}

/* One operation on s begins: after what the host has seen, after the
 * legacy stream's peers; returns its number (sync_mu held). */
static uint64_t order_op(stream_t *s) {
  int id = stream_id(s);
  vc_merge(s->vc, host_vc);
  if (is_default(s)) { /* the legacy stream waits for the blocking ones */
    for (stream_t *p = streams; p != NULL; p = p->next)
      if (p->dev == s->dev && p->blocking && p->id != 0)
        vc_merge(s->vc, p->vc);
  } else if (s->blocking && defaults[s->dev].id != 0) {
    vc_merge(s->vc, defaults[s->dev].vc);
  }
  id_seq[id] = ++s->vc[id];
  return s->vc[id];
}

static int overlaps(const orec_t *r, uintptr_t lo, uintptr_t hi) {
  return r->lo < hi && lo < r->hi;
}

/* Pending read r's source no longer holds what r read over [lo, hi): the
 * host rewrote it before it saw r finish (sync_mu held; dies). */
static void pinned_read_check(const orec_t *r, uintptr_t lo, uintptr_t hi) {
  uintptr_t a = lo > r->lo ? lo : r->lo, b = hi < r->hi ? hi : r->hi;
  for (uintptr_t q = a; q < b; q++)
    if (*(const char *)q != r->data[q - r->lo]) {
      pthread_mutex_unlock(&sync_mu);
      standin_die("the host rewrote pinned memory at %p (byte %zu of %zu) "
                  "that stream %d's %s (its operation %llu) reads, before "
                  "it saw that finish: on a GPU the copy may take the new "
                  "bytes (synchronise, or see an event recorded after the "
                  "copy fire, before rewriting it)",
                  (void *)q, (size_t)(q - r->lo), (size_t)(r->hi - r->lo),
                  r->id, r->who, (unsigned long long)r->seq);
    }
}

/* The device stores n bytes at pinned p (from src; NULL: the poison of a
 * deferred copy), sync_mu held: the pending reads of those bytes must
 * still see what they read, and then see what is stored. */
static void pinned_store(char *p, const void *src, size_t n) {
  uintptr_t lo = (uintptr_t)p, hi = lo + n;
  for (size_t i = 0; i < nrecs; i++)
    if (!recs[i].write && recs[i].data != NULL && overlaps(&recs[i], lo, hi))
      pinned_read_check(&recs[i], lo, hi);
  if (src != NULL)
    memmove(p, src, n);
  else
    memset(p, POISON, n);
  for (size_t i = 0; i < nrecs; i++) {
    orec_t *r = &recs[i];
    if (r->write || r->data == NULL || !overlaps(r, lo, hi))
      continue;
    uintptr_t a = lo > r->lo ? lo : r->lo, b = hi < r->hi ? hi : r->hi;
    memcpy(r->data + (a - r->lo), (const char *)a, b - a);
  }
}

/* Deferred write r lands in pinned memory (sync_mu held): the host must
 * not have written there meanwhile. */
static void pinned_land(orec_t *r) {
  for (uintptr_t q = r->lo; q < r->hi; q++)
    if (*(const unsigned char *)q != POISON) {
      pthread_mutex_unlock(&sync_mu);
      standin_die("the host wrote pinned memory at %p (byte %zu of %zu) "
                  "that stream %d's %s (its operation %llu) writes, before "
                  "it saw that finish: on a GPU the copy may land before "
                  "or after the host's write",
                  (void *)q, (size_t)(q - r->lo), (size_t)(r->hi - r->lo),
                  r->id, r->who, (unsigned long long)r->seq);
    }
  char *data = r->data;
  r->data = NULL;
  deferred--;
  pinned_store((char *)r->lo, data, r->hi - r->lo);
  free(data);
}

/* r is ordered before the host, or dropped (sync_mu held): a deferred
 * write lands, a read's source is checked. */
static void order_retire(orec_t *r) {
  if (r->data == NULL)
    return;
  if (r->write) {
    pinned_land(r);
  } else {
    pinned_read_check(r, r->lo, r->hi);
    free(r->data);
    r->data = NULL;
  }
}

/* The host saw everything in vc finish: reads and writes ordered before
 * it need no record any more; deferred copies into pinned memory land, in
 * call order (sync_mu held). */
static void order_host_saw(const uint64_t *vc) {
  vc_merge(host_vc, vc);
  size_t k = 0;
  for (size_t i = 0; i < nrecs; i++) {
    if (recs[i].seq > host_vc[recs[i].id]) {
      if (k++ != i)
        recs[k - 1] = recs[i];
    } else {
      order_retire(&recs[i]);
      nrecs_of[recs[i].id]--;
    }
  }
  nrecs = k;
}

static int order_enabled(void) {
  if (order_on < 0)
    order_on = standin_env_int("HVD_STANDIN_STREAM_ORDER", 1, 1);
  return order_on;
}

/* Records s's access seq of [lo, hi) (sync_mu held; data: orec_t's). A
 * write covering older records replaces them (it is ordered after them,
 * so what must follow it follows them); a read, its stream's older reads
 * of bytes it covers. Only among the last DEDUP_WINDOW records: a launch
 * of many spans makes thousands, and keeping a record is never wrong. */
#define DEDUP_WINDOW 16

static void order_record(stream_t *s, uintptr_t lo, uintptr_t hi, int write,
                         uint64_t seq, char *data, const char *who) {
  size_t k = nrecs > DEDUP_WINDOW ? nrecs - DEDUP_WINDOW : 0;
  for (size_t i = k; i < nrecs; i++) {
    orec_t *r = &recs[i];
    if (r->lo >= lo && r->hi <= hi &&
        (write || (!r->write && r->id == s->id))) {
      order_retire(r);
      nrecs_of[r->id]--;
    } else if (k++ != i) {
      recs[k - 1] = *r;
    }
  }
  nrecs = k;
  if (nrecs == recs_cap) {
    size_t cap = recs_cap ? 2 * recs_cap : 256;
    orec_t *w = realloc(recs, cap * sizeof *w);
    if (w == NULL) {
      pthread_mutex_unlock(&sync_mu);
      standin_die("out of memory for the stream order's records");
    }
    recs = w;
    recs_cap = cap;
  }
  deferred += write && data != NULL;
  if (nrecs_of[s->id]++ == 0 || seq > maxseq_of[s->id])
    maxseq_of[s->id] = seq;
  orec_t *w = &recs[nrecs++];
  *w = (orec_t){lo, hi, s->id, write, seq, data, ""};
  snprintf(w->who, sizeof w->who, "%s", who);
}

/* Whether a record may name work that s is not ordered after, or a
 * deferred copy into pinned memory (sync_mu held): without one, the
 * records need no scan (a launch of many spans makes thousands). */
static int order_may_conflict(const stream_t *s) {
  if (deferred > 0)
    return 1;
  for (int i = 1; i < ORDER_STREAMS; i++)
    if (i != s->id && nrecs_of[i] > 0 && s->vc[i] < maxseq_of[i])
      return 1;
  return 0;
}

/* Work of stream s, its operation now, reads or writes [p, p + n) of
 * tracked memory (sync_mu held): it must be ordered after every other
 * stream's write of those bytes, and a write after their reads too;
 * deferred copies into them that it is ordered after land first. */
static void order_check(stream_t *s, const void *p, size_t n, int write,
                        const char *who, const char *what) {
  uintptr_t lo = (uintptr_t)p, hi = lo + n;
  if (!order_may_conflict(s))
    return;
  for (size_t i = 0; i < nrecs; i++) {
    orec_t *r = &recs[i];
    if (!overlaps(r, lo, hi) || (!write && !r->write))
      continue;
    if (r->id == s->id || s->vc[r->id] >= r->seq) {
      if (r->write && r->data != NULL)
        pinned_land(r);
      continue;
    }
    pthread_mutex_unlock(&sync_mu);
    standin_die("%s %s %s (%zu bytes at %p) on stream %d, which stream %d "
                "%s (%s, its operation %llu) with nothing ordering the "
                "two: record an event after the %s and cudaStreamWaitEvent "
                "on it, or synchronise (on a GPU this %s the data at an "
                "unknown moment)",
                who, write ? "writes" : "reads", what, n, p, s->id, r->id,
                r->write ? "wrote" : "read", r->who,
                (unsigned long long)r->seq, r->write ? "write" : "read",
                r->write ? "reads or overwrites" : "overwrites");
  }
}

/* Work of stream s reads or writes [p, p + n) (sync_mu held): checked,
 * then recorded. */
static void order_access_locked(stream_t *s, const void *p, size_t n,
                                int write, const char *who,
                                const char *what) {
  uint64_t seq = order_op(s);
  order_check(s, p, n, write, who, what);
  order_record(s, (uintptr_t)p, (uintptr_t)p + n, write, seq, NULL, who);
}

/* The work of every stream of device dev (-1: of every device) so far
 * has finished (sync_mu held). */
static void order_device_saw(int dev) {
  for (stream_t *p = streams; p != NULL; p = p->next)
    if (dev < 0 || p->dev == dev)
      order_host_saw(p->vc);
  for (int d = 0; d < MAX_DEVICES; d++)
    if (dev < 0 || d == dev)
      order_host_saw(defaults[d].vc);
}

/* cudaFree's implicit synchronisation, and ncclCommAbort's. */
void standin_order_device_idle(void) {
  pthread_mutex_lock(&sync_mu);
  order_device_saw(-1);
  pthread_mutex_unlock(&sync_mu);
}

/* What memory p is: 0 untracked host memory, 1 device, 2 pinned. */
static int mem_kind(const void *p) {
  alloc_t a;
  return !lookup(p, &a) ? 0 : a.pinned ? 2 : 1;
}

void standin_access(cudaStream_t stream, const void *p, size_t n, int write,
                    const char *who, const char *what) {
  if (n == 0 || !order_enabled() || mem_kind(p) == 0)
    return;
  pthread_mutex_lock(&sync_mu);
  order_access_locked(stream_locked(stream, who), p, n, write, who, what);
  pthread_mutex_unlock(&sync_mu);
}

static char *dup_bytes(const void *p, size_t n) {
  char *d = malloc(n);
  if (d == NULL) {
    pthread_mutex_unlock(&sync_mu);
    standin_die("out of memory for the stream order's records");
  }
  return memcpy(d, p, n);
}

/* A copy of n > 0 checked bytes on `stream` (sync: a synchronous call,
 * whose end the host sees), one operation that reads src and writes dst.
 * Into pinned memory asynchronously, it is deferred: the bytes read now
 * land when the host sees the copy finish, or when later work ordered
 * after it touches them; meanwhile the destination holds POISON. From
 * pinned memory asynchronously, the source is snapshot: the host may not
 * change it before it sees the copy finish. */
static void order_copy(cudaStream_t stream, void *dst, const void *src,
                       size_t n, int sync, const char *who) {
  int dk = mem_kind(dst), sk = mem_kind(src);
  if (!order_enabled() || (dk == 0 && sk == 0)) {
    memmove(dst, src, n);
    return;
  }
  pthread_mutex_lock(&sync_mu);
  stream_t *s = stream_locked(stream, who);
  uint64_t seq = order_op(s);
  if (sk != 0)
    order_check(s, src, n, 0, who, "src");
  if (dk != 0)
    order_check(s, dst, n, 1, who, "dst");
  char *land = !sync && dk == 2 ? dup_bytes(src, n) : NULL;
  if (dk == 2)
    pinned_store(dst, land != NULL ? NULL : src, n);
  else
    memmove(dst, src, n);
  if (sk != 0)
    order_record(s, (uintptr_t)src, (uintptr_t)src + n, 0, seq,
                 !sync && sk == 2 ? dup_bytes(src, n) : NULL, who);
  if (dk != 0)
    order_record(s, (uintptr_t)dst, (uintptr_t)dst + n, 1, seq, land, who);
  if (sync)
    order_host_saw(s->vc);
  pthread_mutex_unlock(&sync_mu);
}

int standin_stream_device(cudaStream_t s, const char *who) {
  pthread_mutex_lock(&sync_mu);
  int dev = stream_locked(s, who)->dev;
  pthread_mutex_unlock(&sync_mu);
  int cur = standin_current_device();
  if (dev != cur)
    standin_die("%s: stream %p belongs to cuda:%d but cuda:%d is current", who,
                (void *)s, dev, cur);
  return dev;
}

void standin_stream_busy(cudaStream_t s, double seconds) {
  double t = now_s();
  pthread_mutex_lock(&sync_mu);
  stream_t *st = stream_locked(s, "standin_stream_busy");
  st->busy_until = (st->busy_until > t ? st->busy_until : t) + seconds;
  pthread_mutex_unlock(&sync_mu);
}

/* Sleeps until now_s() reaches t. */
static void wait_until(double t) {
  while (now_s() < t)
    nap(1000);
}

void standin_stream_hang(cudaStream_t s, unsigned long serial) {
  pthread_mutex_lock(&sync_mu);
  stream_locked(s, "standin_stream_hang")->hung = serial;
  pthread_mutex_unlock(&sync_mu);
}

void standin_stream_nccl(cudaStream_t s, unsigned long serial) {
  pthread_mutex_lock(&sync_mu);
  stream_locked(s, "standin_stream_nccl")->nccl = serial;
  pthread_mutex_unlock(&sync_mu);
}

/* ncclCommAbort ends the communicator's kernels, and with them the wait
 * of everything queued behind them on their streams: on a GPU the events
 * recorded after its work then fire as soon as the streams reach them.
 * Here those events (and only those) stop answering cudaErrorNotReady and
 * are no longer pending, so hvd may allocate right after an abort, as it
 * may on a GPU. Work before them that is still running (a stream made
 * busy, standin_stream_busy) keeps its own time: such an event fires then.
 * An event also behind a hung collective of another communicator stays
 * hung. Any other event stays as strict as before. */
void standin_nccl_aborted(unsigned long serial) {
  double t = now_s();
  pthread_mutex_lock(&sync_mu);
  for (event_t *e = events; e != NULL; e = e->next) {
    if (e->behind != serial || e->pending == NULL ||
        (e->hung != 0 && e->hung != serial)) /* hung on another comm */
      continue;
    e->polls_left = 0;
    e->hung = 0;
    if (e->at <= t)
      event_seen(e);
  }
  pthread_mutex_unlock(&sync_mu);
}

long standin_streams(void) {
  pthread_mutex_lock(&sync_mu);
  long n = nstreams;
  pthread_mutex_unlock(&sync_mu);
  return n;
}

long standin_events(void) {
  pthread_mutex_lock(&sync_mu);
  long n = nevents;
  pthread_mutex_unlock(&sync_mu);
  return n;
}

/* Events pending on streams made with a priority (hvd's). */
static int priority_pending(void) {
  int n = 0;
  pthread_mutex_lock(&sync_mu);
  for (stream_t *p = streams; p != NULL; p = p->next)
    if (p->priority)
      n += p->pending;
  pthread_mutex_unlock(&sync_mu);
  return n;
}

int standin_peak_in_flight(void) {
  pthread_mutex_lock(&sync_mu);
  int n = peak_pending;
  pthread_mutex_unlock(&sync_mu);
  return n;
}

/* cudaStreamWaitEvent calls so far (under sync_mu). */
static long stream_waits;

long standin_stream_waits(void) {
  pthread_mutex_lock(&sync_mu);
  long n = stream_waits;
  pthread_mutex_unlock(&sync_mu);
  return n;
}

long standin_not_ready_answers(void) {
  pthread_mutex_lock(&sync_mu);
  long n = not_ready;
  pthread_mutex_unlock(&sync_mu);
  return n;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream,
                                      unsigned int flags) {
  if (pStream == NULL)
    return fail(cudaErrorInvalidValue);
  stream_t *s = calloc(1, sizeof *s);
  if (s == NULL)
    return fail(cudaErrorMemoryAllocation);
  s->magic = STREAM_MAGIC;
  s->dev = standin_current_device();
  s->blocking = !(flags & cudaStreamNonBlocking);
  pthread_mutex_lock(&sync_mu);
  s->next = streams;
  streams = s;
  nstreams++;
  pthread_mutex_unlock(&sync_mu);
  *pStream = (cudaStream_t)s;
  return cudaSuccess;
}

/* Priorities as on an H100: 0 (least) to -5 (greatest). */
cudaError_t cudaDeviceGetStreamPriorityRange(int *leastPriority,
                                             int *greatestPriority) {
  if (leastPriority != NULL)
    *leastPriority = 0;
  if (greatestPriority != NULL)
    *greatestPriority = -5;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream,
                                         unsigned int flags, int priority) {
  if (priority < -5 || priority > 0)
    return fail(cudaErrorInvalidValue);
  cudaError_t r = cudaStreamCreateWithFlags(pStream, flags);
  if (r == cudaSuccess) {
    pthread_mutex_lock(&sync_mu);
    ((stream_t *)*pStream)->priority = 1;
    pthread_mutex_unlock(&sync_mu);
    engine_thread = 1;
  }
  return r;
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
  return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}

/* s is gone (sync_mu held): off the list, its events no longer pending
 * on it, its id free. */
static void stream_unlink_locked(stream_t *s) {
  for (stream_t **p = &streams; *p != NULL; p = &(*p)->next)
    if (*p == s) {
      *p = s->next;
      break;
    }
  for (event_t *e = events; e != NULL; e = e->next)
    if (e->pending == s)
      e->pending = NULL;
  if (s->id != 0)
    id_used[s->id] = 0;
  s->magic = 0;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  pthread_mutex_lock(&sync_mu);
  stream_t *s = stream_locked(stream, "cudaStreamDestroy");
  if (is_default(s) || s->per_thread) {
    pthread_mutex_unlock(&sync_mu);
    standin_die("cudaStreamDestroy: of a default stream");
  }
  stream_unlink_locked(s);
  nstreams--;
  pthread_mutex_unlock(&sync_mu);
  s->magic = 0;
  free(s);
  return cudaSuccess;
}

/* Waits while `serial` hangs: another thread may abort the communicator
 * meanwhile; after 10 s the process ends (a GPU would wait forever). */
static void wait_unhung(unsigned long serial, const char *who) {
  double t0 = now_s();
  while (serial != 0 && standin_nccl_hanging(serial)) {
    if (now_s() - t0 > 10)
      standin_die("%s: waits for an NCCL collective that never completes "
                  "(communicator not aborted): on a GPU this never returns",
                  who);
    nap(1000);
  }
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  pthread_mutex_lock(&sync_mu);
  stream_t *s = stream_locked(stream, "cudaStreamSynchronize");
  unsigned long hung = s->hung;
  double until = s->busy_until;
  pthread_mutex_unlock(&sync_mu);
  wait_unhung(hung, "cudaStreamSynchronize");
  wait_until(until);
  pthread_mutex_lock(&sync_mu);
  s = stream_locked(stream, "cudaStreamSynchronize");
  for (event_t *e = events; e != NULL; e = e->next)
    if (e->pending == s)
      event_seen(e);
  order_host_saw(s->vc);
  pthread_mutex_unlock(&sync_mu);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  pthread_mutex_lock(&sync_mu);
  unsigned long hung = stream_locked(stream, "cudaStreamQuery")->hung;
  pthread_mutex_unlock(&sync_mu);
  if (hung != 0 && standin_nccl_hanging(hung))
    return cudaErrorNotReady;
  pthread_mutex_lock(&sync_mu); /* the host saw its work finish */
  order_host_saw(stream_locked(stream, "cudaStreamQuery")->vc);
  pthread_mutex_unlock(&sync_mu);
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  int dev = standin_current_device();
  for (;;) {
    unsigned long hung = 0;
    pthread_mutex_lock(&sync_mu);
    for (stream_t *p = streams; p != NULL && hung == 0; p = p->next)
      if (p->dev == dev && p->hung != 0 && standin_nccl_hanging(p->hung))
        hung = p->hung;
    if (hung == 0 && defaults[dev].hung != 0 &&
        standin_nccl_hanging(defaults[dev].hung))
      hung = defaults[dev].hung;
    if (hung == 0) {
      order_device_saw(dev);
      for (event_t *e = events; e != NULL; e = e->next)
        if (e->pending != NULL && e->pending->dev == dev)
          event_seen(e);
    }
    pthread_mutex_unlock(&sync_mu);
    if (hung == 0)
      return cudaSuccess;
    wait_unhung(hung, "cudaDeviceSynchronize");
  }
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  if (event == NULL)
    return fail(cudaErrorInvalidValue);
  event_t *e = calloc(1, sizeof *e);
  if (e == NULL)
    return fail(cudaErrorMemoryAllocation);
  e->magic = EVENT_MAGIC;
  e->flags = flags;
  e->dev = standin_current_device();
  pthread_mutex_lock(&sync_mu);
  e->next = events;
  events = e;
  nevents++;
  pthread_mutex_unlock(&sync_mu);
  *event = (cudaEvent_t)e;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  pthread_mutex_lock(&sync_mu);
  event_t *e = event_locked(event, "cudaEventDestroy");
  event_seen(e);
  for (event_t **p = &events; *p != NULL; p = &(*p)->next)
    if (*p == e) {
      *p = e->next;
      break;
    }
  nevents--;
  pthread_mutex_unlock(&sync_mu);
  e->magic = 0;
  free(e);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  int polls = standin_polls();
  int dev = standin_stream_device(stream, "cudaEventRecord");
  pthread_mutex_lock(&sync_mu);
  event_t *e = event_locked(event, "cudaEventRecord");
  stream_t *s = stream_locked(stream, "cudaEventRecord");
  if (e->dev != dev) {
    pthread_mutex_unlock(&sync_mu);
    standin_die("cudaEventRecord: event of cuda:%d on a stream of cuda:%d",
                e->dev, dev);
  }
  e->polls_left = polls;
  e->hung = s->hung;
  e->behind = s->nccl;
  e->recorded = 1;
  e->at = now_s();
  if (s->busy_until > e->at)
    e->at = s->busy_until;
  e->id = 0;
  event_seen(e);
  e->pending = s;
  /* a group's end (hvd's are made with cudaEventDisableTiming); timing
   * events (HVD_GPU_TIMING's) mark no work in flight */
  e->counted = (e->flags & cudaEventDisableTiming) != 0;
  s->pending += e->counted;
  if (s->priority && s->pending > peak_pending)
    peak_pending = s->pending;
  if (order_enabled()) {
    (void)order_op(s);
    memcpy(e->vc, s->vc, sizeof e->vc);
    e->id = s->id;
  }
  pthread_mutex_unlock(&sync_mu);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  cudaError_t r = cudaSuccess;
  pthread_mutex_lock(&sync_mu);
  event_t *e = event_locked(event, "cudaEventQuery");
  unsigned long hung = e->hung;
  if (e->polls_left > 0) {
    e->polls_left--;
    r = cudaErrorNotReady;
  } else if (now_s() < e->at) { /* its stream is still busy */
    r = cudaErrorNotReady;
  }
  pthread_mutex_unlock(&sync_mu);
  if (r == cudaSuccess && hung != 0 && standin_nccl_hanging(hung))
    r = cudaErrorNotReady;
  pthread_mutex_lock(&sync_mu);
  if (r == cudaErrorNotReady) {
    not_ready++;
  } else {
    e = event_locked(event, "cudaEventQuery");
    event_seen(e);
    order_host_saw(e->vc);
  }
  pthread_mutex_unlock(&sync_mu);
  return r; /* NotReady is not an error: the last error stays */
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  pthread_mutex_lock(&sync_mu);
  event_t *e = event_locked(event, "cudaEventSynchronize");
  unsigned long hung = e->hung;
  double at = e->at;
  e->polls_left = 0;
  pthread_mutex_unlock(&sync_mu);
  wait_unhung(hung, "cudaEventSynchronize");
  wait_until(at);
  pthread_mutex_lock(&sync_mu);
  e = event_locked(event, "cudaEventSynchronize");
  event_seen(e);
  order_host_saw(e->vc);
  pthread_mutex_unlock(&sync_mu);
  return cudaSuccess;
}

/* Whether recorded e has completed as a GPU would say (sync_mu held; a
 * hung collective checked apart): the host saw it fire, or it has no
 * cudaErrorNotReady answers left, or its operation is ordered before
 * something the host saw finish (the stream order's clocks: an event
 * before a later one of its stream that the host waited for). */
static int event_complete(const event_t *e) {
  return now_s() >= e->at &&
         (e->pending == NULL || e->polls_left == 0 ||
          (e->id != 0 && host_vc[e->id] >= e->vc[e->id]));
}

/* As CUDA: cudaErrorInvalidResourceHandle for an event made with
 * cudaEventDisableTiming or never recorded, cudaErrorNotReady while
 * either has not completed (cudaEventQuery would say so); else the
 * milliseconds between the host times at which each was recorded (the
 * work ran at the call). */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start,
                                 cudaEvent_t end) {
  if (ms == NULL)
    return fail(cudaErrorInvalidValue);
  pthread_mutex_lock(&sync_mu);
  event_t *a = event_locked(start, "cudaEventElapsedTime");
  event_t *b = event_locked(end, "cudaEventElapsedTime");
  cudaError_t r = cudaSuccess;
  if (((a->flags | b->flags) & cudaEventDisableTiming) || !a->recorded ||
      !b->recorded)
    r = cudaErrorInvalidResourceHandle;
  else if (!event_complete(a) || !event_complete(b))
    r = cudaErrorNotReady;
  unsigned long hung[2] = {a->hung, b->hung};
  double dt = (b->at - a->at) * 1e3;
  pthread_mutex_unlock(&sync_mu);
  for (int i = 0; i < 2 && r == cudaSuccess; i++)
    if (hung[i] != 0 && standin_nccl_hanging(hung[i]))
      r = cudaErrorNotReady;
  if (r == cudaErrorNotReady)
    return r; /* not an error, as for cudaEventQuery: the last error stays */
  if (r != cudaSuccess)
    return fail(r);
  *ms = (float)dt;
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                unsigned int flags) {
  if (flags != 0)
    return fail(cudaErrorInvalidValue);
  /* the stream must be the current device's; the event may be another's */
  (void)standin_stream_device(stream, "cudaStreamWaitEvent");
  pthread_mutex_lock(&sync_mu);
  stream_t *s = stream_locked(stream, "cudaStreamWaitEvent");
  event_t *e = event_locked(event, "cudaStreamWaitEvent");
  stream_waits++;
  (void)stream_id(s);
  vc_merge(s->vc, e->vc);
  if (e->recorded && e->at > s->busy_until) /* a GPU's stream waits */
    s->busy_until = e->at;
  pthread_mutex_unlock(&sync_mu);
  return cudaSuccess;
}
