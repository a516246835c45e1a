/*
 * What the provider's C test programs share: the CHECK and EXPECT macros
 * (a failed check prints its file, line and, in a two-process program,
 * the rank, then exits 1), the clock, and the pipe helpers of the
 * two-process programs (`rd` and `wr`: the ends a program opens).
 * Each program counts its checks in `checks` and prints the total.
 */
#ifndef SHMFAB_TEST_CHECK_H
#define SHMFAB_TEST_CHECK_H

#include <rdma/fi_errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* Checks made so far; this process's rank (-1: a one-process program);
 * the pipe ends to the other process of a two-process program. */
static int checks, rank = -1, rd = -1, wr = -1;

#define CHECK_FAIL_AT(...)                                                     \
	do {                                                                   \
		if (rank >= 0)                                                 \
			fprintf(stderr, "%s:%d (rank %d): ", __FILE__,         \
				__LINE__, rank);                               \
		else                                                           \
			fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);        \
		fprintf(stderr, __VA_ARGS__);                                  \
		exit(1);                                                       \
	} while (0)

#define CHECK(cond)                                                            \
	do {                                                                   \
		if (!(cond))                                                   \
			CHECK_FAIL_AT("check failed: %s\n", #cond);            \
		checks++;                                                      \
	} while (0)

/* A call that must return `want` (0 or a negative fabric errno). */
#define EXPECT(call, want)                                                     \
	do {                                                                   \
		long _r = (long)(call);                                        \
		if (_r != (long)(want))                                        \
			CHECK_FAIL_AT("%s returned %ld (%s), expected %ld\n",  \
				      #call, _r, fi_strerror((int)-_r),       \
				      (long)(want));                           \
		checks++;                                                      \
	} while (0)

static inline double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* Sends `n` bytes to the other process. */
static inline void put(const void *p, size_t n)
{
	CHECK(write(wr, p, n) == (ssize_t)n);
}

/* Receives `n` bytes from the other process. */
static inline void get(void *p, size_t n)
{
	size_t at = 0;
	while (at < n) {
		ssize_t r = read(rd, (char *)p + at, n - at);
		CHECK(r > 0);
		at += (size_t)r;
	}
}

#endif
