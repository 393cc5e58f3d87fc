/* posix_spawn (glibc: clone3 with CLONE_VM | CLONE_VFORK on a stack of its own, then exec in
 * the child); the parent waits for the child. */
#include <spawn.h>
#include <stdio.h>
#include <sys/wait.h>

extern char **environ;

int main(int argc, char **argv) {
    pid_t pid;
    if (argc < 2)
        return 2;
    char *args[] = {argv[1], "from-spawn", NULL};
    if (posix_spawn(&pid, argv[1], NULL, NULL, args, environ) != 0)
        return 3;
    int status = 0;
    waitpid(pid, &status, 0);
    printf("spawn parent saw %d\n", WEXITSTATUS(status));
    return 0;
}
