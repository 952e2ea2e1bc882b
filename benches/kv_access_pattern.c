/*
 * How fast one core reads a KV cache laid out as Switchyard's blocks, against
 * the same bytes read contiguously (docs/perf-notes.md, "Decode at depth").
 *
 * A decode task reads one KV head's 8 KB run of each 24 KB block (SmolLM2:
 * three KV heads, 32 positions of F16 keys and values), widening f16 to f32
 * as attention does. Modes:
 *   scattered   the runs of randomly placed blocks (SEQ=1: blocks in
 *               allocation order, as a cache filled front to back);
 *   contiguous  the same bytes as one stream;
 * each with and without a software prefetch of the next run (pf=1).
 * HUGE=1 places the scattered blocks in one 2 MB-page (THP) arena.
 *
 *   gcc -O2 -mavx512f -mf16c -mavx2 benches/kv_access_pattern.c -o /tmp/kvap -lpthread
 *   /tmp/kvap            # SEQ=1 /tmp/kvap, HUGE=1 /tmp/kvap
 *
 * Prints GB/s of run bytes read. Needs AVX-512 F; run on a quiet machine.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#define RUN 8192    /* one KV head's part of a block */
#define RUNS 24000  /* 196 MB of runs, far past L3 */

static char **runs;
static char *contiguous;
static int mode_contiguous, prefetch;
static float sink[32];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static const char *run_at(long c) {
    return mode_contiguous ? contiguous + (size_t)c * RUN : runs[c];
}

/* Reads half of the runs (`id` 0 or 1) three times: widen each run into an
 * L1 buffer, then sum it (the kernels' reread). */
static void *read_half(void *arg) {
    long id = (long)arg, half = RUNS / 2;
    __m512 s = _mm512_setzero_ps();
    static __thread float buf[RUN / 2];
    for (int r = 0; r < 3; r++) {
        for (long c = id * half; c < (id + 1) * half; c++) {
            const char *p = run_at(c);
            if (prefetch && c + 1 < RUNS) {
                const char *q = run_at(c + 1);
                for (int o = 0; o < RUN; o += 64) _mm_prefetch(q + o, _MM_HINT_T0);
            }
            for (int o = 0; o < RUN; o += 32)
                _mm512_storeu_ps(buf + o / 2, _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(p + o))));
            for (int o = 0; o < RUN / 2; o += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(buf + o));
        }
    }
    _mm512_storeu_ps(sink + id * 16, s);
    return 0;
}

int main(void) {
    char **blocks = malloc(sizeof(char *) * RUNS);
    char *arena = 0;
    if (getenv("HUGE")) {
        size_t bytes = (size_t)RUNS * 3 * RUN + (4 << 20);
        arena = mmap(0, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        arena = (char *)(((size_t)arena + (2 << 20) - 1) & ~((size_t)(2 << 20) - 1));
        madvise(arena, (size_t)RUNS * 3 * RUN, MADV_HUGEPAGE);
    }
    for (long i = 0; i < RUNS; i++) {
        blocks[i] = arena ? arena + (size_t)i * 3 * RUN : malloc(3 * RUN);
        for (int o = 0; o < 3 * RUN; o += 64) blocks[i][o] = 1;
    }
    runs = malloc(sizeof(char *) * RUNS);
    for (long i = 0; i < RUNS; i++) {
        long b = getenv("SEQ") ? i : (i * 7919) % RUNS;
        runs[i] = blocks[b] + RUN; /* the middle head's run */
    }
    contiguous = aligned_alloc(64, (size_t)(RUNS + 1) * RUN);
    for (size_t o = 0; o < (size_t)(RUNS + 1) * RUN; o += 64) contiguous[o] = 1;

    for (mode_contiguous = 0; mode_contiguous < 2; mode_contiguous++)
        for (prefetch = 0; prefetch < 2; prefetch++)
            for (int threads = 1; threads <= 2; threads++) {
                double t = now();
                if (threads == 1) {
                    read_half((void *)0);
                    read_half((void *)1);
                } else {
                    pthread_t a, b;
                    pthread_create(&a, 0, read_half, (void *)0);
                    pthread_create(&b, 0, read_half, (void *)1);
                    pthread_join(a, 0);
                    pthread_join(b, 0);
                }
                printf("%s pf=%d threads=%d: %.1f GB/s\n",
                       mode_contiguous ? "contiguous" : "scattered", prefetch, threads,
                       3.0 * RUNS * RUN / (now() - t) / 1e9);
            }
    return 0;
}
