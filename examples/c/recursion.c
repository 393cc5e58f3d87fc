/* Recursion: factorial and a mutually recursive even/odd pair. */
#include <stdio.h>

static unsigned long factorial(unsigned n) {
    if (n <= 1)
        return 1; /* BASE CASE */
    return n * factorial(n - 1);
}

static int is_odd(unsigned n);
static int is_even(unsigned n) { return n == 0 ? 1 : is_odd(n - 1); }
static int is_odd(unsigned n) { return n == 0 ? 0 : is_even(n - 1); }

int main(void) {
    unsigned long f = factorial(10);
    int e = is_even(7);
    printf("factorial(10)=%lu is_even(7)=%d\n", f, e);
    return 0;
}
