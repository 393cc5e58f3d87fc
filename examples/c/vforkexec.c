/* vfork, then exec in the child (as posix_spawn and system do); the parent waits for it. */
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

int after_spawn(int status) {
    return status * 2; /* AFTER LINE */
}

int main(int argc, char **argv) {
    if (argc < 2)
        return 2;
    pid_t child = vfork();
    if (child == 0) {
        execl(argv[1], argv[1], "from-vfork", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    waitpid(child, &status, 0);
    int r = after_spawn(WEXITSTATUS(status));
    printf("vfork parent saw %d -> %d\n", WEXITSTATUS(status), r);
    return 0;
}
