/* Replaces itself with /bin/true: ptrewind reports the exec. */
#include <unistd.h>

int main(void) {
    execl("/bin/true", "true", (char *)NULL);
    return 1;
}
