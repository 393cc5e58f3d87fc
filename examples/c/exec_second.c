/* The second program of tests/exec_history.rs: static, non-PIE, no libc, loaded at the same
 * addresses as exec_first.c with other code there. `second_marker` lies beyond the end of
 * exec_first's code (the padding function before it), so a breakpoint on it is only reached
 * in this program. */
#define SYS_exit 60

volatile long second_total;

__attribute__((noinline)) static long sys1(long n, long a)
{
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a) : "rcx", "r11", "memory");
    return r;
}

/* Straight-line filler that pushes second_marker past the first program's code. */
__attribute__((noinline, used)) long second_padding(long x)
{
#define F4(x) x = x * 7 + 3; x ^= x >> 5; x = x * 7 + 3; x ^= x >> 5;
#define F16(x) F4(x) F4(x) F4(x) F4(x)
    F16(x) F16(x) F16(x) F16(x) F16(x) F16(x) F16(x) F16(x)
    return x;
}

__attribute__((noinline)) void second_marker(long v)
{
    second_total = v; /* SECOND MARKER */
}

__attribute__((noinline, used)) void second_main(long *sp)
{
    long t = 0;
    for (long i = 0; i < sp[0] + 5; i++)
        t += i;
    second_marker(t);
    sys1(SYS_exit, 7);
}

__asm__(".globl _start\n"
        "_start:\n"
        "  xor %ebp, %ebp\n"
        "  mov %rsp, %rdi\n"
        "  and $-16, %rsp\n"
        "  call second_main\n"
        "  hlt\n");
