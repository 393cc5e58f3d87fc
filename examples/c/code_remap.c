/* Code replaced at the same address without an exec, as a JIT freeing and reusing code or a
 * dlclose + dlopen does: two functions are each copied into a fresh executable mapping at the
 * same fixed address, called, and unmapped. Static, non-PIE, no libc. Used by
 * tests/exec_history.rs: each call's history must be decoded against the code that was there
 * at the time. */
#define SYS_mmap 9
#define SYS_munmap 11
#define SYS_exit 60
#define CODE 0x70000000L

__attribute__((noinline)) static long sys6(long n, long a, long b, long c, long d, long e,
                                           long f)
{
    long r;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    __asm__ volatile("syscall"
                     : "=a"(r)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return r;
}

/* mov $1,%eax; ret */
static const unsigned char one[] = {0xb8, 0x01, 0x00, 0x00, 0x00, 0xc3};
/* xor %eax,%eax; add $2,%eax; ret */
static const unsigned char two[] = {0x31, 0xc0, 0x83, 0xc0, 0x02, 0xc3};

volatile long remap_total;

__attribute__((noinline)) long run_at_code(const unsigned char *code, long len)
{
    /* PROT_READ|WRITE|EXEC, MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED */
    unsigned char *p = (unsigned char *)sys6(SYS_mmap, CODE, 4096, 7, 0x32, -1, 0);
    for (long i = 0; i < len; i++)
        p[i] = code[i];
    long r = ((long (*)(void))p)();
    sys6(SYS_munmap, CODE, 4096, 0, 0, 0, 0);
    return r;
}

__attribute__((noinline)) void remap_marker(long v)
{
    remap_total = v;
}

__attribute__((noinline, used)) void remap_main(void)
{
    long a = run_at_code(one, sizeof one);
    long b = run_at_code(two, sizeof two);
    remap_marker(a * 10 + b);
    sys6(SYS_exit, 0, 0, 0, 0, 0, 0);
}

__asm__(".globl _start\n"
        "_start:\n"
        "  and $-16, %rsp\n"
        "  call remap_main\n"
        "  hlt\n");
