/* Exits with strlen(argv[1]) + argc: checks that arguments reach the program verbatim
   (no shell expansion) and that the exit status is reported. */
#include <string.h>

int main(int argc, char **argv) {
    if (argc < 2)
        return 100;
    return (int)strlen(argv[1]) + argc; /* EXIT LINE */
}
