/* Calls into a shared library we build (libshared.so) and into libc. */
#include <stdio.h>

int shared_scale(int x);

int main(void) {
    int v = shared_scale(20);
    puts("called shared_scale");
    return v == 41 ? 0 : 1;
}
