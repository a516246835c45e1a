/*
 * RMA and atomics through libfabric's C API between two processes (fork):
 * rank 1 owns the memory (ordinary malloc'd memory registered with
 * fi_mr_reg, and shared-heap memory from the provider's
 * shmfab_domain_ops_v1 alloc_shared, fi/include/shmfab_ext.h), rank 0
 * writes, reads and applies atomics to it. They talk through two pipes:
 * rank 0 sends commands (fill, verify, "did remote CQ data arrive", read
 * the counters, race with me) and rank 1 answers, making progress on its
 * endpoint between commands (the mailbox path needs it).
 *
 * Checked across the processes: fi_write/writev/writemsg/writedata,
 * fi_inject_write/inject_writedata, fi_read/readv/readmsg from 8 B to
 * 4 MiB into both kinds of memory (the remote CQ data at rank 1's CQ);
 * every valid atomic (fi_atomic, fi_fetch_atomic, fi_compare_atomic and
 * their v and msg forms) on every datatype against a reference computed
 * here, and the valid-op queries against the man page's table; key,
 * bounds and access violations (an error completion, the target
 * untouched, nothing counted); the remote-event counters bound with
 * fi_mr_bind; both ranks fetch-adding one word (final value exact, the
 * fetched values distinct) and a compare-swap lock guarding a counter;
 * RMA and atomics on the shared heap while its owner is blocked in
 * read(2), never calling libfabric (the heap needs no work from it).
 *
 * Usage: fi_rma2 [auto]  (auto: FI_PROGRESS_AUTO domains). Run by
 * fi/tests/rma2.rs with FI_PROVIDER_PATH set and SHMFAB_CMA as each run
 * wants (0 forces the mailbox path for malloc'd memory). Prints
 * "fi_rma2: N checks passed" and exits 0, or names the first failed check
 * and exits 1.
 */
#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <complex.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../include/shmfab_ext.h"
#include "check.h"

/* The memory rank 1 registers. */
enum { USER, HEAP, USER_RO, USER_WO, HEAP_RO, RACE_USER, RACE_HEAP, NREG };
static const char *reg_name[NREG] = { "user", "heap", "user-ro", "user-wo", "heap-ro", "race-user", "race-heap" };
#define BIG ((size_t)(4 << 20) + 4096)
static const size_t reg_len[NREG] = { BIG, BIG, 4096, 4096, 4096, 4096, 4096 };

static struct fi_info *fi;
static struct fid_fabric *fab;
static struct fid_domain *dom;
static struct fid_av *av;
static struct fid_cq *cq;
static struct fid_ep *ep;
static fi_addr_t peer, self;
static struct shmfab_domain_ops_v1 *xops;

/* Rank 1: its memory and registrations; the counters bound to USER and
 * HEAP. Rank 0: the keys. */
static char *mem[NREG];
static struct fid_mr *mr[NREG];
static uint64_t key[NREG];
static struct fid_cntr *cw, *cr;

/* What both ranks of the fetch-add race fetched (a MAP_SHARED mapping
 * made before the fork, outside shmfab). */
#define RACE_N 20000
static uint64_t *race_vals;

/* Remote CQ data entries rank 1 has seen and not yet checked. */
static struct fi_cq_data_entry remote[64];
static int nremote;

/* One CQ entry if any comes within `ms` (an error entry: returned as
 * -FI_EAVAIL, read by the caller); remote CQ data entries are kept in
 * `remote` and not returned. */
static ssize_t next_entry(struct fi_cq_data_entry *e, int ms)
{
	ssize_t r = fi_cq_sread(cq, e, 1, NULL, ms);
	if (r == 1 && (e->flags & FI_REMOTE_CQ_DATA)) {
		CHECK(nremote < 64);
		remote[nremote++] = *e;
		return -FI_EAGAIN;
	}
	CHECK(r == 1 || r == -FI_EAGAIN || r == -FI_EAVAIL);
	return r;
}

/* Waits (10 s at most) for the completion of the operation `ctx`, with
 * `flags` among its flags. */
static void wait_ok(void *ctx, uint64_t flags)
{
	struct fi_cq_data_entry e;
	double t0 = now();
	for (;;) {
		ssize_t r = next_entry(&e, 10);
		if (r == -FI_EAVAIL) {
			struct fi_cq_err_entry ee = { 0 };
			CHECK(fi_cq_readerr(cq, &ee, 0) == 1);
			fprintf(stderr, "fi_rma2 (rank %d): error completion %d (%s) for %p\n", rank, ee.err,
				fi_strerror(ee.err), ee.op_context);
			CHECK(!"an error completion");
		}
		if (r == 1) {
			CHECK(e.op_context == ctx);
			CHECK((e.flags & flags) == flags);
			return;
		}
		CHECK(now() - t0 < 10);
	}
}

/* Waits for the error completion of `ctx`: its error code. */
static int wait_err(void *ctx)
{
	struct fi_cq_data_entry e;
	double t0 = now();
	for (;;) {
		ssize_t r = next_entry(&e, 10);
		CHECK(r != 1); /* no success */
		if (r == -FI_EAVAIL) {
			struct fi_cq_err_entry ee = { 0 };
			EXPECT(fi_cq_readerr(cq, &ee, 0), 1);
			CHECK(ee.op_context == ctx && ee.err > 0);
			return ee.err;
		}
		CHECK(now() - t0 < 10);
	}
}

/* ---- commands (rank 0 to rank 1) ---- */

enum {
	C_DONE,
	C_FILL,    /* bytes [off, off+len) of reg := seed */
	C_PATTERN, /* bytes [off, off+len) of reg := pattern(seed) */
	C_VERIFY,  /* pattern(seed) in [off, off+len), byte `data` in the 8 bytes either side: first bad index or -1 */
	C_SAME,    /* byte seed in [off, off+len): first bad index or -1 */
	C_CQDATA,  /* a remote CQ data entry of `data` and `len` bytes comes within 10 s: 1, else 0 */
	C_NODATA,  /* remote CQ data entries seen and not checked */
	C_COUNT,   /* the remote-write and remote-read counters */
	C_STALE,   /* registers, closes: the stale key */
	C_RACE,    /* fetch-add race on the u64 at off of reg: "go", then "finished" */
	C_LOCK,    /* compare-swap lock race on reg: "go", then "finished" */
	C_ENTRIES, /* CQ entries (other than remote CQ data) seen unasked: 0 */
	C_QUIET,   /* "go", then no progress at all until the next byte */
};

struct cmd {
	uint32_t op, reg;
	uint64_t off, len, seed, data;
};

static uint8_t pattern(size_t i, uint64_t seed)
{
	return (uint8_t)(((i ^ (i >> 9) ^ (i >> 17)) * 31 + seed * 7 + 1) & 0xff);
}

static void fill_pattern(char *p, size_t n, uint64_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (char)pattern(i, seed);
}

static int64_t ask(uint32_t op, uint32_t reg, uint64_t off, uint64_t len, uint64_t seed, uint64_t data)
{
	struct cmd c = { op, reg, off, len, seed, data };
	int64_t v;
	put(&c, sizeof(c));
	get(&v, sizeof(v));
	return v;
}

static void race_fetch_adds(fi_addr_t to, uint64_t k, uint64_t off, uint64_t *vals);
static void lock_race(fi_addr_t to, uint64_t k, int n);

/* Rank 1: answers commands, making progress in between. */
static void serve(void)
{
	int stray = 0;
	for (;;) {
		struct pollfd p = { rd, POLLIN, 0 };
		if (poll(&p, 1, 0) != 1) {
			struct fi_cq_data_entry e;
			ssize_t r = next_entry(&e, 1);
			CHECK(r != -FI_EAVAIL);
			stray += r == 1;
			continue;
		}
		struct cmd c;
		get(&c, sizeof(c));
		int64_t v = 0;
		char *m = c.reg < NREG ? mem[c.reg] : NULL;
		if (c.op != C_DONE && c.op != C_CQDATA && c.op != C_NODATA && c.op != C_COUNT && c.op != C_STALE &&
		    c.op != C_ENTRIES)
			CHECK(m && c.off <= reg_len[c.reg] && c.len <= reg_len[c.reg] - c.off);
		switch (c.op) {
		case C_DONE:
			return;
		case C_FILL:
			memset(m + c.off, (int)c.seed, c.len);
			break;
		case C_PATTERN:
			fill_pattern(m + c.off, c.len, c.seed);
			break;
		case C_VERIFY:
			v = -1;
			for (size_t i = 0; i < c.len && v < 0; i++)
				if ((uint8_t)m[c.off + i] != pattern(i, c.seed))
					v = (int64_t)i;
			for (size_t i = 1; i <= 8 && v < 0; i++) {
				if (c.off >= i && (uint8_t)m[c.off - i] != (uint8_t)c.data)
					v = -2;
				if (c.off + c.len + i <= reg_len[c.reg] && (uint8_t)m[c.off + c.len + i - 1] != (uint8_t)c.data)
					v = -3;
			}
			break;
		case C_SAME:
			v = -1;
			for (size_t i = 0; i < c.len && v < 0; i++)
				if ((uint8_t)m[c.off + i] != (uint8_t)c.seed)
					v = (int64_t)i;
			break;
		case C_CQDATA: {
			double t0 = now();
			struct fi_cq_data_entry e;
			while (nremote == 0 && now() - t0 < 10) {
				ssize_t r = next_entry(&e, 10);
				CHECK(r != -FI_EAVAIL);
				stray += r == 1;
			}
			if (nremote > 0) {
				struct fi_cq_data_entry *g = &remote[0];
				v = g->data == c.data && g->len == c.len &&
				    (g->flags & (FI_REMOTE_WRITE | FI_RMA | FI_REMOTE_CQ_DATA)) ==
					    (FI_REMOTE_WRITE | FI_RMA | FI_REMOTE_CQ_DATA) &&
				    g->op_context == NULL;
				if (!v)
					fprintf(stderr, "rank 1: remote CQ data %#lx len %zu flags %#lx, expected %#lx len %lu\n",
						(unsigned long)g->data, g->len, (unsigned long)g->flags,
						(unsigned long)c.data, (unsigned long)c.len);
				memmove(remote, remote + 1, (size_t)(--nremote) * sizeof(remote[0]));
			}
			break;
		}
		case C_NODATA:
			v = nremote;
			break;
		case C_ENTRIES:
			v = stray;
			break;
		case C_COUNT: {
			int64_t w[2] = { (int64_t)fi_cntr_read(cw), (int64_t)fi_cntr_read(cr) };
			put(w, sizeof(w));
			continue;
		}
		case C_STALE: {
			struct fid_mr *t;
			static char tmp[64];
			EXPECT(fi_mr_reg(dom, tmp, sizeof(tmp), FI_REMOTE_WRITE | FI_REMOTE_READ, 0, 0, 0, &t, NULL), 0);
			v = (int64_t)fi_mr_key(t);
			EXPECT(fi_close(&t->fid), 0);
			break;
		}
		case C_RACE:
			put(&v, sizeof(v)); /* go */
			race_fetch_adds(self, key[c.reg], c.off, race_vals + RACE_N);
			break; /* finished */
		case C_QUIET: {
			char byte;
			put(&v, sizeof(v));
			get(&byte, 1); /* blocked: no call into libfabric */
			break;
		}
		case C_LOCK:
			put(&v, sizeof(v));
			lock_race(self, key[c.reg], (int)c.len);
			break;
		default:
			CHECK(!"a known command");
		}
		put(&v, sizeof(v));
	}
}

/* ---- RMA ---- */

static const size_t sizes[] = { 8, 100, 4096, 16385, 65536, (1 << 20) + 3, 4 << 20 };
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))
static char *src, *dst;
/* What rank 0 expects rank 1's counters to show. */
static int64_t want_w, want_r;
static size_t inject_size;

/* rank 0: one write of `n` bytes at `off` of `reg` by form `form`;
 * returns the remote CQ data it carries (0: none). */
static uint64_t write_form(int form, int reg, uint64_t off, size_t n, uint64_t seed)
{
	void *ctx = (void *)(uintptr_t)(0x1000 + form);
	uint64_t data = 0;
	size_t a = n / 3, b = n / 4;
	struct iovec v[3] = { { src, a }, { src + a, a }, { src + 2 * a, n - 2 * a } };
	struct fi_rma_iov ri[2] = { { off, b, key[reg] }, { off + b, n - b, key[reg] } };
	struct fi_msg_rma m = { .msg_iov = v, .iov_count = 3, .addr = peer, .rma_iov = ri, .rma_iov_count = 2,
				.context = ctx };

	fill_pattern(src, n, seed);
	switch (form) {
	case 0:
		EXPECT(fi_write(ep, src, n, NULL, peer, off, key[reg], ctx), 0);
		break;
	case 1:
		EXPECT(fi_writev(ep, v, NULL, 3, peer, off, key[reg], ctx), 0);
		break;
	case 2:
		EXPECT(fi_writemsg(ep, &m, FI_COMPLETION | FI_DELIVERY_COMPLETE), 0);
		break;
	case 3:
		data = 0xda7a0000 + seed;
		EXPECT(fi_writedata(ep, src, n, NULL, data, peer, off, key[reg], ctx), 0);
		break;
	case 4:
		data = 0xda7b0000 + seed;
		m.data = data;
		EXPECT(fi_writemsg(ep, &m, FI_COMPLETION | FI_REMOTE_CQ_DATA), 0);
		break;
	case 5:
		EXPECT(fi_inject_write(ep, src, n, peer, off, key[reg]), 0);
		break;
	case 6:
		data = 0xda7c0000 + seed;
		EXPECT(fi_inject_writedata(ep, src, n, data, peer, off, key[reg]), 0);
		break;
	}
	if (form < 5)
		wait_ok(ctx, FI_RMA | FI_WRITE);
	want_w++;
	return data;
}

static void read_form(int form, int reg, uint64_t off, size_t n)
{
	void *ctx = (void *)(uintptr_t)(0x2000 + form);
	size_t a = n / 3, b = n / 4;
	struct iovec v[3] = { { dst, a }, { dst + a, a }, { dst + 2 * a, n - 2 * a } };
	struct fi_rma_iov ri[2] = { { off, b, key[reg] }, { off + b, n - b, key[reg] } };
	struct fi_msg_rma m = { .msg_iov = v, .iov_count = 3, .addr = peer, .rma_iov = ri, .rma_iov_count = 2,
				.context = ctx };
	switch (form) {
	case 0:
		EXPECT(fi_read(ep, dst, n, NULL, peer, off, key[reg], ctx), 0);
		break;
	case 1:
		EXPECT(fi_readv(ep, v, NULL, 3, peer, off, key[reg], ctx), 0);
		break;
	case 2:
		EXPECT(fi_readmsg(ep, &m, FI_COMPLETION), 0);
		break;
	}
	wait_ok(ctx, FI_RMA | FI_READ);
	want_r++;
}

static void check_counters(const char *where)
{
	struct cmd c = { C_COUNT, 0, 0, 0, 0, 0 };
	int64_t w[2];
	put(&c, sizeof(c));
	get(w, sizeof(w));
	if (w[0] != want_w || w[1] != want_r)
		fprintf(stderr, "fi_rma2: %s: counters write %ld read %ld, expected %ld %ld\n", where, (long)w[0],
			(long)w[1], (long)want_w, (long)want_r);
	CHECK(w[0] == want_w && w[1] == want_r);
}

static void test_rma(void)
{
	uint64_t seed = 1;
	for (int reg = USER; reg <= HEAP; reg++) {
		for (size_t k = 0; k < NSIZES; k++) {
			size_t n = sizes[k];
			uint64_t off = 8 + 8 * k + (k & 1); /* odd offsets too */
			for (int form = 0; form < 7; form++) {
				if (form >= 5 && n > inject_size)
					continue;
				seed++;
				EXPECT(ask(C_FILL, reg, off - 8, n + 16, 0xee, 0), 0);
				uint64_t data = write_form(form, reg, off, n, seed);
				int64_t bad = ask(C_VERIFY, reg, off, n, seed, 0xee);
				if (bad != -1)
					fprintf(stderr, "fi_rma2: %s write form %d of %zu B at %lu: bad at %ld\n",
						reg_name[reg], form, n, (unsigned long)off, (long)bad);
				CHECK(bad == -1);
				if (data)
					CHECK(ask(C_CQDATA, 0, 0, n, 0, data) == 1);
			}
			for (int form = 0; form < 3; form++) {
				seed++;
				EXPECT(ask(C_PATTERN, reg, off, n, seed, 0), 0);
				memset(dst, 0, n + 8);
				read_form(form, reg, off, n);
				size_t bad = n;
				for (size_t i = 0; i < n && bad == n; i++)
					if ((uint8_t)dst[i] != pattern(i, seed))
						bad = i;
				if (bad != n)
					fprintf(stderr, "fi_rma2: %s read form %d of %zu B: bad at %zu\n", reg_name[reg],
						form, n, bad);
				CHECK(bad == n);
				for (int i = 0; i < 8; i++)
					CHECK(dst[n + i] == 0);
			}
		}
		check_counters(reg_name[reg]);
	}
	EXPECT(ask(C_NODATA, 0, 0, 0, 0, 0), 0);
}

/* Violations: each an error completion, the target untouched, nothing
 * counted. */
static void test_violations(void)
{
	void *ctx = (void *)0xbad;
	uint64_t stale = (uint64_t)ask(C_STALE, 0, 0, 0, 0, 0);
	uint64_t one = 1, res = 0;
	memset(src, 'x', 4096);
	for (int reg = USER; reg <= HEAP; reg++) {
		size_t len = reg_len[reg];
		EXPECT(ask(C_FILL, reg, 0, 4096, 'T', 0), 0);
		EXPECT(ask(C_FILL, reg, len - 4096, 4096, 'T', 0), 0);
		/* A wrong key, a stale key. */
		EXPECT(fi_write(ep, src, 64, NULL, peer, 0, key[reg] ^ 0x5a5a0000, ctx), 0);
		EXPECT(wait_err(ctx), FI_ENOKEY);
		EXPECT(fi_write(ep, src, 64, NULL, peer, 0, stale, ctx), 0);
		EXPECT(wait_err(ctx), FI_ENOKEY);
		EXPECT(fi_read(ep, dst, 64, NULL, peer, 0, stale, ctx), 0);
		EXPECT(wait_err(ctx), FI_ENOKEY);
		/* Out of range: past the end, across it, an offset that wraps. */
		EXPECT(fi_write(ep, src, 8, NULL, peer, len, key[reg], ctx), 0);
		EXPECT(wait_err(ctx), FI_EINVAL);
		EXPECT(fi_write(ep, src, 64, NULL, peer, len - 8, key[reg], ctx), 0);
		EXPECT(wait_err(ctx), FI_EINVAL);
		EXPECT(fi_write(ep, src, 64, NULL, peer, UINT64_MAX - 8, key[reg], ctx), 0);
		EXPECT(wait_err(ctx), FI_EINVAL);
		EXPECT(fi_read(ep, dst, 64, NULL, peer, len - 8, key[reg], ctx), 0);
		EXPECT(wait_err(ctx), FI_EINVAL);
		/* An inject's error is reported too, with no context
		 * (fi_endpoint(3)). */
		EXPECT(fi_inject_write(ep, src, 8, peer, len - 4, key[reg]), 0);
		EXPECT(wait_err(NULL), FI_EINVAL);
		EXPECT(fi_fetch_atomic(ep, &one, 1, NULL, &res, NULL, peer, len - 4, key[reg], FI_UINT64, FI_SUM, ctx),
		       0);
		EXPECT(wait_err(ctx), FI_EINVAL);
		EXPECT(fi_atomic(ep, &one, 1, NULL, peer, 0, key[reg] ^ 0x5a5a0000, FI_UINT64, FI_SUM, ctx), 0);
		EXPECT(wait_err(ctx), FI_ENOKEY);
		/* A msg whose second segment is out of range: refused whole. */
		struct iovec v = { src, 64 };
		struct fi_rma_iov ri[2] = { { 0, 32, key[reg] }, { len - 8, 32, key[reg] } };
		struct fi_msg_rma m = {
			.msg_iov = &v, .iov_count = 1, .addr = peer, .rma_iov = ri, .rma_iov_count = 2, .context = ctx
		};
		EXPECT(fi_writemsg(ep, &m, FI_COMPLETION), 0);
		EXPECT(wait_err(ctx), FI_EINVAL);
		/* Two segments, the second with a wrong key. */
		ri[1].addr = 64;
		ri[1].key = key[reg] ^ 0x5a5a0000;
		EXPECT(fi_writemsg(ep, &m, FI_COMPLETION), 0);
		EXPECT(wait_err(ctx), FI_ENOKEY);
		uint64_t ops[2] = { 1, 1 };
		struct fi_ioc io = { ops, 2 };
		struct fi_rma_ioc rio[2] = { { 0, 1, key[reg] }, { len - 4, 1, key[reg] } };
		struct fi_msg_atomic am = { .msg_iov = &io, .iov_count = 1, .addr = peer, .rma_iov = rio,
					    .rma_iov_count = 2, .datatype = FI_UINT64, .op = FI_SUM, .context = ctx };
		EXPECT(fi_atomicmsg(ep, &am, FI_COMPLETION), 0);
		EXPECT(wait_err(ctx), FI_EINVAL);
		EXPECT(ask(C_SAME, reg, 0, 4096, 'T', 0), -1);
		EXPECT(ask(C_SAME, reg, len - 4096, 4096, 'T', 0), -1);
	}
	/* Rights: writes and atomics to read-only memory, reads from
	 * write-only memory. */
	for (int reg = USER_RO; reg <= HEAP_RO; reg++) {
		EXPECT(ask(C_FILL, reg, 0, 4096, 'R', 0), 0);
		if (reg == USER_WO) {
			EXPECT(fi_read(ep, dst, 64, NULL, peer, 0, key[reg], ctx), 0);
			EXPECT(wait_err(ctx), FI_EPERM);
			EXPECT(fi_fetch_atomic(ep, NULL, 1, NULL, &res, NULL, peer, 0, key[reg], FI_UINT64,
					       FI_ATOMIC_READ, ctx), 0);
			EXPECT(wait_err(ctx), FI_EPERM);
			/* Fetching needs read rights too. */
			EXPECT(fi_fetch_atomic(ep, &one, 1, NULL, &res, NULL, peer, 0, key[reg], FI_UINT64, FI_SUM,
					       ctx), 0);
			EXPECT(wait_err(ctx), FI_EPERM);
			EXPECT(ask(C_SAME, reg, 0, 4096, 'R', 0), -1);
			continue;
		}
		EXPECT(fi_write(ep, src, 64, NULL, peer, 0, key[reg], ctx), 0);
		EXPECT(wait_err(ctx), FI_EPERM);
		EXPECT(fi_writedata(ep, src, 64, NULL, 77, peer, 0, key[reg], ctx), 0);
		EXPECT(wait_err(ctx), FI_EPERM);
		EXPECT(fi_atomic(ep, &one, 1, NULL, peer, 0, key[reg], FI_UINT64, FI_SUM, ctx), 0);
		EXPECT(wait_err(ctx), FI_EPERM);
		uint64_t cmpv = 0x5252525252525252ull;
		EXPECT(fi_compare_atomic(ep, &one, 1, NULL, &cmpv, NULL, &res, NULL, peer, 0, key[reg], FI_UINT64,
					 FI_CSWAP, ctx), 0);
		EXPECT(wait_err(ctx), FI_EPERM);
		/* Reading is allowed. */
		EXPECT(fi_read(ep, dst, 64, NULL, peer, 0, key[reg], ctx), 0);
		wait_ok(ctx, FI_READ);
		CHECK(dst[0] == 'R' && dst[63] == 'R');
		EXPECT(ask(C_SAME, reg, 0, 4096, 'R', 0), -1);
	}
	/* Refused at the call: injects over inject_size, atomics of no
	 * element or of more than the query's count. */
	EXPECT(fi_inject_write(ep, src, inject_size + 1, peer, 0, key[USER]), -FI_EMSGSIZE);
	EXPECT(fi_inject_writedata(ep, src, inject_size + 1, 5, peer, 0, key[USER]), -FI_EMSGSIZE);
	size_t most = 0;
	EXPECT(fi_atomicvalid(ep, FI_UINT8, FI_SUM, &most), 0);
	CHECK(most > 0 && most + 1 <= BIG);
	EXPECT(fi_atomic(ep, src, most + 1, NULL, peer, 0, key[USER], FI_UINT8, FI_SUM, ctx), -FI_EMSGSIZE);
	EXPECT(fi_atomic(ep, src, 0, NULL, peer, 0, key[USER], FI_UINT8, FI_SUM, ctx), -FI_EINVAL);
	/* No remote CQ data from the refused writedata; nothing counted. */
	EXPECT(ask(C_NODATA, 0, 0, 0, 0, 0), 0);
	check_counters("after the violations");
}

/* The shared heap needs no work from its owner: RMA and atomics on it
 * complete while rank 1 is blocked in read(2). */
static void test_heap_needs_no_target(void)
{
	size_t n = 1 << 20;
	uint64_t one = 1, old = 0, cmpv = 6, nv = 9;
	int64_t go;
	struct cmd c = { C_QUIET, 0, 0, 0, 0, 0 };
	EXPECT(ask(C_FILL, HEAP, 0, 4096 + n + 8, 0, 0), 0);
	put(&c, sizeof(c));
	get(&go, sizeof(go));
	fill_pattern(src, n, 99);
	EXPECT(fi_write(ep, src, n, NULL, peer, 4096, key[HEAP], src), 0);
	wait_ok(src, FI_WRITE);
	memset(dst, 0, n);
	EXPECT(fi_read(ep, dst, n, NULL, peer, 4096, key[HEAP], dst), 0);
	wait_ok(dst, FI_READ);
	CHECK(!memcmp(src, dst, n));
	for (int i = 0; i < 5; i++) {
		EXPECT(fi_fetch_atomic(ep, &one, 1, NULL, &old, NULL, peer, 64, key[HEAP], FI_UINT64, FI_SUM, &old), 0);
		wait_ok(&old, FI_ATOMIC);
		CHECK(old == (uint64_t)i);
	}
	EXPECT(fi_atomic(ep, &one, 1, NULL, peer, 64, key[HEAP], FI_UINT64, FI_SUM, &one), 0);
	wait_ok(&one, FI_ATOMIC);
	EXPECT(fi_compare_atomic(ep, &nv, 1, NULL, &cmpv, NULL, &old, NULL, peer, 64, key[HEAP], FI_UINT64, FI_CSWAP,
				 &old), 0);
	wait_ok(&old, FI_ATOMIC);
	CHECK(old == 6);
	char byte = 'g';
	put(&byte, 1);
	get(&go, sizeof(go));
	EXPECT(ask(C_VERIFY, HEAP, 4096, n, 99, 0), -1);
	want_w += 1 + 5 + 1 + 1;
	want_r += 1 + 5 + 1;
	check_counters("with the target blocked");
}

/* ---- atomics ---- */

/* One element of any datatype. */
union elem {
	int8_t i8;
	uint8_t u8;
	int16_t i16;
	uint16_t u16;
	int32_t i32;
	uint32_t u32;
	int64_t i64;
	uint64_t u64;
	float f;
	double d;
	float complex fc;
	double complex dc;
	unsigned char b[16];
};

static size_t dt_size(enum fi_datatype dt)
{
	switch (dt) {
	case FI_INT8:
	case FI_UINT8:
		return 1;
	case FI_INT16:
	case FI_UINT16:
		return 2;
	case FI_INT32:
	case FI_UINT32:
	case FI_FLOAT:
		return 4;
	case FI_INT64:
	case FI_UINT64:
	case FI_DOUBLE:
	case FI_FLOAT_COMPLEX:
		return 8;
	case FI_DOUBLE_COMPLEX:
		return 16;
	default:
		return 0;
	}
}

static int is_int(enum fi_datatype dt)
{
	return dt <= FI_UINT64;
}

static int is_complex(enum fi_datatype dt)
{
	return dt == FI_FLOAT_COMPLEX || dt == FI_DOUBLE_COMPLEX;
}

static int is_compare(enum fi_op op)
{
	return op >= FI_CSWAP && op <= FI_MSWAP;
}

enum call { ATOMIC, FETCH, COMPARE };

/* fi_atomic(3)'s table, as shmfab offers it: arithmetic on every type,
 * ordering and logic on integers and reals, bit operations and MSWAP on
 * integers, equality compares on every type, ordered compares on
 * integers and reals; ATOMIC_READ in fetch calls only; long double
 * types not at all. */
static int expect_valid(enum call call, enum fi_datatype dt, enum fi_op op)
{
	if (!dt_size(dt))
		return 0;
	int by_type;
	switch (op) {
	case FI_SUM:
	case FI_PROD:
	case FI_ATOMIC_WRITE:
	case FI_ATOMIC_READ:
	case FI_CSWAP:
	case FI_CSWAP_NE:
		by_type = 1;
		break;
	case FI_BOR:
	case FI_BAND:
	case FI_BXOR:
	case FI_MSWAP:
		by_type = is_int(dt);
		break;
	default:
		by_type = !is_complex(dt);
	}
	if (call == COMPARE)
		return by_type && is_compare(op);
	if (call == FETCH)
		return by_type && !is_compare(op);
	return by_type && !is_compare(op) && op != FI_ATOMIC_READ;
}

#define INT_REF(T, F)                                                          \
	do {                                                                   \
		T o = old->F, x = a->F, c = k->F, n = o;                      \
		switch (op) {                                                  \
		case FI_MIN: n = x < o ? x : o; break;                         \
		case FI_MAX: n = x > o ? x : o; break;                         \
		case FI_SUM: n = (T)(o + x); break;                            \
		case FI_PROD: n = (T)(o * x); break;                           \
		case FI_LOR: n = o || x; break;                                \
		case FI_LAND: n = o && x; break;                               \
		case FI_BOR: n = o | x; break;                                 \
		case FI_BAND: n = o & x; break;                                \
		case FI_LXOR: n = (o && !x) || (!o && x); break;               \
		case FI_BXOR: n = o ^ x; break;                                \
		case FI_ATOMIC_READ: break;                                    \
		case FI_ATOMIC_WRITE: n = x; break;                            \
		case FI_CSWAP: if (c == o) n = x; break;                       \
		case FI_CSWAP_NE: if (c != o) n = x; break;                    \
		case FI_CSWAP_LE: if (c <= o) n = x; break;                    \
		case FI_CSWAP_LT: if (c < o) n = x; break;                     \
		case FI_CSWAP_GE: if (c >= o) n = x; break;                    \
		case FI_CSWAP_GT: if (c > o) n = x; break;                     \
		case FI_MSWAP: n = (T)((x & c) | (o & ~c)); break;             \
		default: CHECK(!"an integer op");                              \
		}                                                              \
		out->F = n;                                                    \
	} while (0)

#define REAL_REF(T, F)                                                         \
	do {                                                                   \
		T o = old->F, x = a->F, c = k->F, n = o;                      \
		switch (op) {                                                  \
		case FI_MIN: n = x < o ? x : o; break;                         \
		case FI_MAX: n = x > o ? x : o; break;                         \
		case FI_SUM: n = o + x; break;                                 \
		case FI_PROD: n = o * x; break;                                \
		case FI_LOR: n = o || x; break;                                \
		case FI_LAND: n = o && x; break;                               \
		case FI_LXOR: n = (o && !x) || (!o && x); break;               \
		case FI_ATOMIC_READ: break;                                    \
		case FI_ATOMIC_WRITE: n = x; break;                            \
		case FI_CSWAP: if (c == o) n = x; break;                       \
		case FI_CSWAP_NE: if (c != o) n = x; break;                    \
		case FI_CSWAP_LE: if (c <= o) n = x; break;                    \
		case FI_CSWAP_LT: if (c < o) n = x; break;                     \
		case FI_CSWAP_GE: if (c >= o) n = x; break;                    \
		case FI_CSWAP_GT: if (c > o) n = x; break;                     \
		default: CHECK(!"a real op");                                  \
		}                                                              \
		out->F = n;                                                    \
	} while (0)

#define COMPLEX_REF(T, F)                                                      \
	do {                                                                   \
		T o = old->F, x = a->F, c = k->F, n = o;                      \
		switch (op) {                                                  \
		case FI_SUM: n = o + x; break;                                 \
		case FI_PROD: n = o * x; break;                                \
		case FI_ATOMIC_READ: break;                                    \
		case FI_ATOMIC_WRITE: n = x; break;                            \
		case FI_CSWAP: if (c == o) n = x; break;                       \
		case FI_CSWAP_NE: if (c != o) n = x; break;                    \
		default: CHECK(!"a complex op");                               \
		}                                                              \
		out->F = n;                                                    \
	} while (0)

/* The new value of `old` after `op` with operand `a` and compare `k`. */
static void reference(enum fi_datatype dt, enum fi_op op, const union elem *old, const union elem *a,
		      const union elem *k, union elem *out)
{
	memset(out, 0, sizeof(*out));
	switch (dt) {
	case FI_INT8: INT_REF(int8_t, i8); break;
	case FI_UINT8: INT_REF(uint8_t, u8); break;
	case FI_INT16: INT_REF(int16_t, i16); break;
	case FI_UINT16: INT_REF(uint16_t, u16); break;
	case FI_INT32: INT_REF(int32_t, i32); break;
	case FI_UINT32: INT_REF(uint32_t, u32); break;
	case FI_INT64: INT_REF(int64_t, i64); break;
	case FI_UINT64: INT_REF(uint64_t, u64); break;
	case FI_FLOAT: REAL_REF(float, f); break;
	case FI_DOUBLE: REAL_REF(double, d); break;
	case FI_FLOAT_COMPLEX: COMPLEX_REF(float complex, fc); break;
	case FI_DOUBLE_COMPLEX: COMPLEX_REF(double complex, dc); break;
	default: CHECK(!"a datatype");
	}
}

/* Element `v` (+ `im` i for complex types) of `dt`. */
static void set(enum fi_datatype dt, union elem *e, long v, long im)
{
	memset(e, 0, sizeof(*e));
	switch (dt) {
	case FI_INT8: e->i8 = (int8_t)v; break;
	case FI_UINT8: e->u8 = (uint8_t)v; break;
	case FI_INT16: e->i16 = (int16_t)v; break;
	case FI_UINT16: e->u16 = (uint16_t)v; break;
	case FI_INT32: e->i32 = (int32_t)v; break;
	case FI_UINT32: e->u32 = (uint32_t)v; break;
	case FI_INT64: e->i64 = v; break;
	case FI_UINT64: e->u64 = (uint64_t)v; break;
	case FI_FLOAT: e->f = (float)v; break;
	case FI_DOUBLE: e->d = (double)v; break;
	case FI_FLOAT_COMPLEX: e->fc = (float)v + (float)im * I; break;
	case FI_DOUBLE_COMPLEX: e->dc = (double)v + (double)im * I; break;
	default: CHECK(!"a datatype");
	}
}

#define NEL 4

/* Rank 0: one atomic call (`form` 0 plain, 1 v, 2 msg) of `op` on `dt`,
 * NEL elements at `off` of `reg`, checked against the reference. */
static void atomic_case(int reg, uint64_t off, enum call call, enum fi_datatype dt, enum fi_op op, int form)
{
	size_t sz = dt_size(dt), n = NEL * sz;
	union elem old[NEL], a[NEL], k[NEL], want[NEL];
	unsigned char init[NEL * 16], buf[NEL * 16], cmp[NEL * 16], res[NEL * 16], back[NEL * 16];
	/* Zeros and signs for the logic ops; for the compares, the old value
	 * against one smaller, equal and larger compare (each condition both
	 * holds and fails); MSWAP's compare is a mask. */
	static const long ov[NEL] = { 5, 0, -7, 12 }, av[NEL] = { 3, 6, 0, -2 };
	static const long cov[NEL] = { 5, 5, 5, 5 }, cav[NEL] = { 100, 101, 102, 103 }, ckv[NEL] = { 4, 5, 6, -1 };
	static const long mkv[NEL] = { 0x0f, 0x70, 0, -1 };
	for (int i = 0; i < NEL; i++) {
		int cmpcall = call == COMPARE;
		set(dt, &old[i], cmpcall ? cov[i] : ov[i], i + 1);
		set(dt, &a[i], cmpcall ? cav[i] : av[i], 2 - i);
		set(dt, &k[i], op == FI_MSWAP ? mkv[i] : ckv[i], i == 1 ? 1 + 1 : i + 2);
		/* Complex compares: the element with compare 5 equals old in both parts. */
		if (is_complex(dt) && i == 1)
			set(dt, &k[i], ckv[i], 2);
		reference(dt, op, &old[i], &a[i], &k[i], &want[i]);
		memcpy(init + i * sz, old[i].b, sz);
		memcpy(buf + i * sz, a[i].b, sz);
		memcpy(cmp + i * sz, k[i].b, sz);
	}
	void *ctx = (void *)(uintptr_t)(0x3000 + call * 16 + form);
	/* The initial values, by RMA. */
	EXPECT(fi_write(ep, init, n, NULL, peer, off, key[reg], ctx), 0);
	wait_ok(ctx, FI_WRITE);
	want_w++;
	memset(res, 0xa5, sizeof(res));
	/* v and msg forms: local buffers in two pieces (1 + 3 elements),
	 * results in another split (3 + 1); msg: two remote segments (2 + 2). */
	struct fi_ioc bv[2] = { { buf, 1 }, { buf + sz, NEL - 1 } };
	struct fi_ioc kv[2] = { { cmp, 2 }, { cmp + 2 * sz, NEL - 2 } };
	struct fi_ioc rv[2] = { { res, NEL - 1 }, { res + (NEL - 1) * sz, 1 } };
	struct fi_rma_ioc ri[2] = { { off, 2, key[reg] }, { off + 2 * sz, NEL - 2, key[reg] } };
	struct fi_msg_atomic m = { .msg_iov = bv, .iov_count = 2, .addr = peer, .rma_iov = ri, .rma_iov_count = 2,
				   .datatype = dt, .op = op, .context = ctx };
	void *bp = buf;
	if (op == FI_ATOMIC_READ) {
		/* No operand: a null buffer (plain) or no iov (v, msg). */
		bp = NULL;
		m.iov_count = 0;
		m.msg_iov = NULL;
	}
	size_t nbv = op == FI_ATOMIC_READ ? 0 : 2;
	switch (call * 3 + form) {
	case 0:
		EXPECT(fi_atomic(ep, buf, NEL, NULL, peer, off, key[reg], dt, op, ctx), 0);
		break;
	case 1:
		EXPECT(fi_atomicv(ep, bv, NULL, 2, peer, off, key[reg], dt, op, ctx), 0);
		break;
	case 2:
		EXPECT(fi_atomicmsg(ep, &m, FI_COMPLETION), 0);
		break;
	case 3:
		EXPECT(fi_fetch_atomic(ep, bp, NEL, NULL, res, NULL, peer, off, key[reg], dt, op, ctx), 0);
		break;
	case 4:
		EXPECT(fi_fetch_atomicv(ep, nbv ? bv : NULL, NULL, nbv, rv, NULL, 2, peer, off, key[reg], dt, op, ctx),
		       0);
		break;
	case 5:
		EXPECT(fi_fetch_atomicmsg(ep, &m, rv, NULL, 2, FI_COMPLETION), 0);
		break;
	case 6:
		EXPECT(fi_compare_atomic(ep, buf, NEL, NULL, cmp, NULL, res, NULL, peer, off, key[reg], dt, op, ctx), 0);
		break;
	case 7:
		EXPECT(fi_compare_atomicv(ep, bv, NULL, 2, kv, NULL, 2, rv, NULL, 2, peer, off, key[reg], dt, op, ctx),
		       0);
		break;
	case 8:
		EXPECT(fi_compare_atomicmsg(ep, &m, kv, NULL, 2, rv, NULL, 2, FI_COMPLETION), 0);
		break;
	}
	wait_ok(ctx, FI_ATOMIC);
	if (op != FI_ATOMIC_READ)
		want_w++;
	if (call != ATOMIC)
		want_r++;
	/* The memory, read back by RMA. */
	memset(back, 0x5a, sizeof(back));
	EXPECT(fi_read(ep, back, n, NULL, peer, off, key[reg], ctx), 0);
	wait_ok(ctx, FI_READ);
	want_r++;
	for (int i = 0; i < NEL; i++) {
		int ok = !memcmp(back + i * sz, want[i].b, sz) && (call == ATOMIC || !memcmp(res + i * sz, old[i].b, sz));
		if (!ok) {
			/* fi_tostr's buffer is static: one per call to fprintf. */
			fprintf(stderr, "fi_rma2: %s: call %d form %d %s", reg_name[reg], call, form,
				fi_tostr(&dt, FI_TYPE_ATOMIC_TYPE));
			fprintf(stderr, " %s element %d:", fi_tostr(&op, FI_TYPE_ATOMIC_OP), i);
			for (size_t j = 0; j < sz; j++)
				fprintf(stderr, " %02x/%02x/%02x", back[i * sz + j], want[i].b[j], res[i * sz + j]);
			fprintf(stderr, " (got/want/fetched)\n");
		}
		CHECK(ok);
	}
}

static void test_atomics(void)
{
	int cases = 0;
	for (int reg = USER; reg <= HEAP; reg++) {
		for (int dt = 0; dt < FI_DATATYPE_LAST; dt++) {
			for (int op = 0; op < FI_ATOMIC_OP_LAST; op++) {
				for (int call = ATOMIC; call <= COMPARE; call++) {
					int want = expect_valid(call, dt, op);
					size_t cnt = 0;
					struct fi_atomic_attr at = { 0 };
					uint64_t qf = call == FETCH ? FI_FETCH_ATOMIC : call == COMPARE ? FI_COMPARE_ATOMIC : 0;
					int got = call == ATOMIC  ? fi_atomicvalid(ep, dt, op, &cnt)
						  : call == FETCH ? fi_fetch_atomicvalid(ep, dt, op, &cnt)
								  : fi_compare_atomicvalid(ep, dt, op, &cnt);
					if (got != (want ? 0 : -FI_EOPNOTSUPP))
						fprintf(stderr, "fi_rma2: valid query of call %d datatype %d op %d: %d\n",
							call, dt, op, got);
					CHECK(got == (want ? 0 : -FI_EOPNOTSUPP));
					EXPECT(fi_query_atomic(dom, dt, op, &at, qf), want ? 0 : -FI_EOPNOTSUPP);
					if (!want) {
						/* The call itself refuses it. */
						if (reg == USER && call == ATOMIC && dt_size(dt)) {
							uint64_t b[4] = { 0 };
							EXPECT(fi_atomic(ep, b, 1, NULL, peer, 0, key[reg], dt, op, NULL),
							       -FI_EOPNOTSUPP);
						}
						continue;
					}
					CHECK(cnt >= NEL && at.count == cnt && at.size == dt_size(dt));
					for (int form = 0; form < 3; form++, cases++)
						atomic_case(reg, 4096 + 64 * (uint64_t)form, call, dt, op, form);
				}
			}
		}
		check_counters("after the atomics");
	}
	/* 2 memories x (110 + 122 + 72) valid combinations x 3 forms. */
	CHECK(cases == 2 * 304 * 3);
}

/* ---- races ---- */

static void race_fetch_adds(fi_addr_t to, uint64_t k, uint64_t off, uint64_t *vals)
{
	uint64_t one = 1;
	for (int i = 0; i < RACE_N; i++) {
		EXPECT(fi_fetch_atomic(ep, &one, 1, NULL, &vals[i], NULL, to, off, k, FI_UINT64, FI_SUM, &vals[i]), 0);
		wait_ok(&vals[i], FI_ATOMIC);
	}
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* Waits for rank 1's word, making progress meanwhile (rank 1's
 * operations may wait on our mailbox). */
static int64_t await_answer(void)
{
	double t0 = now();
	for (;;) {
		struct pollfd p = { rd, POLLIN, 0 };
		if (poll(&p, 1, 1) == 1)
			break;
		struct fi_cq_data_entry e;
		CHECK(next_entry(&e, 0) == -FI_EAGAIN);
		CHECK(now() - t0 < 60);
	}
	int64_t v;
	get(&v, sizeof(v));
	return v;
}

static void test_fetch_add_race(void)
{
	for (int reg = RACE_USER; reg <= RACE_HEAP; reg++) {
		EXPECT(ask(C_FILL, reg, 0, 64, 0, 0), 0);
		struct cmd c = { C_RACE, (uint32_t)reg, 8, 0, 0, 0 };
		int64_t go;
		put(&c, sizeof(c));
		get(&go, sizeof(go));
		race_fetch_adds(peer, key[reg], 8, race_vals);
		EXPECT(await_answer(), 0);
		uint64_t fin = 0;
		EXPECT(fi_fetch_atomic(ep, NULL, 1, NULL, &fin, NULL, peer, 8, key[reg], FI_UINT64, FI_ATOMIC_READ, &fin),
		       0);
		wait_ok(&fin, FI_ATOMIC);
		CHECK(fin == 2 * RACE_N);
		qsort(race_vals, 2 * RACE_N, sizeof(uint64_t), cmp_u64);
		for (uint64_t i = 0; i < 2 * RACE_N; i++)
			if (race_vals[i] != i) {
				fprintf(stderr, "fi_rma2: %s race: fetched values not 0..%d once each (at %lu: %lu)\n",
					reg_name[reg], 2 * RACE_N - 1, (unsigned long)i, (unsigned long)race_vals[i]);
				CHECK(!"distinct fetched values");
			}
		/* The neighbours of the word are untouched. */
		EXPECT(ask(C_SAME, reg, 0, 8, 0, 0), -1);
		EXPECT(ask(C_SAME, reg, 16, 48, 0, 0), -1);
	}
}

/* A compare-swap lock at offset 0 guarding a counter at offset 8 that
 * is read and written by plain RMA: `n` increments. */
static void lock_race(fi_addr_t to, uint64_t k, int n)
{
	for (int i = 0; i < n; i++) {
		uint64_t zero = 0, mine = (uint64_t)rank + 1, old = 1, ctr = 0;
		while (old != 0) {
			EXPECT(fi_compare_atomic(ep, &mine, 1, NULL, &zero, NULL, &old, NULL, to, 0, k, FI_UINT64, FI_CSWAP,
						 &old), 0);
			wait_ok(&old, FI_ATOMIC);
			CHECK(old == 0 || old == 1 || old == 2);
			if (old != 0)
				sched_yield();
		}
		EXPECT(fi_read(ep, &ctr, 8, NULL, to, 8, k, &ctr), 0);
		wait_ok(&ctr, FI_READ);
		ctr++;
		EXPECT(fi_write(ep, &ctr, 8, NULL, to, 8, k, &ctr), 0);
		wait_ok(&ctr, FI_WRITE);
		EXPECT(fi_atomic(ep, &zero, 1, NULL, to, 0, k, FI_UINT64, FI_ATOMIC_WRITE, &zero), 0);
		wait_ok(&zero, FI_ATOMIC);
	}
}

static void test_lock(void)
{
	enum { N = 1000 };
	for (int reg = RACE_USER; reg <= RACE_HEAP; reg++) {
		EXPECT(ask(C_FILL, reg, 0, 64, 0, 0), 0);
		struct cmd c = { C_LOCK, (uint32_t)reg, 0, N, 0, 0 };
		int64_t go;
		put(&c, sizeof(c));
		get(&go, sizeof(go));
		lock_race(peer, key[reg], N);
		EXPECT(await_answer(), 0);
		uint64_t w[2] = { 1, 1 };
		EXPECT(fi_read(ep, w, 16, NULL, peer, 0, key[reg], w), 0);
		wait_ok(w, FI_READ);
		CHECK(w[0] == 0 && w[1] == 2 * N);
	}
}

/* ---- setup ---- */

static void open_all(int autop)
{
	struct fi_info *h = fi_allocinfo();
	struct fi_av_attr aa = { .type = FI_AV_TABLE };
	struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_DATA, .wait_obj = FI_WAIT_UNSPEC };
	char me[64], other[64];
	size_t len = sizeof(me);

	CHECK(h);
	h->fabric_attr->prov_name = strdup("shmfab");
	h->ep_attr->type = FI_EP_RDM;
	h->caps = FI_MSG | FI_RMA | FI_ATOMIC | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_RMA_EVENT;
	h->domain_attr->mr_mode = FI_MR_PROV_KEY;
	if (autop)
		h->domain_attr->data_progress = FI_PROGRESS_AUTO;
	EXPECT(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &fi), 0);
	fi_freeinfo(h);
	CHECK(fi->domain_attr->mr_mode == FI_MR_PROV_KEY && fi->domain_attr->cq_data_size >= 8);
	CHECK(fi->tx_attr->rma_iov_limit >= 2 && fi->tx_attr->iov_limit >= 3);
	inject_size = fi->tx_attr->inject_size;
	CHECK(inject_size >= 8);
	EXPECT(fi_fabric(fi->fabric_attr, &fab, NULL), 0);
	EXPECT(fi_domain(fab, fi, &dom, NULL), 0);
	EXPECT(fi_av_open(dom, &aa, &av, NULL), 0);
	EXPECT(fi_cq_open(dom, &ca, &cq, NULL), 0);
	EXPECT(fi_endpoint(dom, fi, &ep, NULL), 0);
	EXPECT(fi_ep_bind(ep, &av->fid, 0), 0);
	EXPECT(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV), 0);
	EXPECT(fi_enable(ep), 0);
	EXPECT(fi_getname(&ep->fid, me, &len), 0);
	put(me, len);
	get(other, len);
	EXPECT(fi_av_insert(av, other, 1, &peer, 0, NULL), 1);
	EXPECT(fi_av_insert(av, me, 1, &self, 0, NULL), 1);
	EXPECT(fi_open_ops(&dom->fid, SHMFAB_DOMAIN_OPS_V1, 0, (void **)&xops, NULL), 0);
	CHECK(xops->size >= sizeof(*xops) && xops->alloc_shared);
}

/* The extension's argument checks and its memory (rank 1). */
static void test_ext(void)
{
	void *p, *q;
	struct fid_mr *m;
	EXPECT(fi_open_ops(&dom->fid, "shmfab_domain_ops_v0", 0, &p, NULL), -FI_ENOSYS);
	EXPECT(fi_open_ops(&dom->fid, SHMFAB_DOMAIN_OPS_V1, 1, &p, NULL), -FI_EBADFLAGS);
	EXPECT(xops->alloc_shared(dom, 0, FI_REMOTE_WRITE, 0, &p, &m, NULL), -FI_EINVAL);
	EXPECT(xops->alloc_shared(dom, 64, 1ull << 60, 0, &p, &m, NULL), -FI_EINVAL);
	EXPECT(xops->alloc_shared(dom, 64, FI_REMOTE_WRITE, FI_MORE, &p, &m, NULL), -FI_EBADFLAGS);
	EXPECT(xops->alloc_shared(dom, 64, FI_REMOTE_WRITE, 0, NULL, &m, NULL), -FI_EINVAL);
	EXPECT(xops->alloc_shared(dom, (size_t)1 << 40, FI_REMOTE_WRITE, 0, &p, &m, NULL), -FI_ENOMEM);
	/* Zeroed, writable, distinct; freed by fi_close and reused. */
	EXPECT(xops->alloc_shared(dom, 100, FI_REMOTE_WRITE, 0, &p, &m, (void *)7), 0);
	CHECK(m->fid.fclass == FI_CLASS_MR && m->fid.context == (void *)7 && fi_mr_desc(m) != NULL);
	for (int i = 0; i < 100; i++)
		CHECK(((char *)p)[i] == 0);
	memset(p, 1, 100);
	struct fid_mr *m2;
	EXPECT(xops->alloc_shared(dom, 100, FI_REMOTE_WRITE, 0, &q, &m2, NULL), 0);
	CHECK(q != p && fi_mr_key(m2) != fi_mr_key(m));
	EXPECT(fi_close(&dom->fid), -FI_EBUSY);
	EXPECT(fi_close(&m->fid), 0);
	EXPECT(fi_close(&m2->fid), 0);
	/* A domain with the application's keys has no heap. */
	struct fi_info *h = fi_allocinfo(), *i2;
	struct fid_domain *d2;
	struct shmfab_domain_ops_v1 *o2;
	CHECK(h);
	h->fabric_attr->prov_name = strdup("shmfab");
	h->ep_attr->type = FI_EP_RDM;
	h->caps = FI_MSG;
	EXPECT(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &i2), 0);
	fi_freeinfo(h);
	CHECK(!(i2->domain_attr->mr_mode & FI_MR_PROV_KEY));
	EXPECT(fi_domain(fab, i2, &d2, NULL), 0);
	EXPECT(fi_open_ops(&d2->fid, SHMFAB_DOMAIN_OPS_V1, 0, (void **)&o2, NULL), 0);
	EXPECT(o2->alloc_shared(d2, 64, FI_REMOTE_WRITE, 0, &p, &m, NULL), -FI_EOPNOTSUPP);
	EXPECT(fi_close(&d2->fid), 0);
	fi_freeinfo(i2);
}

static void make_memory(void)
{
	static const uint64_t access[NREG] = {
		FI_REMOTE_READ | FI_REMOTE_WRITE, FI_REMOTE_READ | FI_REMOTE_WRITE, FI_REMOTE_READ, FI_REMOTE_WRITE,
		FI_REMOTE_READ, FI_REMOTE_READ | FI_REMOTE_WRITE, FI_REMOTE_READ | FI_REMOTE_WRITE,
	};
	struct fi_cntr_attr ca = { .events = FI_CNTR_EVENTS_COMP };
	EXPECT(fi_cntr_open(dom, &ca, &cw, NULL), 0);
	EXPECT(fi_cntr_open(dom, &ca, &cr, NULL), 0);
	for (int r = 0; r < NREG; r++) {
		void *p;
		if (r == HEAP || r == HEAP_RO || r == RACE_HEAP) {
			EXPECT(xops->alloc_shared(dom, reg_len[r], access[r], 0, &p, &mr[r], NULL), 0);
		} else {
			CHECK(posix_memalign(&p, 4096, reg_len[r]) == 0);
			memset(p, 0, reg_len[r]);
			EXPECT(fi_mr_reg(dom, p, reg_len[r], access[r], 0, 0, 0, &mr[r], NULL), 0);
		}
		mem[r] = p;
		key[r] = fi_mr_key(mr[r]);
		if (r == USER || r == HEAP) {
			EXPECT(fi_mr_bind(mr[r], &cw->fid, FI_REMOTE_WRITE), 0);
			EXPECT(fi_mr_bind(mr[r], &cr->fid, FI_REMOTE_READ), 0);
		}
	}
}

int main(int argc, char **argv)
{
	int autop = argc > 1 && !strcmp(argv[1], "auto");
	int p2c[2], c2p[2];
	race_vals = mmap(NULL, 2 * RACE_N * sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(race_vals != MAP_FAILED);
	CHECK(pipe(p2c) == 0 && pipe(c2p) == 0);
	pid_t pid = fork();
	CHECK(pid >= 0);
	rank = pid == 0;
	rd = rank ? p2c[0] : c2p[0];
	wr = rank ? c2p[1] : p2c[1];
	close(rank ? p2c[1] : c2p[1]);
	close(rank ? c2p[0] : p2c[0]);

	open_all(autop);
	if (rank == 1) {
		test_ext();
		make_memory();
		put(key, sizeof(key));
		serve();
		CHECK(nremote == 0);
	} else {
		get(key, sizeof(key));
		src = malloc(BIG + 64);
		dst = malloc(BIG + 64);
		CHECK(src && dst);
		double t0 = now();
		test_rma();
		double t1 = now();
		test_violations();
		test_heap_needs_no_target();
		test_atomics();
		double t2 = now();
		test_fetch_add_race();
		test_lock();
		double t3 = now();
		EXPECT(ask(C_ENTRIES, 0, 0, 0, 0, 0), 0);
		struct cmd c = { C_DONE, 0, 0, 0, 0, 0 };
		put(&c, sizeof(c));
		fprintf(stderr, "fi_rma2: rma %.2f s, violations and atomics %.2f s, races %.2f s\n", t1 - t0, t2 - t1,
			t3 - t2);
		free(src);
		free(dst);
	}
	/* Both wait for each other before closing (the last operations must
	 * not race the peer's close). */
	char done = 'x';
	CHECK(write(wr, &done, 1) == 1 && read(rd, &done, 1) == 1);
	if (rank == 1) {
		for (int r = 0; r < NREG; r++)
			EXPECT(fi_close(&mr[r]->fid), 0);
		EXPECT(fi_close(&cw->fid), 0);
		EXPECT(fi_close(&cr->fid), 0);
	}
	EXPECT(fi_close(&ep->fid), 0);
	EXPECT(fi_close(&cq->fid), 0);
	EXPECT(fi_close(&av->fid), 0);
	EXPECT(fi_close(&dom->fid), 0);
	EXPECT(fi_close(&fab->fid), 0);
	fi_freeinfo(fi);
	if (rank == 1)
		_exit(0);
	int status;
	CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
	printf("fi_rma2: %d checks passed\n", checks);
	return 0;
}
