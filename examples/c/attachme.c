/* Runs for up to a minute calling tick() every millisecond: a target for `ptrewind attach`. */
#include <unistd.h>

static volatile int counter;

static void tick(void) {
    counter++; /* TICK LINE */
}

int main(void) {
    for (int i = 0; i < 60000; i++) {
        tick();
        usleep(1000);
    }
    return 0;
}
