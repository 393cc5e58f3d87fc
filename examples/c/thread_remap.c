/* Code replaced at the same address by another thread than the main one: the main thread
 * calls code mapped at a fixed address, a second thread unmaps it and maps other code there,
 * and the main thread calls it again. Used by tests/exec_history.rs: the main thread's
 * history before the replacement must be decoded against the code that was there then. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#define CODE ((void *)0x70000000L)

/* mov $1,%eax; ret */
static const unsigned char one[] = {0xb8, 0x01, 0x00, 0x00, 0x00, 0xc3};
/* xor %eax,%eax; add $2,%eax; ret */
static const unsigned char two[] = {0x31, 0xc0, 0x83, 0xc0, 0x02, 0xc3};

volatile long remap_total;

static void map_code(const unsigned char *code, size_t len)
{
    unsigned char *p = mmap(CODE, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    memcpy(p, code, len);
}

static void *replace(void *arg)
{
    (void)arg;
    munmap(CODE, 4096);
    map_code(two, sizeof two);
    return NULL;
}

__attribute__((noinline)) long call_code(void)
{
    return ((long (*)(void))CODE)();
}

__attribute__((noinline)) void remap_marker(long v)
{
    remap_total = v;
}

int main(void)
{
    map_code(one, sizeof one);
    long a = call_code();
    pthread_t t;
    pthread_create(&t, NULL, replace, NULL);
    pthread_join(t, NULL);
    long b = call_code();
    remap_marker(a * 10 + b);
    printf("thread_remap %ld\n", a * 10 + b);
    return 0;
}
