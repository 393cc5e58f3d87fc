/* Installs a SIGUSR1 handler and raises the signal: the debugger sees the signal, passes it,
   and the handler runs. */
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

static volatile sig_atomic_t hits;

static void on_usr1(int sig) {
    hits += sig; /* HANDLER LINE */
}

int main(void) {
    struct sigaction sa = {0};
    sa.sa_handler = on_usr1;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    raise(SIGUSR1);
    printf("hits=%d\n", (int)hits);
    return hits == SIGUSR1 ? 0 : 1;
}
