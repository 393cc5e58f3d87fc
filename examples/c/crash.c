/* Does some work, then dereferences a null pointer (SIGSEGV). */
#include <stdio.h>
#include <stddef.h>

struct node {
    int value;
    struct node *next;
};

static int sum_list(const struct node *n) {
    int total = 0;
    while (n != NULL) {
        total += n->value;
        n = n->next;
    }
    return total;
}

static int crash_here(int *p) {
    return *p; /* CRASH LINE */
}

int main(void) {
    struct node c = {3, NULL}, b = {2, &c}, a = {1, &b};
    int total = sum_list(&a);
    printf("total=%d\n", total);
    fflush(stdout);
    int *p = NULL;
    return crash_here(p);
}
