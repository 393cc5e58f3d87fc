/* Indirect calls through a table of function pointers. */
#include <stdio.h>

static int op_add(int a, int b) { return a + b; }
static int op_sub(int a, int b) { return a - b; }
static int op_mul(int a, int b) { return a * b; }

typedef int (*binop)(int, int);
static binop table[] = {op_add, op_sub, op_mul};

int main(void) {
    int acc = 1;
    for (int i = 0; i < 9; i++) {
        binop f = table[i % 3];
        acc = f(acc, i + 2); /* INDIRECT CALL */
    }
    printf("acc=%d\n", acc);
    return 0;
}
