/* The first of two programs at the same addresses (static, non-PIE, no libc): it does some
 * work, then execve's the second (argv[1]), which is laid out at the same addresses with
 * other code. Used by tests/exec_history.rs: the history before the exec must be decoded
 * against this program's code, not the second's. */
#define SYS_execve 59
#define SYS_exit 60

/* The one `syscall` instruction of this program. */
__attribute__((noinline)) static long sys3(long n, long a, long b, long c)
{
    long r;
    __asm__ volatile("syscall"
                     : "=a"(r)
                     : "a"(n), "D"(a), "S"(b), "d"(c)
                     : "rcx", "r11", "memory");
    return r;
}

volatile long first_total;

__attribute__((noinline)) long first_work(long n)
{
    long s = 0;
    for (long i = 0; i < n; i++)
        s += i * 3; /* FIRST LOOP */
    return s;
}

__attribute__((noinline, used)) void first_main(long *sp)
{
    long argc = sp[0];
    char **argv = (char **)(sp + 1);
    char **envp = argv + argc + 1;
    first_total = first_work(20);
    char *args[] = {argv[1], "from-first", 0};
    sys3(SYS_execve, (long)argv[1], (long)args, (long)envp);
    sys3(SYS_exit, 99, 0, 0);
}

__asm__(".globl _start\n"
        "_start:\n"
        "  mov %rsp, %rdi\n"
        "  and $-16, %rsp\n"
        "  call first_main\n"
        "  hlt\n");
