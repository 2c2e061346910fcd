/* Loads the library argv[1], waits until the test has replaced it on disk
 * (a byte on the FIFO argv[2]) and then calls it until the test closes
 * the FIFO: it takes a lock and calls malloc in the copy it mapped, which
 * only that copy's symbols and CFI describe. */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc < 3)
		return 2;
	void *h = dlopen(argv[1], RTLD_NOW);
	if (!h) {
		fprintf(stderr, "%s\n", dlerror());
		return 2;
	}
	void *(*entry)(size_t) = (void *(*)(size_t))dlsym(h, "x_entry");
	/* Opening blocks until the test opens the other end. */
	int fd = open(argv[2], O_RDONLY);
	char c;
	if (!entry || fd < 0 || read(fd, &c, 1) != 1)
		return 3;
	if (fcntl(fd, F_SETFL, O_NONBLOCK) < 0)
		return 3;
	do {
		free(entry(1 << 20));
		usleep(1000);
	} while (read(fd, &c, 1) != 0); /* 0: the test closed its end */
	return 0;
}
