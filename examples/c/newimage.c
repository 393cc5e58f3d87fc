/* The program forkexec execs: prints and exits with a status of its own. */
#include <stdio.h>

int new_image_work(int x) {
    return x + 40; /* NEW LINE */
}

int main(int argc, char **argv) {
    int r = new_image_work(argc);
    printf("new image %s %d\n", argc > 1 ? argv[1] : "-", r);
    return r == 42 ? 5 : 1;
}
