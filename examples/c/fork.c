/* fork() and posix_spawn() (a vfork-style clone): ptrewind detaches the children and keeps
   debugging the parent. */
#include <spawn.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static int after_children(int a, int b) {
    return a + b; /* AFTER LINE */
}

int main(void) {
    pid_t child = fork();
    if (child == 0)
        _exit(7);
    int status = 0;
    waitpid(child, &status, 0);
    pid_t spawned;
    char *argv[] = {"true", NULL};
    int rc = posix_spawn(&spawned, "/bin/true", NULL, NULL, argv, environ);
    int status2 = 0;
    if (rc == 0)
        waitpid(spawned, &status2, 0);
    int r = after_children(WEXITSTATUS(status), WEXITSTATUS(status2));
    printf("children: %d\n", r);
    return r == 7 ? 0 : 1;
}
