/* A small shared library. */
int shared_scale(int x) {
    int doubled = x * 2; /* SHARED LINE */
    return doubled + 1;
}
