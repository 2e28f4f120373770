/* scripts/bench_steal.py's experiment: a TVMBackendParallelLaunch whose caller never waits on a helper that has
   not started. A parallel loop is cut into `chunks` tasks; the caller and one helper thread (spinning `spin_ns`
   after its last chunk, then sleeping) take tasks from one counter, so a helper held off its core leaves its
   tasks to the caller; the caller waits only for a task the helper has begun. One caller at a time owns the
   helper; another runs its loop alone. Not for kernels that use TVMBackendParallelBarrier. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

typedef struct { void* sync_handle; int32_t num_task; } Env;
typedef int (*Lambda)(int, Env*, void*);

typedef struct {
  Lambda f; void* cdata; Env env; int n;
  _Atomic int next; _Atomic int done; _Atomic int err;
} Job;

static Job job;
static _Atomic unsigned seq;
static atomic_flag owner = ATOMIC_FLAG_INIT;
static _Atomic int started, sleeping;
static int chunks = 4;
static long spin_ns = 300000;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static _Atomic long helper_chunks, caller_chunks, solo_calls, launches;

static uint64_t now_ns(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000ull + t.tv_nsec; }

static int run_chunks(Job* j, _Atomic long* count) {
  int i, ran = 0;
  while ((i = atomic_fetch_add(&j->next, 1)) < j->n) {
    if (j->f(i, &j->env, j->cdata) != 0) atomic_store(&j->err, 1);
    atomic_fetch_add(&j->done, 1);
    ran++;
  }
  atomic_fetch_add(count, ran);
  return ran;
}

static void* helper(void* arg) {
  unsigned seen = atomic_load(&seq);
  for (;;) {
    uint64_t t0 = now_ns();
    int spins = 0;
    while (atomic_load_explicit(&seq, memory_order_acquire) == seen) {
      if ((++spins & 255) == 0 && now_ns() - t0 > (uint64_t)spin_ns) {
        pthread_mutex_lock(&mu);
        atomic_store(&sleeping, 1);
        while (atomic_load(&seq) == seen) pthread_cond_wait(&cv, &mu);
        atomic_store(&sleeping, 0);
        pthread_mutex_unlock(&mu);
        break;
      }
      __builtin_ia32_pause();
    }
    seen = atomic_load(&seq);
    run_chunks(&job, &helper_chunks);
  }
  return 0;
}

void rlopt_steal_config(int n_chunks, long spin) { chunks = n_chunks; spin_ns = spin; }
void rlopt_steal_stats(long* out) { out[0] = helper_chunks; out[1] = caller_chunks; out[2] = solo_calls; out[3] = launches; }

int rlopt_parallel_launch(Lambda f, void* cdata, int num_task) {
  atomic_fetch_add(&launches, 1);
  if (chunks <= 1 || atomic_flag_test_and_set(&owner)) {  /* another caller holds the helper: run alone */
    Env env = {0, 1};
    atomic_fetch_add(&solo_calls, 1);
    return f(0, &env, cdata);
  }
  if (!atomic_exchange(&started, 1)) {
    pthread_t t; pthread_attr_t a; pthread_attr_init(&a); pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    pthread_create(&t, &a, helper, 0);
  }
  job.f = f; job.cdata = cdata; job.env.sync_handle = 0; job.env.num_task = chunks; job.n = chunks;
  atomic_store(&job.done, 0); atomic_store(&job.err, 0);
  atomic_store_explicit(&job.next, 0, memory_order_release);
  atomic_fetch_add_explicit(&seq, 1, memory_order_release);
  if (atomic_load(&sleeping)) { pthread_mutex_lock(&mu); pthread_cond_signal(&cv); pthread_mutex_unlock(&mu); }
  run_chunks(&job, &caller_chunks);
  while (atomic_load_explicit(&job.done, memory_order_acquire) < job.n) __builtin_ia32_pause();
  int err = atomic_load(&job.err);
  atomic_flag_clear(&owner);
  return err ? -1 : 0;
}

void* rlopt_parallel_launch_address(void) { return (void*)&rlopt_parallel_launch; }
