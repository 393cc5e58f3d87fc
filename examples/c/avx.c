/* An AVX loop (compile with -mavx): sums vectors in ymm registers. */
#include <immintrin.h>
#include <stdio.h>

int main(void) {
    float data[64];
    for (int i = 0; i < 64; i++)
        data[i] = (float)i;
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < 64; i += 8)
        acc = _mm256_add_ps(acc, _mm256_loadu_ps(&data[i])); /* AVX LINE */
    float out[8];
    _mm256_storeu_ps(out, acc);
    float total = 0;
    for (int i = 0; i < 8; i++)
        total += out[i];
    printf("total=%g\n", total);
    return total == 2016.0f ? 0 : 1;
}
