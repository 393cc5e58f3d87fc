/* Write watchpoints: a global written four times with long loops between the writes, and a
 * buffer filled by read(2). total goes 0 -> 1 -> 11 -> 33 -> 29; buf receives "hello".
 * argv[1]: iterations of each loop (default 2000; about 10 instructions each at -O0). */
#include <stdlib.h>
#include <unistd.h>

long total;
char buf[16];
volatile long sink;

static void spin(long n) {
    for (long i = 0; i < n; i++)
        sink += i;
}

void done(void) { sink = 0; }

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 2000;
    int fds[2];
    total = 1; /* W1 */
    spin(n);
    total += 10; /* W2 */
    spin(n);
    total *= 3; /* W3 */
    if (pipe(fds) != 0)
        return 1;
    if (write(fds[1], "hello", 5) != 5)
        return 1;
    if (read(fds[0], buf, 5) != 5) /* R */
        return 1;
    spin(n);
    total -= 4; /* W4 */
    done();
    return 0;
}
