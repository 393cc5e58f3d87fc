/* The loop of calls and data-dependent branches that bench_gdb_latency times and
   tests/round_trips.rs steps through (`latency_loop N`: N iterations; `done` marks the end). */
#include <stdlib.h>
volatile long sink;
__attribute__((noinline)) static long mix(long x) { return x * 2654435761L ^ (x >> 7); }
__attribute__((noinline)) void done(long s) { sink = s; }
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000;
    long s = 0;
    for (long i = 0; i < n; i++) {
        if (mix(i) & 4) s += i; else s ^= mix(s);
    }
    done(s);
    return 0;
}
