/* `next` over one-line loops: GDB range-steps them (`vCont;r`), one stop for the whole line.
 * The markers name lines for tests/reverse.rs and tests/qemu_live.rs. */
#include <stdio.h>

volatile long sink;
volatile int forever;

int main(int argc, char **argv) {
    long s = 0;
    for (long i = 0; i < 1000; i++) s += i * 3 + 1; /* @loop */
    sink = s; /* @after */
    for (long i = 0; i < 50; i++) { s -= i; __asm__ volatile(".globl mid_line\nmid_line:"); } /* @mid */
    sink = s; /* @after-mid */
    if (argc > 1) while (!forever) sink++; /* @spin */
    printf("%ld\n", s);
    return 0;
}
