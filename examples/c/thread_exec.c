/* A thread other than the main one calls exec: the kernel ends every other thread and the
 * process goes on in the new program under the main thread's id. */
#include <pthread.h>
#include <unistd.h>

static const char *image;

static void *worker(void *arg) {
    (void)arg;
    execl(image, image, "from-thread", (char *)NULL);
    return NULL;
}

int main(int argc, char **argv) {
    pthread_t t;
    if (argc < 2)
        return 2;
    image = argv[1];
    pthread_create(&t, NULL, worker, NULL);
    for (;;)
        pause(); /* until the exec ends this thread */
}
