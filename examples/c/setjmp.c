/* Non-local control flow with setjmp/longjmp. */
#include <setjmp.h>
#include <stdio.h>

static jmp_buf env;

static void deep(int level) {
    if (level == 3)
        longjmp(env, level); /* LONGJMP LINE */
    deep(level + 1);
}

int main(void) {
    int r = setjmp(env);
    if (r == 0) {
        deep(0);
        return 1; /* not reached */
    }
    printf("longjmp returned %d\n", r);
    return 0;
}
