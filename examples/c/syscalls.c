/* A syscall-heavy loop. */
#include <fcntl.h>
#include <unistd.h>

int main(void) {
    int fd = open("/dev/null", O_WRONLY);
    long total = 0;
    for (int i = 0; i < 200; i++) {
        total += getpid() > 0;
        total += write(fd, "x", 1);
    }
    close(fd);
    return total == 400 ? 0 : 1;
}
