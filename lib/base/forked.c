/* forked.c - whether this process is a child forked after hvd_init
 * (forked.h). pthread_atfork's child handler sets a flag in the child:
 * glibc runs it for fork(), not for posix_spawn or vfork, whose children
 * exec before they could call hvd. */
#include "base/forked.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static atomic_int forked;
static long parent;

static void in_child(void) {
  atomic_store_explicit(&forked, 1, memory_order_relaxed);
}

static void arm(void) {
  parent = (long)getpid();
  (void)pthread_atfork(NULL, NULL, in_child);
}

void hvd__fork_watch(void) { pthread_once(&once, arm); }

int hvd__forked(void) {
  return atomic_load_explicit(&forked, memory_order_relaxed);
}

long hvd__fork_parent(void) { return parent; }
