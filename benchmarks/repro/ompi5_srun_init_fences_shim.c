/* LD_PRELOAD shim for ompi5_srun_init_fences_probe.py: one rank's PMIx fence releases 0.5 s late.
 *
 * LD_PRELOAD shim for ompi5_srun_init_fences_probe.py: holds back every PMIx fence release of
 * one rank (MPIGPU_TEST_SLOW_FENCE_RANK, compared with PMIX_RANK) by 0.5 s, and notes each fence
 * call and late release, with the wall-clock time, in $FENCE_LOG (the hosts share /tmp).
 *   cc -shared -fPIC -O2 -o /tmp/slow_fence.so ompi5_srun_init_fences_shim.c -ldl
 * libpmix is loaded by libmpi without RTLD_GLOBAL, so RTLD_NEXT cannot see it: the real
 * PMIx_Fence_nb is looked up in the loaded libpmix itself. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int status_t;
typedef void (*release_fn)(status_t, void*);
typedef status_t (*fence_nb_fn)(const void*, size_t, const void*, size_t, release_fn, void*);

struct held {
  release_fn release;
  void* cbdata;
};

static void note(const char* what) {
  const char* path = getenv("FENCE_LOG");
  if (!path) return;
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  char line[160];
  int n = snprintf(line, sizeof line, "%ld.%06ld rank %s %s\n", (long)t.tv_sec, t.tv_nsec / 1000,
                   getenv("PMIX_RANK"), what);
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
  if (fd >= 0) {
    (void)!write(fd, line, n);
    close(fd);
  }
}

static void released_late(status_t status, void* p) {
  struct held h = *(struct held*)p;
  free(p);
  usleep(500 * 1000);
  note("fence released (0.5 s late)");
  h.release(status, h.cbdata);
}

static int slow_here(void) {
  const char* want = getenv("MPIGPU_TEST_SLOW_FENCE_RANK");
  const char* mine = getenv("PMIX_RANK");
  return want && mine && strcmp(want, mine) == 0;
}

static int find_pmix(struct dl_phdr_info* info, size_t size, void* out) {
  (void)size;
  if (!strstr(info->dlpi_name, "libpmix")) return 0;
  void* lib = dlopen(info->dlpi_name, RTLD_NOLOAD | RTLD_LAZY);
  if (lib) *(void**)out = dlsym(lib, "PMIx_Fence_nb");
  return *(void**)out != NULL;
}

status_t PMIx_Fence_nb(const void* procs, size_t nprocs, const void* info, size_t ninfo,
                       release_fn release, void* cbdata) {
  void* found = NULL;
  dl_iterate_phdr(find_pmix, &found);
  fence_nb_fn real = (fence_nb_fn)found;
  note("fence called");
  if (!slow_here() || release == NULL) return real(procs, nprocs, info, ninfo, release, cbdata);
  struct held* h = malloc(sizeof *h);
  h->release = release;
  h->cbdata = cbdata;
  return real(procs, nprocs, info, ninfo, released_late, h);
}
