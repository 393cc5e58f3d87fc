#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
volatile long shared;
pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER, m2 = PTHREAD_MUTEX_INITIALIZER;
static int crash, deadlock;
static volatile int worker1_done;
__attribute__((noinline)) long work(long id, long n) {
  long acc = id;
  for (long i = 0; i < n; i++) acc = acc * 31 + i;
  return acc;
}
__attribute__((noinline)) void boom(void) { *(volatile int *)0 = 1; }
void *worker(void *arg) {
  long id = (long)arg;
  if (deadlock && id == 1) {
    pthread_mutex_lock(&m2);
    usleep(20000);
    pthread_mutex_lock(&m); /* WORKER BLOCKS */
  }
  long r = work(id, 300 * id);
  pthread_mutex_lock(&m);
  shared += r & 0xff; /* SHARED LINE */
  pthread_mutex_unlock(&m);
  if (id == 1) worker1_done = 1;
  /* Worker 2 crashes once worker 1 has done its work (a fixed order to reverse over). */
  while (crash && id == 2 && !worker1_done) usleep(1000);
  if (crash && id == 2) boom();
  return (void *)r;
}
void *tiny(void *arg) { return (void *)((long)arg * 2); }
/* `hits`: two threads reach one function ten times each, a short loop apart. The loop is
 * short because tests `next` over it under QEMU's stub, one single step per instruction, while
 * the other thread runs a block per step: with 2000 iterations such a `next` took 14-16 s and a
 * session of eight of them 45 s on the 2-vCPU VM, past the tests' time limit under load; with
 * 500, 3-7 s, and the other thread's hit interrupts a `next` as often (2 sessions in 6 for 500
 * and for 1000). */
__attribute__((noinline)) void hit(long id, long i) { shared += id + i; }
void *hitter(void *arg) {
  for (long i = 0; i < 10; i++) {
    hit((long)arg, i);
    for (volatile int k = 0; k < 500; k++) ;
  }
  return 0;
}
int main(int argc, char **argv) {
  crash = argc > 1 && !strcmp(argv[1], "crash");
  deadlock = argc > 1 && !strcmp(argv[1], "deadlock");
  if (argc > 2 && !strcmp(argv[1], "churn")) {
    long n = atol(argv[2]), total = 0;
    for (long i = 0; i < n; i++) {
      pthread_t t; void *r;
      pthread_create(&t, 0, tiny, (void *)i);
      pthread_join(t, &r);
      total += (long)r;
    }
    printf("total=%ld\n", total); /* CHURN DONE */
    return total == n * (n - 1) ? 0 : 1;
  }
  if (argc > 1 && !strcmp(argv[1], "hits")) {
    pthread_t h[2];
    for (long i = 0; i < 2; i++) pthread_create(&h[i], 0, hitter, (void *)(i + 1));
    for (int i = 0; i < 2; i++) pthread_join(h[i], 0);
    printf("shared=%ld\n", shared);
    return 0;
  }
  if (deadlock) {
    pthread_mutex_lock(&m);
    usleep(10000);
  }
  if (crash) work(0, 3); /* MAIN WORKS FIRST */
  pthread_t t[2];
  for (long i = 0; i < 2; i++) pthread_create(&t[i], 0, worker, (void *)(i + 1));
  if (deadlock) {
    usleep(20000);
    pthread_mutex_lock(&m2); /* MAIN BLOCKS */
  }
  for (int i = 0; i < 2; i++) pthread_join(t[i], 0);
  printf("shared=%ld\n", shared); /* JOINED */
  return 0;
}
