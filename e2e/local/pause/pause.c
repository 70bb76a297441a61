/*
 * The sandbox ("pause") process of the local stack's real node: it holds a
 * pod's namespaces open. As PID 1 of the pod it reaps orphaned children, and
 * it exits on SIGINT or SIGTERM. No registry is reachable, so the stack builds
 * this image itself instead of pulling one.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_stop(int sig) { (void)sig; stop = 1; }

static void on_child(int sig) {
	int saved = errno;
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
	errno = saved;
}

int main(void) {
	struct sigaction sa = {0};

	sa.sa_handler = on_stop;
	if (sigaction(SIGINT, &sa, NULL) < 0 || sigaction(SIGTERM, &sa, NULL) < 0)
		return 1;
	sa.sa_handler = on_child;
	sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
	if (sigaction(SIGCHLD, &sa, NULL) < 0)
		return 2;
	if (getpid() != 1)
		fprintf(stderr, "pause: not running as PID 1; will not reap orphans\n");
	while (!stop)
		pause();
	return 0;
}
