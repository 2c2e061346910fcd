/* Replaces itself with another program in an environment of its own
 * choosing, the way programs that sanitize their children's environment
 * do:
 *   empty PROG ARGS...   execve with an empty environment
 *   execle PROG ARGS...  execle with an empty environment
 *   clearenv PROG ARGS...  clearenv(), then execvp
 *   spawn PROG ARGS...   posix_spawn with an empty environment; waits
 *   custom PROG ARGS...  execve of itself ("check") with ENVEXEC=kept and
 *                        LD_PRELOAD=libm.so.6 only
 *   check PROG ARGS...   says its LD_PRELOAD on stderr, fails unless its
 *                        environment is the one custom gave (and what a
 *                        recorder adds), then execv's PROG
 *   fail                 exec calls that fail, small and large
 *                        environments: the error, argv and the mappings
 *                        must be as they were */
#define _GNU_SOURCE
#include <errno.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static int mappings(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	int n = 0, c;
	while ((c = fgetc(f)) != EOF)
		n += c == '\n';
	fclose(f);
	return n;
}

static int fails(void)
{
	char *argv[] = {"missing", "one", NULL};
	char *empty[] = {NULL};
	static char *large[6001];
	static char text[6000][24];
	for (int i = 0; i < 6000; i++) {
		snprintf(text[i], sizeof text[i], "ENVEXEC_%d=x", i);
		large[i] = text[i];
	}
	int before = mappings(), bad = 0;
	for (int round = 0; round < 3; round++) {
		errno = 0;
		if (execve("/nonexistent/missing", argv, round ? large : empty) != -1 || errno != ENOENT)
			bad |= 1;
		errno = 0;
		if (execle("/nonexistent/missing", "missing", (char *)NULL, empty) != -1 || errno != ENOENT)
			bad |= 2;
		errno = 0;
		if (execvp("missing-program-of-envexec", argv) != -1 || errno != ENOENT)
			bad |= 4;
	}
	if (strcmp(argv[0], "missing") || strcmp(argv[1], "one") || argv[2] || empty[0] || large[6000])
		bad |= 8;
	if (mappings() != before)
		bad |= 16;
	if (bad)
		fprintf(stderr, "failing execs: %d\n", bad);
	return bad;
}

static int check(char **argv)
{
	const char *pre = getenv("LD_PRELOAD");
	fprintf(stderr, "preload: %s\n", pre ? pre : "(none)");
	int kept = 0;
	for (char **e = environ; *e; e++) {
		if (strcmp(*e, "ENVEXEC=kept") == 0)
			kept++;
		else if (strncmp(*e, "LD_PRELOAD=", 11) && strncmp(*e, "HOOKTRACE_", 10))
			return 3;
	}
	if (kept != 1)
		return 3;
	execv(argv[0], argv);
	return 127;
}

int main(int argc, char **argv)
{
	char *empty[] = {NULL};
	if (argc < 2)
		return 64;
	const char *mode = argv[1];
	if (strcmp(mode, "fail") == 0)
		return fails();
	if (argc < 3)
		return 64;
	char **rest = argv + 2;
	if (strcmp(mode, "empty") == 0) {
		execve(rest[0], rest, empty);
	} else if (strcmp(mode, "execle") == 0) {
		execle(rest[0], rest[0], argc > 3 ? rest[1] : (char *)NULL, (char *)NULL, empty);
	} else if (strcmp(mode, "clearenv") == 0) {
		clearenv();
		execvp(rest[0], rest);
	} else if (strcmp(mode, "spawn") == 0) {
		pid_t pid;
		if (posix_spawn(&pid, rest[0], NULL, NULL, rest, empty) != 0)
			return 126;
		int status;
		waitpid(pid, &status, 0);
		return WIFEXITED(status) ? WEXITSTATUS(status) : 125;
	} else if (strcmp(mode, "custom") == 0) {
		char *env[] = {"ENVEXEC=kept", "LD_PRELOAD=libm.so.6", NULL};
		argv[1] = "check";
		execve("/proc/self/exe", argv, env);
	} else if (strcmp(mode, "check") == 0) {
		return check(rest);
	}
	return 127;
}
