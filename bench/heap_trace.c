// Where a run's resident memory goes, without rebuilding it: an LD_PRELOAD library that samples
// the process's resident set and glibc's malloc statistics (mallinfo2) every 5 ms, logs every
// allocation of 1 MiB or more made through posix_memalign (LibTorch's CPU allocator) and its
// free with the thread that made it, and at exit writes malloc_info (each arena's size and high
// water) and /proc/self/smaps_rollup. One file per process, HEAP_TRACE_DIR/<pid>.txt. Used for
// the findings in docs/memory-plan.md ("Where the rest goes").
//
//   cc -O2 -shared -fPIC -o /tmp/heap_trace.so bench/heap_trace.c -ldl -lpthread
//   HEAP_TRACE_DIR=/tmp/trace LD_PRELOAD=/tmp/heap_trace.so lockstep run --nproc-per-node 2 --
//       lockstep train --model mlp-wide --data synthetic --limit 1000 --strategy zero2 --epochs 1
//
// Sample lines: "<ms> ms rss <MiB> arena <MiB> mmap <MiB> inuse <MiB> free <MiB> threads <n>"
// (arena: bytes glibc took from the kernel for its heaps, all arenas; inuse/free: within them;
// mmap: blocks above the mmap threshold). Allocation lines: "<ms> A|F tid <tid> <MiB> <address>".
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { kTracked = 4096 };  // large blocks live at once, at most
static FILE* out;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct timespec start;
static volatile int stopping;
static pthread_t sampler;
static void* blocks[kTracked];
static size_t sizes[kTracked];
static int (*real_posix_memalign)(void**, size_t, size_t);
static void (*real_free)(void*);

static long now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (t.tv_sec - start.tv_sec) * 1000 + (t.tv_nsec - start.tv_nsec) / 1000000;
}

static long status_field(const char* key) {  // a /proc/self/status number (kB, or a count)
  FILE* f = fopen("/proc/self/status", "r");
  char line[256];
  long value = 0;
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, key, strlen(key)) == 0) value = atol(line + strlen(key));
  if (f) fclose(f);
  return value;
}

static void* sample(void* unused) {
  (void)unused;
  long last = -1;
  while (!stopping) {
    const long rss = status_field("VmRSS:");
    if (labs(rss - last) >= 1024) {  // a line per MiB of change
      const struct mallinfo2 m = mallinfo2();
      const long threads = status_field("Threads:");  // outside the lock: fclose frees
      pthread_mutex_lock(&lock);
      fprintf(out, "%ld ms rss %ld arena %zu mmap %zu inuse %zu free %zu threads %ld\n", now_ms(), rss >> 10,
              m.arena >> 20, m.hblkhd >> 20, m.uordblks >> 20, m.fordblks >> 20, threads);
      fflush(out);
      pthread_mutex_unlock(&lock);
      last = rss;
    }
    usleep(5000);
  }
  return NULL;
}

static void resolve(void) {
  if (real_free) return;
  real_posix_memalign = (int (*)(void**, size_t, size_t))dlsym(RTLD_NEXT, "posix_memalign");
  real_free = (void (*)(void*))dlsym(RTLD_NEXT, "free");
}

int posix_memalign(void** p, size_t alignment, size_t n) {
  resolve();
  const int r = real_posix_memalign(p, alignment, n);
  if (out && r == 0 && n >= (1 << 20)) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < kTracked; ++i)
      if (!blocks[i]) {
        blocks[i] = *p;
        sizes[i] = n;
        break;
      }
    fprintf(out, "%ld A tid %ld %.2f %p\n", now_ms(), (long)syscall(SYS_gettid), n / 1048576.0, *p);
    pthread_mutex_unlock(&lock);
  }
  return r;
}

void free(void* p) {
  resolve();
  if (out && p) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < kTracked; ++i)
      if (blocks[i] == p) {
        fprintf(out, "%ld F tid %ld %.2f %p\n", now_ms(), (long)syscall(SYS_gettid), sizes[i] / 1048576.0, p);
        blocks[i] = NULL;
        break;
      }
    pthread_mutex_unlock(&lock);
  }
  real_free(p);
}

__attribute__((constructor)) static void begin(void) {
  resolve();
  const char* dir = getenv("HEAP_TRACE_DIR");
  if (!dir) return;
  char path[512];
  snprintf(path, sizeof path, "%s/%d.txt", dir, (int)getpid());
  clock_gettime(CLOCK_MONOTONIC, &start);
  out = fopen(path, "w");
  if (out) pthread_create(&sampler, NULL, sample, NULL);
}

__attribute__((destructor)) static void end(void) {
  if (!out) return;
  stopping = 1;
  pthread_join(sampler, NULL);
  pthread_mutex_lock(&lock);
  FILE* done = out;
  out = NULL;  // from here on, free() logs nothing and takes no lock
  pthread_mutex_unlock(&lock);
  fprintf(done, "--- malloc_info\n");
  malloc_info(0, done);
  fprintf(done, "--- smaps_rollup\n");
  FILE* f = fopen("/proc/self/smaps_rollup", "r");
  char line[256];
  while (f && fgets(line, sizeof line, f)) fputs(line, done);
  if (f) fclose(f);
  fprintf(done, "VmHWM: %ld kB\n", status_field("VmHWM:"));
  fclose(done);
}
