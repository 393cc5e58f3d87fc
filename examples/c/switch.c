/* A dense switch that compilers turn into a jump table (indirect jump). */
#include <stdio.h>

static int classify(int c) {
    switch (c) {
    case 0: return 10;
    case 1: return 21;
    case 2: return 32;
    case 3: return 43;
    case 4: return 54;
    case 5: return 65;
    case 6: return 76;
    case 7: return 87;
    default: return -1;
    }
}

int main(void) {
    int sum = 0;
    for (int i = 0; i < 10; i++)
        sum += classify(i);
    printf("sum=%d\n", sum);
    return 0;
}
