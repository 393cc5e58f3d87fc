/* fork, and the parent ends without waiting for the child (which prints and exits with 3). */
#include <stdio.h>
#include <unistd.h>

int main(void) {
    pid_t child = fork();
    if (child == 0) {
        printf("child of fork_nowait\n");
        fflush(stdout);
        _exit(3);
    }
    printf("parent of fork_nowait\n"); /* PARENT LINE */
    fflush(stdout);
    return 0;
}
