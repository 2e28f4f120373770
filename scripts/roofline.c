/* This machine's roofs for scripts/bench.py, built with `cc -O3 -march=native -fopenmp`.

   roofline peak THREADS        fp32 multiply-add GFLOP/s: 12 independent accumulators of one native vector each,
                                so the FMA pipes, not latency, bound the loop; best of 5.
   roofline read BYTES THREADS  GB/s and microseconds to read BYTES once, split across THREADS, with the data
                                already where repeated calls leave it (the cache, when it fits); best of 2000.
                                Includes one OpenMP fork/join per read, as a parallel kernel call pays.
   Plain vector extensions, not intrinsics: the compiler uses the widest vectors -march=native allows. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif
typedef float vec __attribute__((vector_size(LANES * 4)));

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static double peak(int threads) {
  const long iters = 20000000;
  double best = 0;
  for (int rep = 0; rep < 5; rep++) {
    double start = now();
    float sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
      vec acc[12], mul, add;
      for (int i = 0; i < LANES; i++) {
        mul[i] = 1.0000001f;
        add[i] = 1e-7f;
      }
      for (int k = 0; k < 12; k++)
        for (int i = 0; i < LANES; i++) acc[k][i] = (float)(k + omp_get_thread_num());
      for (long n = 0; n < iters; n++) {
#pragma GCC unroll 12
        for (int k = 0; k < 12; k++) acc[k] = acc[k] * mul + add;
      }
      for (int k = 0; k < 12; k++)
        for (int i = 0; i < LANES; i++) sink += acc[k][i];
    }
    double seconds = now() - start;
    double gflops = 2.0 * LANES * 12 * iters * threads / seconds / 1e9;
    if (sink == 1.2345f) printf("#");
    if (gflops > best) best = gflops;
  }
  return best;
}

static void read_bandwidth(long bytes, int threads, double *gbs, double *us) {
  long per_thread = (bytes / threads + 63) / 64 * 64;
  long floats = per_thread / 4;
  float *data = aligned_alloc(64, per_thread * threads);
  for (long i = 0; i < floats * threads; i++) data[i] = 1.0f;
  double best = 1e9;
  float total = 0;
  for (int rep = 0; rep < 2000; rep++) {
    double start = now();
    float sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
      const vec *p = (const vec *)(data + omp_get_thread_num() * floats);
      vec s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
      long n = floats / LANES;
      for (long i = 0; i + 3 < n; i += 4) {
        s0 += p[i];
        s1 += p[i + 1];
        s2 += p[i + 2];
        s3 += p[i + 3];
      }
      vec s = s0 + s1 + s2 + s3;
      for (int i = 0; i < LANES; i++) sink += s[i];
    }
    double seconds = now() - start;
    total += sink;
    if (seconds < best) best = seconds;
  }
  if (total == 1.2345f) printf("#");
  free(data);
  *gbs = (double)per_thread * threads / best / 1e9;
  *us = best * 1e6;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "peak") == 0) {
    printf("%.2f\n", peak(atoi(argv[2])));
    return 0;
  }
  if (argc == 4 && strcmp(argv[1], "read") == 0) {
    double gbs, us;
    read_bandwidth(atol(argv[2]), atoi(argv[3]), &gbs, &us);
    printf("%.2f %.3f\n", gbs, us);
    return 0;
  }
  fprintf(stderr, "usage: roofline peak THREADS | roofline read BYTES THREADS\n");
  return 2;
}
