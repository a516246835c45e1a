/*
 * Triggered operations and the deferred work queue (fi_trigger(3))
 * through libfabric's C API, between two processes (fork). Rank 1 owns
 * memory (registered with provider keys, an FI_RMA_EVENT counter bound
 * with fi_mr_bind for remote writes) and receives; rank 0 drives. They
 * talk through two pipes: rank 0 sends commands, rank 1 answers and makes
 * progress on its endpoint between commands, and rank 0 makes progress
 * while it waits for an answer (the mailbox path needs both: rank 1's
 * chain writes into rank 0's memory).
 * Rank 0 owns memory too, for the chain.
 *
 * Checked: fi_getinfo offers FI_TRIGGER; FI_TRIGGER with an
 * fi_triggered_context on fi_sendmsg, fi_tsendmsg, fi_writemsg,
 * fi_readmsg, fi_atomicmsg, fi_fetch_atomicmsg and fi_compare_atomicmsg:
 * nothing runs before the counter reaches the threshold, the buffers are
 * read when the operation fires (not at submission), the completion's
 * op_context is the fi_triggered_context; ordering (equal thresholds in
 * submission order, a jump over several thresholds at once, a threshold
 * already met runs at once, a partial advance runs only what is due);
 * fi_control FI_QUEUE_WORK with every op type, the completion counter counted once per
 * data operation and never by counter operations, no CQ entry without
 * FI_COMPLETION and one with it; FI_CANCEL_WORK (cancelled work never
 * runs, a second cancel -FI_ENOENT) and FI_FLUSH_WORK (all, or by
 * triggering counter, leaving the others); work on each rank fired by
 * the other's remote writes (FI_RMA_EVENT counters): a chain of CHAIN
 * writes across the two processes, queued in advance, and one whose last
 * write comes late (rank 0 serves it while it waits for the answer); with
 * FI_PROGRESS_AUTO, work on rank 1 fired by rank 0's write while rank 1
 * sleeps in read(2), calling nothing; bad arguments. Receives:
 * FI_OP_TRECV into two segments, directed, posted when its counter
 * reaches the threshold, so that rank 1's message sent before waits as
 * unexpected and is matched then, quietly (no CQ entry); FI_OP_RECV with
 * FI_COMPLETION, its completion counter counted when the message arrives,
 * not when it is posted; FI_TRIGGER on fi_trecvmsg and fi_recvmsg
 * (completion op_context the fi_triggered_context); fi_cancel of a
 * triggered receive and of a triggered send not fired (FI_ECANCELED
 * entries, never run); FI_CANCEL_WORK of a deferred receive; a receive
 * posted by a trigger whose arrival fires the send of what it received
 * back to rank 1 (a collective's step); FI_MULTI_RECV and FI_CLAIM on a
 * deferred or triggered receive -FI_ENOSYS.
 *
 * Usage: fi_trigger [auto | chains N]  (auto: FI_PROGRESS_AUTO domains;
 * chains N: only N short chains, each after a plain message to rank 1,
 * the ends of chains many times over). Run by
 * fi/tests/trigger.rs with FI_PROVIDER_PATH set. Prints "fi_trigger: N
 * checks passed" and exits 0, or names the first failed check and exits
 * 1.
 */
#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_trigger.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "check.h"

#define MEM 65536
#define CHAIN 1000

static struct fi_info *fi;
static struct fid_fabric *fab;
static struct fid_domain *dom;
static struct fid_av *av;
static struct fid_cq *cq;
static struct fid_ep *ep;
static fi_addr_t peer;

/* Each rank's registered memory, its key, the counter of remote writes
 * into it (FI_RMA_EVENT), and the peer's key. */
static uint64_t *mem;
static struct fid_mr *mr;
static struct fid_cntr *rw;
static uint64_t peer_key;

static struct fid_cntr *cntr(void)
{
	struct fi_cntr_attr ca = { .events = FI_CNTR_EVENTS_COMP, .wait_obj = FI_WAIT_UNSPEC };
	struct fid_cntr *c;
	EXPECT(fi_cntr_open(dom, &ca, &c, NULL), 0);
	return c;
}

/* Waits (20 s at most) for counter `c` to reach `v`. */
static void wait_cntr(struct fid_cntr *c, uint64_t v)
{
	double t0 = now();
	while (fi_cntr_read(c) + fi_cntr_readerr(c) < v) {
		int r = fi_cntr_wait(c, v, 10);
		CHECK(r == 0 || r == -FI_ETIMEDOUT || r == -FI_EAVAIL);
		CHECK(now() - t0 < 20);
	}
	CHECK(fi_cntr_readerr(c) == 0);
}

/* Waits (10 s at most) for the next completion: its op_context. */
static void *next_ctx(struct fi_cq_tagged_entry *out)
{
	struct fi_cq_tagged_entry e;
	double t0 = now();
	for (;;) {
		ssize_t r = fi_cq_sread(cq, &e, 1, NULL, 10);
		if (r == -FI_EAVAIL) {
			struct fi_cq_err_entry ee = { 0 };
			CHECK(fi_cq_readerr(cq, &ee, 0) == 1);
			fprintf(stderr, "fi_trigger (rank %d): error completion %d (%s) for %p\n", rank, ee.err,
				fi_strerror(ee.err), ee.op_context);
			CHECK(!"an error completion");
		}
		if (r == 1) {
			if (out)
				*out = e;
			return e.op_context;
		}
		CHECK(r == -FI_EAGAIN);
		CHECK(now() - t0 < 10);
	}
}

/* Makes progress for a while and checks that no completion came. */
static void no_completion(void)
{
	struct fi_cq_tagged_entry e;
	for (int i = 0; i < 20; i++) {
		EXPECT(fi_cq_read(cq, &e, 1), -FI_EAGAIN);
		usleep(500);
	}
}

/* ---- commands (rank 0 to rank 1) ---- */

enum {
	C_DONE,
	C_FILL,  /* words [off, off+n) := val */
	C_WORDS, /* answers the n words at off */
	C_POST,  /* posts n receives (tagged if val), 64 B each */
	C_TAKE,  /* waits for n receive completions: answers (tag, first word) of each */
	C_CHAIN, /* queues a chain of n writes (CHAIN if 0), the last one late (val us after all of
		  * rank 0's writes landed) if val; answers 0, then waits for it to finish: answers
		  * how many of rank 0's writes landed */
	C_FIRE,  /* queues a counter add on rw reaching val, answers 0; then waits for it: answers rw */
	C_SLEEP, /* (auto progress) queues a write of val to the peer's word off fired by the next
		  * remote write, answers 0, and blocks in read(2) until the next command */
	C_SEND,  /* injects n 16-byte messages { off+i, ~(off+i) } to rank 0, tagged val+i (untagged
		  * if val is 0) */
};

struct cmd {
	uint32_t op;
	uint64_t off, n, val;
};

/* Rank 0 waits for rank 1's answer (`n` bytes) making progress on its
 * own endpoint meanwhile (a counter read is a progress pass), never
 * blocked in read(2) alone: with manual progress and single copy off,
 * rank 1's RMA into rank 0's memory is served by rank 0's progress
 * engine, and rank 1 may be in such a write (its call waits for it) when
 * rank 0 starts to wait. The chain's last hop is one: rank 1's write i
 * fires only once rank 0's write i landed, which can be after rank 0's
 * own chain completed; a rank 0 that then slept in read(2) left rank 1
 * waiting in that write for ever (about 1 run in 17). */
static void answer(void *p, size_t n)
{
	struct pollfd pf = { rd, POLLIN, 0 };
	double t0 = now();
	for (;;) {
		(void)fi_cntr_read(rw);
		if (poll(&pf, 1, 1) == 1)
			break;
		CHECK(now() - t0 < 60);
	}
	get(p, n);
}

static int64_t ask(uint32_t op, uint64_t off, uint64_t n, uint64_t val)
{
	struct cmd c = { op, off, n, val };
	int64_t r;
	put(&c, sizeof(c));
	answer(&r, sizeof(r));
	return r;
}

/* Rank 1's receive buffers and the receive completions it has seen. */
static char rbuf[16][64];
static struct fi_context rctx[16];
static struct fi_cq_tagged_entry got[16];
static int ngot, nposted;

static void drain(void)
{
	struct fi_cq_tagged_entry e;
	ssize_t r = fi_cq_read(cq, &e, 1);
	CHECK(r == 1 || r == -FI_EAGAIN);
	if (r == 1) {
		CHECK(ngot < 16 && (e.flags & FI_RECV));
		got[ngot++] = e;
	}
}

/* Each rank's half of a chain of `len` writes (CHAIN at most): write i
 * goes to the other rank's word 1024 + i once this rank's rw counter
 * reached first_threshold + i (the last one, with `late`, once `late`
 * reaches 1). The values name the rank, i and the chain's round (both
 * ranks count the chains they run). */
static struct fi_deferred_work cw[CHAIN];
static struct fi_op_rma crma[CHAIN];
static struct iovec ciov[CHAIN];
static struct fi_rma_iov criov[CHAIN];
static uint64_t cval[CHAIN];
static uint64_t chain_round;

static uint64_t chain_word(int of_rank, int i)
{
	return chain_round << 32 | ((uint64_t)(of_rank + 1) * 1000000 + (uint64_t)i);
}

static void queue_chain(struct fid_cntr *done, uint64_t first_threshold, int len, struct fid_cntr *late)
{
	CHECK(len > 0 && len <= CHAIN);
	for (int i = 0; i < len; i++) {
		cval[i] = chain_word(rank, i);
		ciov[i] = (struct iovec){ &cval[i], 8 };
		criov[i] = (struct fi_rma_iov){ (uint64_t)(1024 + i) * 8, 8, peer_key };
		crma[i] = (struct fi_op_rma){ .ep = ep,
					      .msg = { .msg_iov = &ciov[i],
						       .iov_count = 1,
						       .addr = peer,
						       .rma_iov = &criov[i],
						       .rma_iov_count = 1,
						       .context = &cval[i] },
					      .flags = 0 };
		cw[i] = (struct fi_deferred_work){ .threshold = first_threshold + (uint64_t)i,
						   .triggering_cntr = rw,
						   .completion_cntr = done,
						   .op_type = FI_OP_WRITE };
		cw[i].op.rma = &crma[i];
		if (late && i == len - 1) {
			cw[i].triggering_cntr = late;
			cw[i].threshold = 1;
		}
		EXPECT(fi_control(&dom->fid, FI_QUEUE_WORK, &cw[i]), 0);
	}
}

static void check_chain_words(int len)
{
	/* Words written by the other rank into ours: 1024 + i. */
	for (int i = 0; i < len; i++)
		CHECK(mem[1024 + i] == chain_word(1 - rank, i));
}

static void serve(void)
{
	for (;;) {
		struct pollfd p = { rd, POLLIN, 0 };
		if (poll(&p, 1, 1) != 1) {
			drain();
			continue;
		}
		struct cmd c;
		get(&c, sizeof(c));
		int64_t v = 0;
		if (c.op == C_FILL || c.op == C_WORDS)
			CHECK(c.off <= MEM / 8 && c.n <= MEM / 8 - c.off);
		switch (c.op) {
		case C_DONE:
			return;
		case C_FILL:
			for (uint64_t i = 0; i < c.n; i++)
				mem[c.off + i] = c.val;
			break;
		case C_WORDS:
			put(&v, sizeof(v));
			put(mem + c.off, c.n * 8);
			continue;
		case C_POST:
			CHECK(c.n <= 16 - (uint64_t)nposted);
			for (uint64_t i = (uint64_t)nposted; i < (uint64_t)nposted + c.n; i++) {
				memset(rbuf[i], 0, 64);
				if (c.val)
					EXPECT(fi_trecv(ep, rbuf[i], 64, NULL, FI_ADDR_UNSPEC, 0, ~0ULL, &rctx[i]), 0);
				else
					EXPECT(fi_recv(ep, rbuf[i], 64, NULL, FI_ADDR_UNSPEC, &rctx[i]), 0);
			}
			nposted += (int)c.n;
			break;
		case C_TAKE: {
			double t0 = now();
			while ((uint64_t)ngot < c.n) {
				drain();
				CHECK(now() - t0 < 10);
			}
			put(&v, sizeof(v));
			for (uint64_t i = 0; i < c.n; i++) {
				int k = (int)((struct fi_context *)got[i].op_context - rctx);
				CHECK(k >= 0 && k < 16);
				uint64_t a[2] = { got[i].tag, 0 };
				memcpy(&a[1], rbuf[k], 8);
				put(a, sizeof(a));
			}
			CHECK(ngot == nposted);
			ngot = nposted = 0;
			continue;
		}
		case C_CHAIN: {
			struct fid_cntr *done = cntr(), *late = c.val ? cntr() : NULL;
			/* Earlier tests wrote here: the chain starts
			 * from the counter's value now. */
			uint64_t base = fi_cntr_read(rw);
			int len = c.n ? (int)c.n : CHAIN;
			chain_round++;
			queue_chain(done, base + 1, len, late);
			put(&v, sizeof(v));
			if (late) {
				/* Rank 0's chain is complete once its writes
				 * landed: it waits for this answer then, and our
				 * last write, fired by the add (in the call),
				 * waits for rank 0 to serve it. */
				wait_cntr(rw, base + (uint64_t)len);
				usleep((useconds_t)c.val);
				EXPECT(fi_cntr_add(late, 1), 0);
			}
			wait_cntr(done, (uint64_t)len);
			if (late)
				EXPECT(fi_close(&late->fid), 0);
			check_chain_words(len);
			v = (int64_t)(fi_cntr_read(rw) - base);
			EXPECT(fi_close(&done->fid), 0);
			break;
		}
		case C_FIRE: {
			/* Work fired by the peer's remote write alone. */
			struct fid_cntr *out = cntr();
			struct fi_op_cntr oc = { out, 7 };
			uint64_t base = fi_cntr_read(rw);
			struct fi_deferred_work w = {
				.threshold = base + c.val, .triggering_cntr = rw, .op_type = FI_OP_CNTR_ADD
			};
			w.op.cntr = &oc;
			EXPECT(fi_control(&dom->fid, FI_QUEUE_WORK, &w), 0);
			CHECK(fi_cntr_read(out) == 0);
			put(&v, sizeof(v));
			wait_cntr(out, 7);
			CHECK(fi_cntr_read(out) == 7);
			v = (int64_t)(fi_cntr_read(rw) - base);
			EXPECT(fi_close(&out->fid), 0);
			break;
		}
		case C_SEND:
			for (uint64_t i = 0; i < c.n; i++) {
				uint64_t m[2] = { c.off + i, ~(c.off + i) };
				ssize_t r;
				double t0 = now();
				while ((r = c.val ? fi_tinject(ep, m, 16, peer, c.val + i) : fi_inject(ep, m, 16, peer)) ==
				       -FI_EAGAIN) {
					drain();
					CHECK(now() - t0 < 10);
				}
				EXPECT(r, 0);
			}
			break;
		case C_SLEEP: {
			static uint64_t val;
			static struct iovec iov;
			static struct fi_rma_iov riov;
			static struct fi_op_rma o;
			static struct fi_deferred_work w;
			val = c.val;
			iov = (struct iovec){ &val, 8 };
			riov = (struct fi_rma_iov){ c.off * 8, 8, peer_key };
			o = (struct fi_op_rma){ .ep = ep,
						.msg = { .msg_iov = &iov,
							 .iov_count = 1,
							 .addr = peer,
							 .rma_iov = &riov,
							 .rma_iov_count = 1 } };
			w = (struct fi_deferred_work){ .threshold = fi_cntr_read(rw) + 1,
						       .triggering_cntr = rw,
						       .op_type = FI_OP_WRITE };
			w.op.rma = &o;
			EXPECT(fi_control(&dom->fid, FI_QUEUE_WORK, &w), 0);
			put(&v, sizeof(v));
			/* No libfabric call until the next command: the
			 * progress thread must fire the work. */
			get(&c, sizeof(c));
			CHECK(c.op == C_WORDS && c.n == 0);
			break;
		}
		default:
			CHECK(!"unknown command");
		}
		put(&v, sizeof(v));
	}
}

/* ---- rank 0's tests ---- */

static void words(uint64_t off, uint64_t n, uint64_t *out)
{
	struct cmd c = { C_WORDS, off, n, 0 };
	int64_t r;
	put(&c, sizeof(c));
	answer(&r, sizeof(r));
	get(out, n * 8);
}

/* A triggered fetch-add of 1 on rank 1's word 0, old value to *res. */
static ssize_t trig_fetch_add(struct fi_triggered_context *tc, struct fid_cntr *c, size_t threshold, uint64_t *res)
{
	static uint64_t one = 1;
	struct fi_ioc op = { &one, 1 }, r = { res, 1 };
	struct fi_rma_ioc rma = { 0, 1, peer_key };
	struct fi_msg_atomic m = { .msg_iov = &op, .iov_count = 1, .addr = peer, .rma_iov = &rma,
				   .rma_iov_count = 1, .datatype = FI_UINT64, .op = FI_SUM, .context = tc };
	tc->event_type = FI_TRIGGER_THRESHOLD;
	tc->trigger.threshold.cntr = c;
	tc->trigger.threshold.threshold = threshold;
	return fi_fetch_atomicmsg(ep, &m, &r, NULL, 1, FI_TRIGGER);
}

static void test_ordering(void)
{
	struct fid_cntr *go = cntr();
	struct fi_triggered_context tc[8];
	uint64_t res[8];
	const size_t thr[5] = { 3, 1, 3, 2, 3 };
	ask(C_FILL, 0, 1, 0);
	for (int i = 0; i < 8; i++)
		res[i] = 99;
	for (int i = 0; i < 5; i++)
		EXPECT(trig_fetch_add(&tc[i], go, thr[i], &res[i]), 0);
	no_completion();
	uint64_t w;
	words(0, 1, &w);
	CHECK(w == 0 && res[0] == 99);
	/* A jump over every threshold at once: threshold order, then
	 * submission order. */
	EXPECT(fi_cntr_add(go, 3), 0);
	for (int i = 0; i < 5; i++) {
		void *ctx = next_ctx(NULL);
		CHECK(ctx >= (void *)&tc[0] && ctx < (void *)&tc[5]);
	}
	CHECK(res[1] == 0 && res[3] == 1 && res[0] == 2 && res[2] == 3 && res[4] == 4);
	/* Already met: runs at once, in the call or the next progress. */
	EXPECT(trig_fetch_add(&tc[5], go, 2, &res[5]), 0);
	CHECK(next_ctx(NULL) == &tc[5]);
	CHECK(res[5] == 5);
	/* A partial advance runs only what is due. */
	EXPECT(trig_fetch_add(&tc[6], go, 7, &res[6]), 0);
	EXPECT(trig_fetch_add(&tc[7], go, 5, &res[7]), 0);
	EXPECT(fi_cntr_add(go, 2), 0);
	CHECK(next_ctx(NULL) == &tc[7]);
	no_completion();
	CHECK(res[7] == 6 && res[6] == 99);
	/* Errors count towards the threshold too. */
	EXPECT(fi_cntr_adderr(go, 2), 0);
	CHECK(next_ctx(NULL) == &tc[6]);
	CHECK(res[6] == 7);
	EXPECT(fi_close(&go->fid), 0);
}

/* Every data operation with FI_TRIGGER. */
static void test_every_triggered_op(void)
{
	struct fid_cntr *go = cntr();
	struct fi_triggered_context tc[7];
	for (int i = 0; i < 7; i++) {
		tc[i].event_type = FI_TRIGGER_THRESHOLD;
		tc[i].trigger.threshold.cntr = go;
		tc[i].trigger.threshold.threshold = 1;
	}
	ask(C_FILL, 0, 64, 0);
	ask(C_FILL, 16, 4, 0x1111);
	ask(C_FILL, 20, 1, 40);
	ask(C_FILL, 21, 1, 5);
	EXPECT(ask(C_POST, 0, 1, 0), 0);
	EXPECT(ask(C_POST, 0, 1, 1), 0);
	uint64_t sbuf = 0xaaaa, tbuf = 0xbbbb, wbuf[2] = { 0x5151, 0x5252 }, rbuf2[4] = { 0 };
	uint64_t add = 2, cas_cmp = 5, cas_new = 77, fetched = 0, cas_old = 0, fadd = 10, fadd_old = 0;
	struct iovec si = { &sbuf, 8 }, ti = { &tbuf, 8 }, wi = { wbuf, 16 }, ri = { rbuf2, 32 };
	struct fi_msg sm = { .msg_iov = &si, .iov_count = 1, .addr = peer, .context = &tc[0] };
	struct fi_msg_tagged tm = { .msg_iov = &ti, .iov_count = 1, .addr = peer, .tag = 0x77, .context = &tc[1] };
	struct fi_rma_iov wr_rma = { 8 * 8, 16, peer_key }, rd_rma = { 16 * 8, 32, peer_key };
	struct fi_msg_rma wm = { .msg_iov = &wi, .iov_count = 1, .addr = peer, .rma_iov = &wr_rma,
				 .rma_iov_count = 1, .context = &tc[2] };
	struct fi_msg_rma rm = { .msg_iov = &ri, .iov_count = 1, .addr = peer, .rma_iov = &rd_rma,
				 .rma_iov_count = 1, .context = &tc[3] };
	struct fi_ioc aop = { &add, 1 }, fop = { &fadd, 1 }, fres = { &fadd_old, 1 };
	struct fi_ioc cop = { &cas_new, 1 }, ccmp = { &cas_cmp, 1 }, cres = { &cas_old, 1 };
	struct fi_rma_ioc a_rma = { 20 * 8, 1, peer_key }, c_rma = { 21 * 8, 1, peer_key };
	struct fi_msg_atomic am = { .msg_iov = &aop, .iov_count = 1, .addr = peer, .rma_iov = &a_rma,
				    .rma_iov_count = 1, .datatype = FI_UINT64, .op = FI_SUM, .context = &tc[4] };
	struct fi_msg_atomic fm = am;
	fm.msg_iov = &fop;
	fm.context = &tc[5];
	struct fi_msg_atomic cm = { .msg_iov = &cop, .iov_count = 1, .addr = peer, .rma_iov = &c_rma,
				    .rma_iov_count = 1, .datatype = FI_UINT64, .op = FI_CSWAP, .context = &tc[6] };
	EXPECT(fi_sendmsg(ep, &sm, FI_TRIGGER), 0);
	EXPECT(fi_tsendmsg(ep, &tm, FI_TRIGGER), 0);
	EXPECT(fi_writemsg(ep, &wm, FI_TRIGGER), 0);
	EXPECT(fi_readmsg(ep, &rm, FI_TRIGGER), 0);
	EXPECT(fi_atomicmsg(ep, &am, FI_TRIGGER), 0);
	EXPECT(fi_fetch_atomicmsg(ep, &fm, &fres, NULL, 1, FI_TRIGGER), 0);
	EXPECT(fi_compare_atomicmsg(ep, &cm, &ccmp, NULL, 1, &cres, NULL, 1, FI_TRIGGER), 0);
	no_completion();
	uint64_t w[24];
	words(0, 24, w);
	CHECK(w[8] == 0 && w[9] == 0 && w[20] == 40 && w[21] == 5);
	CHECK(rbuf2[0] == 0 && fetched == 0 && cas_old == 0 && fadd_old == 0);
	/* The buffers are read when the operations fire, not before. */
	sbuf = 0xa1a1;
	wbuf[1] = 0x5353;
	add = 3;
	EXPECT(fi_cntr_add(go, 1), 0);
	int seen[7] = { 0 };
	for (int i = 0; i < 7; i++) {
		struct fi_cq_tagged_entry e;
		void *ctx = next_ctx(&e);
		int k = (int)((struct fi_triggered_context *)ctx - tc);
		CHECK(k >= 0 && k < 7 && !seen[k]);
		seen[k] = 1;
		static const uint64_t kind[7] = { FI_SEND | FI_MSG, FI_SEND | FI_TAGGED, FI_RMA | FI_WRITE,
						  FI_RMA | FI_READ, FI_ATOMIC | FI_WRITE, FI_ATOMIC | FI_READ,
						  FI_ATOMIC | FI_READ };
		CHECK((e.flags & kind[k]) == kind[k]);
	}
	struct cmd c = { C_TAKE, 0, 2, 0 };
	int64_t r;
	uint64_t a[2][2];
	put(&c, sizeof(c));
	answer(&r, sizeof(r));
	get(a, sizeof(a));
	/* One untagged (0xa1a1), one tagged (0xbbbb with tag 0x77), in
	 * either order. */
	int t = a[0][1] != 0xbbbb; /* the tagged one */
	CHECK(a[t][1] == 0xbbbb && a[t][0] == 0x77 && a[1 - t][1] == 0xa1a1);
	words(0, 24, w);
	CHECK(w[8] == 0x5151 && w[9] == 0x5353);
	CHECK(rbuf2[0] == 0x1111 && rbuf2[3] == 0x1111);
	CHECK(w[20] == 40 + 3 + 10 && (fadd_old == 40 || fadd_old == 43));
	CHECK(cas_old == 5 && w[21] == 77);
	EXPECT(fi_close(&go->fid), 0);
}

/* Every op type through FI_QUEUE_WORK; completion counter, CQ entries
 * only with FI_COMPLETION, receives -FI_ENOSYS. */
static void test_every_deferred_op(void)
{
	struct fid_cntr *go = cntr(), *done = cntr(), *x = cntr();
	ask(C_FILL, 0, 64, 0);
	ask(C_FILL, 16, 4, 0x2222);
	ask(C_FILL, 20, 1, 100);
	ask(C_FILL, 21, 1, 9);
	EXPECT(ask(C_POST, 0, 1, 0), 0);
	EXPECT(ask(C_POST, 0, 1, 1), 0);
	uint64_t sbuf = 0xcccc, tbuf = 0xdddd, wbuf = 0x6161, rbuf2[2] = { 0 };
	uint64_t add = 4, fadd = 1, fadd_old = 0, cas_cmp = 9, cas_new = 88, cas_old = 0;
	struct iovec si = { &sbuf, 8 }, ti = { &tbuf, 8 }, wi = { &wbuf, 8 }, ri = { rbuf2, 16 };
	struct fi_rma_iov wr_rma = { 8 * 8, 8, peer_key }, rd_rma = { 16 * 8, 16, peer_key };
	struct fi_ioc aop = { &add, 1 }, fop = { &fadd, 1 }, fres = { &fadd_old, 1 };
	struct fi_ioc cop = { &cas_new, 1 }, ccmp = { &cas_cmp, 1 }, cres = { &cas_old, 1 };
	struct fi_rma_ioc a_rma = { 20 * 8, 1, peer_key }, c_rma = { 21 * 8, 1, peer_key };
	struct fi_context ctx[8];

	struct fi_op_msg om = { ep, { .msg_iov = &si, .iov_count = 1, .addr = peer, .context = &ctx[0] }, 0 };
	struct fi_op_tagged ot = { ep,
				   { .msg_iov = &ti, .iov_count = 1, .addr = peer, .tag = 0x99, .context = &ctx[1] },
				   0 };
	struct fi_op_rma ow = { ep,
				{ .msg_iov = &wi, .iov_count = 1, .addr = peer, .rma_iov = &wr_rma, .rma_iov_count = 1,
				  .context = &ctx[2] },
				0 };
	struct fi_op_rma orr = { ep,
				 { .msg_iov = &ri, .iov_count = 1, .addr = peer, .rma_iov = &rd_rma,
				   .rma_iov_count = 1, .context = &ctx[3] },
				 0 };
	struct fi_op_atomic oa = { ep,
				   { .msg_iov = &aop, .iov_count = 1, .addr = peer, .rma_iov = &a_rma,
				     .rma_iov_count = 1, .datatype = FI_UINT64, .op = FI_SUM, .context = &ctx[4] },
				   0 };
	struct fi_op_fetch_atomic of = { ep,
					 { .msg_iov = &fop, .iov_count = 1, .addr = peer, .rma_iov = &a_rma,
					   .rma_iov_count = 1, .datatype = FI_UINT64, .op = FI_SUM, .context = &ctx[5] },
					 { .msg_iov = &fres, .iov_count = 1 },
					 FI_COMPLETION };
	struct fi_op_compare_atomic oc = { ep,
					   { .msg_iov = &cop, .iov_count = 1, .addr = peer, .rma_iov = &c_rma,
					     .rma_iov_count = 1, .datatype = FI_UINT64, .op = FI_CSWAP,
					     .context = &ctx[6] },
					   { .msg_iov = &cres, .iov_count = 1 },
					   { .msg_iov = &ccmp, .iov_count = 1 },
					   0 };
	struct fi_op_cntr oset = { x, 10 }, oadd = { x, 5 };
	struct fi_deferred_work w[9];
	memset(w, 0, sizeof(w));
	const enum fi_op_type types[9] = { FI_OP_SEND, FI_OP_TSEND, FI_OP_WRITE, FI_OP_READ, FI_OP_ATOMIC,
					   FI_OP_FETCH_ATOMIC, FI_OP_COMPARE_ATOMIC, FI_OP_CNTR_SET, FI_OP_CNTR_ADD };
	for (int i = 0; i < 9; i++) {
		w[i].threshold = 2;
		w[i].triggering_cntr = go;
		w[i].completion_cntr = i < 7 ? done : NULL;
		w[i].op_type = types[i];
	}
	w[0].op.msg = &om;
	w[1].op.tagged = &ot;
	w[2].op.rma = &ow;
	w[3].op.rma = &orr;
	w[4].op.atomic = &oa;
	w[5].op.fetch_atomic = &of;
	w[6].op.compare_atomic = &oc;
	w[7].op.cntr = &oset;
	w[8].op.cntr = &oadd;
	w[8].threshold = 3; /* the add after the set */
	for (int i = 0; i < 9; i++)
		EXPECT(fi_control(&dom->fid, FI_QUEUE_WORK, &w[i]), 0);

	/* Receives shmfab cannot defer (multi-receive, claims): -FI_ENOSYS,
	 * once their endpoint is checked. */
	struct fi_op_msg orecv = { ep, { .msg_iov = &si, .iov_count = 1, .addr = FI_ADDR_UNSPEC }, FI_MULTI_RECV };
	struct fi_op_tagged otrecv = { ep, { .msg_iov = &si, .iov_count = 1, .addr = FI_ADDR_UNSPEC }, FI_CLAIM };
	struct fi_deferred_work wr_ = { .threshold = 1, .triggering_cntr = go, .op_type = FI_OP_RECV };
	wr_.op.msg = &orecv;
	EXPECT(fi_control(&dom->fid, FI_QUEUE_WORK, &wr_), -FI_ENOSYS);
	wr_.op_type = FI_OP_TRECV;
	wr_.op.tagged = &otrecv;
	EXPECT(fi_control(&dom->fid, FI_QUEUE_WORK, &wr_), -FI_ENOSYS);
	otrecv.ep = NULL;
	EXPECT(fi_control(&dom->fid, FI_QUEUE_WORK, &wr_), -FI_EINVAL);

	EXPECT(fi_cntr_add(go, 1), 0);
	no_completion();
	CHECK(fi_cntr_read(done) == 0 && fi_cntr_read(x) == 0);
	sbuf = 0xc1c1; /* read when fired */
	EXPECT(fi_cntr_add(go, 1), 0);
	wait_cntr(done, 7);
	/* Only the fetch atomic asked for a CQ entry. */
	CHECK(next_ctx(NULL) == &ctx[5]);
	no_completion();
	CHECK(fi_cntr_read(x) == 10);
	EXPECT(fi_cntr_add(go, 1), 0);
	CHECK(fi_cntr_read(x) == 15);
	CHECK(fi_cntr_read(done) == 7);
	struct cmd c = { C_TAKE, 0, 2, 0 };
	int64_t r;
	uint64_t a[2][2];
	put(&c, sizeof(c));
	answer(&r, sizeof(r));
	get(a, sizeof(a));
	int t = a[0][1] != 0xdddd;
	CHECK(a[t][1] == 0xdddd && a[t][0] == 0x99 && a[1 - t][1] == 0xc1c1);
	uint64_t wv[24];
	words(0, 24, wv);
	CHECK(wv[8] == 0x6161 && rbuf2[0] == 0x2222 && rbuf2[1] == 0x2222);
	CHECK(wv[20] == 105 && (fadd_old == 100 || fadd_old == 104));
	CHECK(cas_old == 9 && wv[21] == 88);
	/* Gone from the queue once run: cancel finds nothing. */
	EXPECT(fi_control(&dom->fid, FI_CANCEL_WORK, &w[0]), -FI_ENOENT);
	EXPECT(fi_close(&go->fid), 0);
	EXPECT(fi_close(&done->fid), 0);
	EXPECT(fi_close(&x->fid), 0);
}

static void add_work(struct fi_deferred_work *w, struct fi_op_cntr *o, struct fid_cntr *trig, uint64_t thr,
		     struct fid_cntr *target, uint64_t v)
{
	*o = (struct fi_op_cntr){ target, v };
	memset(w, 0, sizeof(*w));
	w->threshold = thr;
	w->triggering_cntr = trig;
	w->op_type = FI_OP_CNTR_ADD;
	w->op.cntr = o;
	EXPECT(fi_control(&dom->fid, FI_QUEUE_WORK, w), 0);
}

static void test_cancel_flush(void)
{
	struct fid_cntr *a = cntr(), *b = cntr(), *out = cntr();
	struct fi_deferred_work w[8];
	struct fi_op_cntr o[8];
	add_work(&w[0], &o[0], a, 1, out, 1);
	add_work(&w[1], &o[1], a, 1, out, 10);
	add_work(&w[2], &o[2], a, 2, out, 100);
	add_work(&w[3], &o[3], b, 1, out, 1000);
	add_work(&w[4], &o[4], b, 1, out, 10000);
	EXPECT(fi_control(&dom->fid, FI_CANCEL_WORK, &w[1]), 0);
	EXPECT(fi_control(&dom->fid, FI_CANCEL_WORK, &w[1]), -FI_ENOENT);
	/* Flush by counter (its fid) leaves a's work. */
	EXPECT(fi_control(&dom->fid, FI_FLUSH_WORK, &b->fid), 0);
	EXPECT(fi_cntr_add(b, 5), 0);
	EXPECT(fi_cntr_add(a, 5), 0);
	CHECK(fi_cntr_read(out) == 101);
	EXPECT(fi_control(&dom->fid, FI_CANCEL_WORK, &w[3]), -FI_ENOENT);
	/* Flush by a work struct naming the counter. */
	add_work(&w[5], &o[5], b, 6, out, 1);
	add_work(&w[6], &o[6], a, 6, out, 2);
	struct fi_deferred_work sel = { .triggering_cntr = b };
	EXPECT(fi_control(&dom->fid, FI_FLUSH_WORK, &sel), 0);
	EXPECT(fi_cntr_add(b, 1), 0);
	EXPECT(fi_cntr_add(a, 1), 0);
	CHECK(fi_cntr_read(out) == 103);
	/* Flush everything. */
	add_work(&w[0], &o[0], a, 7, out, 1);
	add_work(&w[1], &o[1], b, 7, out, 1);
	EXPECT(fi_control(&dom->fid, FI_FLUSH_WORK, NULL), 0);
	EXPECT(fi_cntr_add(a, 10), 0);
	EXPECT(fi_cntr_add(b, 10), 0);
	CHECK(fi_cntr_read(out) == 103);
	EXPECT(fi_control(&dom->fid, FI_CANCEL_WORK, &w[0]), -FI_ENOENT);
	EXPECT(fi_close(&a->fid), 0);
	EXPECT(fi_close(&b->fid), 0);
	EXPECT(fi_close(&out->fid), 0);
}

/* A cancelled data operation never runs; triggered operations are not
 * deferred work: a flush leaves them. */
static void test_cancel_data_and_flush_keeps_triggered(void)
{
	struct fid_cntr *go = cntr(), *done = cntr();
	ask(C_FILL, 30, 2, 0);
	uint64_t v = 0x4444, res = 99;
	struct iovec iov = { &v, 8 };
	struct fi_rma_iov rma = { 30 * 8, 8, peer_key };
	struct fi_op_rma o = { ep, { .msg_iov = &iov, .iov_count = 1, .addr = peer, .rma_iov = &rma, .rma_iov_count = 1 },
			       FI_COMPLETION };
	struct fi_deferred_work w = { .threshold = 1, .triggering_cntr = go, .completion_cntr = done,
				      .op_type = FI_OP_WRITE };
	w.op.rma = &o;
	EXPECT(fi_control(&dom->fid, FI_QUEUE_WORK, &w), 0);
	EXPECT(fi_control(&dom->fid, FI_CANCEL_WORK, &w), 0);
	struct fi_triggered_context tc;
	/* Word 31 += 1 once go reaches 1 (fetching into res). */
	static uint64_t one = 1;
	struct fi_ioc op = { &one, 1 }, r = { &res, 1 };
	struct fi_rma_ioc ar = { 31 * 8, 1, peer_key };
	struct fi_msg_atomic m = { .msg_iov = &op, .iov_count = 1, .addr = peer, .rma_iov = &ar,
				   .rma_iov_count = 1, .datatype = FI_UINT64, .op = FI_SUM, .context = &tc };
	tc.event_type = FI_TRIGGER_THRESHOLD;
	tc.trigger.threshold.cntr = go;
	tc.trigger.threshold.threshold = 1;
	EXPECT(fi_fetch_atomicmsg(ep, &m, &r, NULL, 1, FI_TRIGGER), 0);
	EXPECT(fi_control(&dom->fid, FI_FLUSH_WORK, NULL), 0);
	EXPECT(fi_control(&dom->fid, FI_FLUSH_WORK, &go->fid), 0);
	EXPECT(fi_cntr_add(go, 1), 0);
	CHECK(next_ctx(NULL) == &tc);
	no_completion();
	uint64_t wv[2];
	words(30, 2, wv);
	CHECK(wv[0] == 0 && wv[1] == 1 && res == 0);
	CHECK(fi_cntr_read(done) == 0 && fi_cntr_readerr(done) == 0);
	EXPECT(fi_close(&go->fid), 0);
	EXPECT(fi_close(&done->fid), 0);
}

/* A deferred operation that fails counts its completion counter's error
 * value; an error CQ entry only with FI_COMPLETION. */
static void test_deferred_failure(void)
{
	struct fid_cntr *go = cntr(), *done = cntr();
	uint64_t v = 1;
	struct iovec iov = { &v, 8 };
	struct fi_rma_iov bad = { 0, 8, peer_key ^ 0x5a5a5a }; /* no such key */
	struct fi_op_rma o[2] = {
		{ ep, { .msg_iov = &iov, .iov_count = 1, .addr = peer, .rma_iov = &bad, .rma_iov_count = 1 }, 0 },
		{ ep,
		  { .msg_iov = &iov, .iov_count = 1, .addr = peer, .rma_iov = &bad, .rma_iov_count = 1, .context = &v },
		  FI_COMPLETION },
	};
	struct fi_deferred_work w[2];
	for (int i = 0; i < 2; i++) {
		w[i] = (struct fi_deferred_work){ .threshold = 1, .triggering_cntr = go, .completion_cntr = done,
						  .op_type = FI_OP_WRITE };
		w[i].op.rma = &o[i];
		EXPECT(fi_control(&dom->fid, FI_QUEUE_WORK, &w[i]), 0);
	}
	EXPECT(fi_cntr_add(go, 1), 0);
	double t0 = now();
	while (fi_cntr_readerr(done) < 2) {
		CHECK(now() - t0 < 10);
		fi_cntr_wait(done, 1, 1);
	}
	CHECK(fi_cntr_read(done) == 0 && fi_cntr_readerr(done) == 2);
	struct fi_cq_tagged_entry e;
	t0 = now();
	ssize_t r;
	while ((r = fi_cq_read(cq, &e, 1)) == -FI_EAGAIN)
		CHECK(now() - t0 < 10);
	EXPECT(r, -FI_EAVAIL);
	struct fi_cq_err_entry ee = { 0 };
	EXPECT(fi_cq_readerr(cq, &ee, 0), 1);
	CHECK(ee.op_context == &v && ee.err > 0);
	no_completion();
	EXPECT(fi_close(&go->fid), 0);
	EXPECT(fi_close(&done->fid), 0);
}

/* Scattered operands with FI_INJECT: copied at submission. */
static void test_inject_scattered_operands(void)
{
	struct fid_cntr *go = cntr();
	ask(C_FILL, 32, 2, 10);
	uint64_t a[3] = { 1, 0, 2 };
	struct fi_ioc op[2] = { { &a[0], 1 }, { &a[2], 1 } };
	struct fi_rma_ioc rma = { 32 * 8, 2, peer_key };
	struct fi_triggered_context tc = { .event_type = FI_TRIGGER_THRESHOLD };
	tc.trigger.threshold.cntr = go;
	tc.trigger.threshold.threshold = 1;
	struct fi_msg_atomic m = { .msg_iov = op, .iov_count = 2, .addr = peer, .rma_iov = &rma,
				   .rma_iov_count = 1, .datatype = FI_UINT64, .op = FI_SUM, .context = &tc };
	EXPECT(fi_atomicmsg(ep, &m, FI_TRIGGER), -FI_ENOSYS);
	EXPECT(fi_atomicmsg(ep, &m, FI_TRIGGER | FI_INJECT), 0);
	a[0] = a[2] = 100; /* too late: copied */
	EXPECT(fi_cntr_add(go, 1), 0);
	CHECK(next_ctx(NULL) == &tc);
	uint64_t wv[2];
	words(32, 2, wv);
	CHECK(wv[0] == 11 && wv[1] == 12);
	EXPECT(fi_close(&go->fid), 0);
}

/* A counter that work waits on cannot close: -FI_EBUSY, until the work
 * is gone. */
static void test_busy_counter(void)
{
	struct fid_cntr *a = cntr(), *out = cntr();
	struct fi_deferred_work w;
	struct fi_op_cntr o;
	add_work(&w, &o, a, 1, out, 1);
	EXPECT(fi_close(&a->fid), -FI_EBUSY);
	EXPECT(fi_control(&dom->fid, FI_CANCEL_WORK, &w), 0);
	EXPECT(fi_close(&a->fid), 0);
	EXPECT(fi_close(&out->fid), 0);
}

static void test_bad_arguments(void)
{
	struct fid_cntr *go = cntr();
	uint64_t v = 1, res = 0, cmp = 0;
	struct iovec si = { &v, 8 };
	struct fi_triggered_context tc = { .event_type = FI_TRIGGER_THRESHOLD };
	tc.trigger.threshold.cntr = go;
	tc.trigger.threshold.threshold = 1;
	struct fi_msg m = { .msg_iov = &si, .iov_count = 1, .addr = peer, .context = NULL };
	EXPECT(fi_sendmsg(ep, &m, FI_TRIGGER), -FI_EINVAL); /* no context */
	m.context = &tc;
	tc.event_type = FI_TRIGGER_XPU;
	EXPECT(fi_sendmsg(ep, &m, FI_TRIGGER), -FI_ENOSYS);
	tc.event_type = (enum fi_trigger_event)77;
	EXPECT(fi_sendmsg(ep, &m, FI_TRIGGER), -FI_EINVAL);
	tc.event_type = FI_TRIGGER_THRESHOLD;
	tc.trigger.threshold.cntr = NULL;
	EXPECT(fi_sendmsg(ep, &m, FI_TRIGGER), -FI_EINVAL);
	tc.trigger.threshold.cntr = (struct fid_cntr *)&ep->fid; /* not a counter */
	EXPECT(fi_sendmsg(ep, &m, FI_TRIGGER), -FI_EINVAL);
	tc.trigger.threshold.cntr = go;
	EXPECT(fi_recvmsg(ep, &m, FI_TRIGGER | FI_MULTI_RECV), -FI_ENOSYS);
	/* Scattered results: the library takes one buffer. */
	uint64_t two[3] = { 0 };
	struct fi_ioc op = { &v, 2 }, split[2] = { { &two[0], 1 }, { &two[2], 1 } };
	uint64_t ops[2] = { 1, 1 };
	op.addr = ops;
	struct fi_rma_ioc rma = { 0, 2, peer_key };
	struct fi_msg_atomic am = { .msg_iov = &op, .iov_count = 1, .addr = peer, .rma_iov = &rma,
				    .rma_iov_count = 1, .datatype = FI_UINT64, .op = FI_SUM, .context = &tc };
	EXPECT(fi_fetch_atomicmsg(ep, &am, split, NULL, 2, FI_TRIGGER), -FI_ENOSYS);
	am.datatype = FI_LONG_DOUBLE;
	EXPECT(fi_atomicmsg(ep, &am, FI_TRIGGER), -FI_EOPNOTSUPP);
	(void)res;
	(void)cmp;

	/* fi_control's arguments. */
	EXPECT(fi_control(&dom->fid, FI_QUEUE_WORK, NULL), -FI_EINVAL);
	EXPECT(fi_control(&dom->fid, FI_CANCEL_WORK, NULL), -FI_EINVAL);
	struct fid_cntr *out = cntr();
	struct fi_op_cntr oc = { out, 1 };
	struct fi_deferred_work w = { .threshold = 1, .triggering_cntr = NULL, .op_type = FI_OP_CNTR_ADD };
	w.op.cntr = &oc;
	EXPECT(fi_control(&dom->fid, FI_QUEUE_WORK, &w), -FI_EINVAL); /* no triggering counter */
	w.triggering_cntr = go;
	w.completion_cntr = out;
	EXPECT(fi_control(&dom->fid, FI_QUEUE_WORK, &w), -FI_EINVAL); /* counter ops take none */
	w.completion_cntr = NULL;
	w.op.cntr = NULL;
	EXPECT(fi_control(&dom->fid, FI_QUEUE_WORK, &w), -FI_EINVAL); /* no op struct */
	w.op.cntr = &oc;
	w.op_type = (enum fi_op_type)99;
	EXPECT(fi_control(&dom->fid, FI_QUEUE_WORK, &w), -FI_EINVAL);
	w.op_type = FI_OP_CNTR_ADD;
	oc.cntr = NULL;
	EXPECT(fi_control(&dom->fid, FI_QUEUE_WORK, &w), -FI_EINVAL); /* no target */
	oc.cntr = out;
	/* A send with bad flags, or on a closed... endpoint of NULL. */
	struct fi_op_msg om = { NULL, { .msg_iov = &si, .iov_count = 1, .addr = peer }, 0 };
	w.op_type = FI_OP_SEND;
	w.op.msg = &om;
	EXPECT(fi_control(&dom->fid, FI_QUEUE_WORK, &w), -FI_EINVAL);
	om.ep = ep;
	om.flags = FI_MULTI_RECV;
	EXPECT(fi_control(&dom->fid, FI_QUEUE_WORK, &w), -FI_EBADFLAGS);
	/* Never queued: cancel refuses it. */
	struct fi_deferred_work never;
	memset(&never, 0, sizeof(never));
	EXPECT(fi_control(&dom->fid, FI_CANCEL_WORK, &never), -FI_EINVAL);
	/* A counter of another domain. */
	struct fid_domain *dom2;
	struct fid_cntr *other;
	struct fi_cntr_attr ca = { .events = FI_CNTR_EVENTS_COMP };
	EXPECT(fi_domain(fab, fi, &dom2, NULL), 0);
	EXPECT(fi_cntr_open(dom2, &ca, &other, NULL), 0);
	w.op_type = FI_OP_CNTR_ADD;
	w.op.cntr = &oc;
	w.triggering_cntr = other;
	EXPECT(fi_control(&dom->fid, FI_QUEUE_WORK, &w), -FI_EINVAL);
	w.triggering_cntr = go;
	oc.cntr = other;
	EXPECT(fi_control(&dom->fid, FI_QUEUE_WORK, &w), -FI_EINVAL);
	EXPECT(fi_close(&other->fid), 0);
	EXPECT(fi_close(&dom2->fid), 0);
	/* Other commands: not built. */
	EXPECT(fi_control(&dom->fid, FI_GETWAIT, &w), -FI_ENOSYS);
	/* Nothing queued by any of that. */
	EXPECT(fi_cntr_add(go, 5), 0);
	CHECK(fi_cntr_read(out) == 0);
	no_completion();
	EXPECT(fi_close(&out->fid), 0);
	EXPECT(fi_close(&go->fid), 0);
}

/* FI_DELIVERY_COMPLETE on a triggered send: it completes once fired and
 * once the peer's receive has the data, not before. */
static void test_triggered_delivery_complete(void)
{
	struct fid_cntr *go = cntr();
	uint64_t v[2] = { 0xdc0, ~0xdc0ULL };
	struct iovec si = { v, 16 };
	struct fi_triggered_context tc = { .event_type = FI_TRIGGER_THRESHOLD };
	tc.trigger.threshold.cntr = go;
	tc.trigger.threshold.threshold = 1;
	struct fi_msg_tagged m = { .msg_iov = &si, .iov_count = 1, .addr = peer, .tag = 0x900, .context = &tc };
	EXPECT(fi_tsendmsg(ep, &m, FI_TRIGGER | FI_DELIVERY_COMPLETE | FI_COMPLETION), 0);
	no_completion(); /* not fired */
	EXPECT(fi_cntr_add(go, 1), 0);
	no_completion(); /* fired; the peer has posted no receive */
	EXPECT(ask(C_POST, 0, 1, 1), 0);
	/* Rank 1 takes it while this rank drives its own progress (reading
	 * its CQ: a send whose data goes through the peer's pool needs it)
	 * until the send completes, which it may only do after the receive. */
	struct cmd c = { C_TAKE, 0, 1, 0 };
	int64_t r;
	uint64_t a[2];
	put(&c, sizeof(c));
	struct fi_cq_tagged_entry e;
	CHECK(next_ctx(&e) == &tc && (e.flags & FI_SEND));
	answer(&r, sizeof(r));
	get(a, sizeof(a));
	CHECK(a[0] == 0x900 && a[1] == 0xdc0);
	EXPECT(fi_close(&go->fid), 0);
}

/* Reads the error completion that must come next (10 s at most): its
 * op_context, its err in *err. */
static void *next_err(int *err, uint64_t *flags)
{
	struct fi_cq_tagged_entry e;
	double t0 = now();
	ssize_t r;
	while ((r = fi_cq_read(cq, &e, 1)) == -FI_EAGAIN)
		CHECK(now() - t0 < 10);
	EXPECT(r, -FI_EAVAIL);
	struct fi_cq_err_entry ee = { 0 };
	EXPECT(fi_cq_readerr(cq, &ee, 0), 1);
	*err = ee.err;
	*flags = ee.flags;
	return ee.op_context;
}

/* Deferred and triggered receives. */
static void test_receives(void)
{
	struct fid_cntr *go = cntr(), *done = cntr();
	uint64_t head = 0, tail = 0, b2[2] = { 0 };
	struct fi_context ctx[4];

	/* FI_OP_TRECV, directed, into two segments, queued at 2; rank 1's
	 * message is sent first and waits as unexpected. */
	struct iovec iv[2] = { { &head, 8 }, { &tail, 8 } };
	struct fi_op_tagged ot = { ep,
				   { .msg_iov = iv, .iov_count = 2, .addr = peer, .tag = 0x700, .context = &ctx[0] },
				   0 };
	struct fi_deferred_work w0 = { .threshold = 2, .triggering_cntr = go, .completion_cntr = done,
				       .op_type = FI_OP_TRECV };
	w0.op.tagged = &ot;
	EXPECT(fi_control(&dom->fid, FI_QUEUE_WORK, &w0), 0);
	EXPECT(ask(C_SEND, 0xabc, 1, 0x700), 0);
	EXPECT(fi_cntr_add(go, 1), 0);
	no_completion();
	CHECK(fi_cntr_read(done) == 0 && head == 0 && tail == 0);
	EXPECT(fi_cntr_add(go, 1), 0);
	wait_cntr(done, 1);
	CHECK(head == 0xabc && tail == ~0xabcULL);
	no_completion(); /* no FI_COMPLETION: no entry */
	EXPECT(fi_control(&dom->fid, FI_CANCEL_WORK, &w0), -FI_ENOENT);

	/* FI_OP_RECV with FI_COMPLETION: posted at 3, counted on arrival. */
	struct iovec bi = { b2, 16 };
	struct fi_op_msg om = { ep, { .msg_iov = &bi, .iov_count = 1, .addr = 999 /* ignored */, .context = &ctx[1] },
				FI_COMPLETION };
	struct fi_deferred_work w1 = { .threshold = 3, .triggering_cntr = go, .completion_cntr = done,
				       .op_type = FI_OP_RECV };
	w1.op.msg = &om;
	EXPECT(fi_control(&dom->fid, FI_QUEUE_WORK, &w1), 0);
	EXPECT(fi_cntr_add(go, 1), 0);
	no_completion();
	CHECK(fi_cntr_read(done) == 1); /* posted, nothing arrived */
	EXPECT(ask(C_SEND, 0x55, 1, 0), 0);
	wait_cntr(done, 2);
	struct fi_cq_tagged_entry e;
	CHECK(next_ctx(&e) == &ctx[1]);
	CHECK(e.flags == (FI_RECV | FI_MSG) && e.len == 16 && b2[0] == 0x55 && b2[1] == ~0x55ULL);

	/* FI_TRIGGER on fi_trecvmsg: posted when go reaches 4. */
	struct fi_triggered_context tc = { .event_type = FI_TRIGGER_THRESHOLD };
	tc.trigger.threshold.cntr = go;
	tc.trigger.threshold.threshold = 4;
	memset(b2, 0, sizeof(b2));
	/* The endpoint has no FI_DIRECTED_RECV: the source address is
	 * ignored (fi_msg(3)), one in no AV included. */
	struct fi_msg_tagged tm = { .msg_iov = &bi, .iov_count = 1, .addr = 999, .tag = 0x701, .context = &tc };
	EXPECT(fi_trecvmsg(ep, &tm, FI_TRIGGER), 0);
	EXPECT(ask(C_SEND, 0x77, 1, 0x701), 0);
	no_completion();
	CHECK(b2[0] == 0);
	EXPECT(fi_cntr_add(go, 1), 0);
	CHECK(next_ctx(&e) == &tc);
	CHECK(e.flags == (FI_RECV | FI_TAGGED) && e.tag == 0x701 && b2[0] == 0x77);

	/* fi_cancel of a triggered receive and a triggered send not fired. */
	struct fi_triggered_context tr = tc, ts = tc;
	tr.trigger.threshold.threshold = 100;
	ts.trigger.threshold.threshold = 100;
	struct fi_msg rm = { .msg_iov = &bi, .iov_count = 1, .addr = FI_ADDR_UNSPEC, .context = &tr };
	EXPECT(fi_recvmsg(ep, &rm, FI_TRIGGER), 0);
	struct fi_msg sm = { .msg_iov = &bi, .iov_count = 1, .addr = peer, .context = &ts };
	EXPECT(fi_sendmsg(ep, &sm, FI_TRIGGER), 0);
	EXPECT(fi_cancel(&ep->fid, &tr), 0);
	EXPECT(fi_cancel(&ep->fid, &ts), 0);
	int err;
	uint64_t fl;
	CHECK(next_err(&err, &fl) == &tr && err == FI_ECANCELED && (fl & FI_RECV));
	CHECK(next_err(&err, &fl) == &ts && err == FI_ECANCELED && (fl & FI_SEND));
	EXPECT(fi_cntr_add(go, 200), 0);
	no_completion(); /* never run */
	struct fi_msg_tagged bad = tm;
	EXPECT(fi_trecvmsg(ep, &bad, FI_TRIGGER | FI_CLAIM), -FI_ENOSYS);

	/* FI_CANCEL_WORK of a deferred receive. */
	struct fi_deferred_work w2 = w1;
	w2.threshold = 10000;
	EXPECT(fi_control(&dom->fid, FI_QUEUE_WORK, &w2), 0);
	EXPECT(fi_control(&dom->fid, FI_CANCEL_WORK, &w2), 0);
	EXPECT(fi_control(&dom->fid, FI_CANCEL_WORK, &w2), -FI_ENOENT);

	/* A collective's step: a receive from rank 1 posted by a trigger,
	 * whose arrival fires the send of what it received back to rank 1. */
	struct fid_cntr *go2 = cntr(), *got = cntr(), *sent = cntr();
	uint64_t echo[2] = { 0 };
	struct iovec ei = { echo, 16 };
	struct fi_op_tagged orx = { ep, { .msg_iov = &ei, .iov_count = 1, .addr = peer, .tag = 0x800 }, 0 };
	struct fi_op_tagged otx = { ep, { .msg_iov = &ei, .iov_count = 1, .addr = peer, .tag = 0x801 }, 0 };
	struct fi_deferred_work wr_ = { .threshold = 1, .triggering_cntr = go2, .completion_cntr = got,
					.op_type = FI_OP_TRECV };
	struct fi_deferred_work wt = { .threshold = 1, .triggering_cntr = got, .completion_cntr = sent,
				       .op_type = FI_OP_TSEND };
	wr_.op.tagged = &orx;
	wt.op.tagged = &otx;
	EXPECT(fi_control(&dom->fid, FI_QUEUE_WORK, &wr_), 0);
	EXPECT(fi_control(&dom->fid, FI_QUEUE_WORK, &wt), 0);
	EXPECT(ask(C_POST, 0, 1, 1), 0);
	EXPECT(fi_cntr_add(go2, 1), 0);
	EXPECT(ask(C_SEND, 0x9999, 1, 0x800), 0);
	wait_cntr(sent, 1);
	CHECK(fi_cntr_read(got) == 1 && echo[0] == 0x9999);
	struct cmd c = { C_TAKE, 0, 1, 0 };
	int64_t r;
	uint64_t a[2];
	put(&c, sizeof(c));
	answer(&r, sizeof(r));
	get(a, sizeof(a));
	CHECK(a[0] == 0x801 && a[1] == 0x9999);
	no_completion();
	EXPECT(fi_close(&go2->fid), 0);
	EXPECT(fi_close(&got->fid), 0);
	EXPECT(fi_close(&sent->fid), 0);
	EXPECT(fi_close(&go->fid), 0);
	EXPECT(fi_close(&done->fid), 0);
}

/* Work on rank 1 fired by rank 0's remote write alone. */
static void test_remote_event(void)
{
	struct cmd c = { C_FIRE, 0, 0, 2 };
	int64_t r;
	put(&c, sizeof(c));
	answer(&r, sizeof(r));
	CHECK(r == 0);
	uint64_t v = 5;
	for (int i = 0; i < 2; i++) {
		EXPECT(fi_inject_write(ep, &v, 8, peer, 40 * 8, peer_key), 0);
	}
	answer(&r, sizeof(r));
	CHECK(r >= 2);
}

/* With auto progress: rank 1's work fires while rank 1 sleeps in read(2)
 * (its progress thread serves our write, counts, and fires the write back). */
static void test_fires_while_the_target_sleeps(void)
{
	uint64_t base = fi_cntr_read(rw), v = 1;
	mem[3000] = 0;
	EXPECT(ask(C_SLEEP, 3000, 0, 0xfeed), 0);
	usleep(20000); /* let it fall asleep */
	EXPECT(fi_inject_write(ep, &v, 8, peer, 41 * 8, peer_key), 0);
	wait_cntr(rw, base + 1);
	CHECK(mem[3000] == 0xfeed);
	struct cmd c = { C_WORDS, 0, 0, 0 };
	int64_t r;
	put(&c, sizeof(c)); /* wakes rank 1 */
	answer(&r, sizeof(r));
	CHECK(r == 0);
}

/* A chain of `len` writes each way: rank 0's write i lands in rank 1's
 * memory, whose rw counter fires rank 1's write i to rank 0, whose rw
 * counter fires rank 0's write i+1, all queued in advance. With
 * `late_us`, rank 1's last write goes that long after rank 0's last one
 * landed, when rank 0 already waits for rank 1's answer. */
static void chain(int len, uint64_t late_us)
{
	struct cmd c = { C_CHAIN, 0, (uint64_t)len, late_us };
	int64_t r;
	chain_round++;
	put(&c, sizeof(c));
	answer(&r, sizeof(r));
	CHECK(r == 0);
	struct fid_cntr *done = cntr();
	uint64_t base = fi_cntr_read(rw);
	queue_chain(done, base, len, NULL); /* the first one's threshold is met at once */
	wait_cntr(done, (uint64_t)len);
	/* Rank 1's last write is fired by our last one landing: it may not
	 * have landed yet, and with single copy off rank 1 waits in it until
	 * we serve it (answer() makes progress while it waits). */
	answer(&r, sizeof(r));
	CHECK(r == len);
	wait_cntr(rw, base + (uint64_t)len);
	check_chain_words(len);
	EXPECT(fi_close(&done->fid), 0);
}

static void test_chain(void)
{
	chain(CHAIN, 0);
	chain(4, 20000);
}

/* A plain message to rank 1 (received through C_POST and C_TAKE). */
static void message_to_rank1(uint64_t v)
{
	static struct fi_context sctx;
	uint64_t m[2] = { v, ~v };
	EXPECT(ask(C_POST, 0, 1, 0), 0);
	EXPECT(fi_send(ep, m, 16, NULL, peer, &sctx), 0);
	CHECK(next_ctx(NULL) == &sctx);
	struct cmd c = { C_TAKE, 0, 1, 0 };
	int64_t r;
	uint64_t a[2];
	put(&c, sizeof(c));
	answer(&r, sizeof(r));
	get(a, sizeof(a));
	CHECK(a[1] == v);
}

/* `rounds` short chains, each after a message to rank 1: the end of a
 * chain (rank 1's last write still on its way into rank 0's memory while
 * rank 0 already waits for rank 1's answer, now and then; made late in
 * every 50th) many times over. */
static void test_chain_ends(int rounds)
{
	for (int i = 0; i < rounds; i++) {
		message_to_rank1(0x5000 + (uint64_t)i);
		chain(1 + i % 4, i % 50 == 49 ? 2000 : 0);
	}
}

static void open_all(int autop)
{
	struct fi_info *h = fi_allocinfo();
	struct fi_av_attr aa = { .type = FI_AV_TABLE };
	struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_TAGGED, .wait_obj = FI_WAIT_UNSPEC };
	char me[64], other[64];
	size_t len = sizeof(me);

	CHECK(h);
	h->fabric_attr->prov_name = strdup("shmfab");
	h->ep_attr->type = FI_EP_RDM;
	h->caps = FI_MSG | FI_TAGGED | FI_RMA | FI_ATOMIC | FI_RMA_EVENT | FI_TRIGGER;
	h->domain_attr->mr_mode = FI_MR_PROV_KEY;
	if (autop)
		h->domain_attr->data_progress = FI_PROGRESS_AUTO;
	EXPECT(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &fi), 0);
	CHECK(fi->caps & FI_TRIGGER);
	CHECK(fi->tx_attr->caps & FI_TRIGGER);
	/* Offered by default too. */
	struct fi_info *d;
	h->caps = 0;
	EXPECT(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &d), 0);
	CHECK(d->caps & FI_TRIGGER);
	fi_freeinfo(d);
	fi_freeinfo(h);
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

	CHECK(posix_memalign((void **)&mem, 4096, MEM) == 0);
	memset(mem, 0, MEM);
	EXPECT(fi_mr_reg(dom, mem, MEM, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, &mr, NULL), 0);
	rw = cntr();
	EXPECT(fi_mr_bind(mr, &rw->fid, FI_REMOTE_WRITE), 0);
	uint64_t k = fi_mr_key(mr);
	put(&k, 8);
	get(&peer_key, 8);
}

int main(int argc, char **argv)
{
	int autop = argc > 1 && !strcmp(argv[1], "auto");
	int rounds = argc > 2 && !strcmp(argv[1], "chains") ? atoi(argv[2]) : 0;
	CHECK(argc == 1 || autop || rounds > 0);
	int p2c[2], c2p[2];
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
		serve();
	} else if (rounds) {
		test_chain_ends(rounds);
		struct cmd c = { C_DONE, 0, 0, 0 };
		put(&c, sizeof(c));
	} else {
		test_ordering();
		test_every_triggered_op();
		test_every_deferred_op();
		test_cancel_flush();
		test_cancel_data_and_flush_keeps_triggered();
		test_deferred_failure();
		test_inject_scattered_operands();
		test_busy_counter();
		test_bad_arguments();
		test_receives();
		test_triggered_delivery_complete();
		test_chain();
		test_remote_event();
		if (autop)
			test_fires_while_the_target_sleeps();
		struct cmd c = { C_DONE, 0, 0, 0 };
		put(&c, sizeof(c));
	}
	/* Both wait for each other before closing. */
	char done = 'x';
	CHECK(write(wr, &done, 1) == 1 && read(rd, &done, 1) == 1);
	EXPECT(fi_close(&mr->fid), 0);
	EXPECT(fi_close(&rw->fid), 0);
	EXPECT(fi_close(&ep->fid), 0);
	EXPECT(fi_close(&cq->fid), 0);
	EXPECT(fi_close(&av->fid), 0);
	EXPECT(fi_close(&dom->fid), 0);
	EXPECT(fi_close(&fab->fid), 0);
	fi_freeinfo(fi);
	free(mem);
	if (rank == 1)
		_exit(0);
	int status;
	CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
	printf("fi_trigger: %d checks passed\n", checks);
	return 0;
}
