/* Creates a thread: ptrewind records it too (breakpoints in it are reached in that thread). */
#include <pthread.h>
#include <stdio.h>

static void *worker(void *arg) {
    long n = (long)arg;
    long sum = 0;
    for (long i = 1; i <= n; i++)
        sum += i;
    return (void *)sum;
}

int main(void) {
    pthread_t t;
    void *result;
    pthread_create(&t, NULL, worker, (void *)100);
    pthread_join(t, &result);
    long sum = (long)result; /* JOINED LINE */
    printf("sum=%ld\n", sum);
    return sum == 5050 ? 0 : 1;
}
