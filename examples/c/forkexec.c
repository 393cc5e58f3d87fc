/* fork (the child runs a function the parent has a breakpoint in), then exec of another program. */
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

int shared_work(int x) {
    return x * 3; /* SHARED LINE */
}

int main(int argc, char **argv) {
    pid_t child = fork();
    if (child == 0) {
        printf("child computed %d\n", shared_work(5));
        fflush(stdout);
        _exit(shared_work(2));
    }
    int status = 0;
    waitpid(child, &status, 0);
    int r = shared_work(WEXITSTATUS(status));
    printf("parent saw %d -> %d\n", WEXITSTATUS(status), r);
    fflush(stdout);
    if (argc > 1)
        execl(argv[1], argv[1], "from-exec", (char *)NULL);
    return 1;
}
