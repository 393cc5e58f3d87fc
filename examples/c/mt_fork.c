/* A process with two threads forks: the child (a copy of the forking thread only) runs on its
 * own; the other thread waits in a system call at the fork. */
#include <pthread.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static int pipefd[2];

int child_work(int x) {
    return x * 7; /* CHILD LINE */
}

static void *worker(void *arg) {
    char c;
    (void)arg;
    /* Blocks until main writes, after the child ended. */
    if (read(pipefd[0], &c, 1) != 1)
        return NULL;
    return (void *)(long)(c + 1);
}

int main(void) {
    pthread_t t;
    if (pipe(pipefd) != 0)
        return 2;
    pthread_create(&t, NULL, worker, NULL);
    pid_t child = fork();
    if (child == 0) {
        int r = child_work(3);
        printf("child of two threads %d\n", r);
        fflush(stdout);
        _exit(r);
    }
    int status = 0;
    waitpid(child, &status, 0);
    char c = 'a';
    if (write(pipefd[1], &c, 1) != 1)
        return 3;
    void *res;
    pthread_join(t, &res);
    printf("parent saw %d, worker %ld\n", WEXITSTATUS(status), (long)res);
    return 0;
}
