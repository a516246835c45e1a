/*
 * Collectives (fi_collective(3), fi_av_set(3)) through libfabric's C API
 * between N processes (fork; default 2). The ranks exchange their
 * addresses and meet at a barrier of their own in a shared anonymous
 * mapping made before the fork; each inserts every address in rank
 * order, so rank i is fi_addr i.
 *
 * Checked: fi_getinfo grants FI_COLLECTIVE when asked (and in tx_attr),
 * not by default; fi_query_collective (supported pairs with sizes and
 * limits, -FI_EOPNOTSUPP for logical ops, complex types, scatter and
 * gather, -FI_EINVAL for an unknown collective); AV sets: empty, by range
 * and stride, FI_UNIVERSE, insert, remove, union, intersect, diff, addr,
 * and their bad arguments (membership probed with remove); the order of
 * a set is the order of the group (an allgather over a reversed set);
 * fi_join_collective's bad arguments, then the join, FI_JOIN_COMPLETE
 * read from the EQ with the context and the mc fid, fi_mc_addr; every
 * collective (barrier, broadcast from every root, allreduce for every
 * supported op on 32- and 64-bit integers, 16-bit integers, float and
 * double, small and above the ring threshold, allgather, reduce_scatter,
 * alltoall, reduce to every root) against a serial reference, each
 * completion on the CQ with FI_COLLECTIVE and its context and the
 * counter bound with FI_SEND counted once; a second collective posted
 * before the first completed is -FI_EAGAIN until it did; bad arguments
 * of the calls (-FI_EOPNOTSUPP, -FI_EINVAL, -FI_EBADFLAGS, -FI_EMSGSIZE,
 * -FI_ENOSYS); completions of other operations that the join read from
 * the CQ given back; a second endpoint whose CQ (FI_CQ_FORMAT_CONTEXT,
 * read with fi_cq_sread) is bound with FI_SELECTIVE_COMPLETION: an entry
 * only for a call with FI_COMPLETION; a rank that leaves in the middle of
 * an allreduce: the others get an FI_EIO error entry (FI_COLLECTIVE, the
 * context) and the counter's error value within 10 s, and the group
 * refuses more with -FI_EIO; with FI_PROGRESS_AUTO, an allreduce whose
 * result is in place while every rank only sleeps; closes refused while
 * in use (-FI_EBUSY).
 *
 * Usage: fi_coll [ranks] [auto]  (auto: FI_PROGRESS_AUTO domains). Run by
 * fi/tests/coll.rs with FI_PROVIDER_PATH set. Prints "fi_coll: N checks
 * passed" and exits 0, or names the first failed check and exits 1.
 */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_collective.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"

#define MAXR 8
#define NA FI_ADDR_NOTAVAIL

/* Shared by the ranks (mapped before the fork). */
struct shared {
	int arrived, gen, flag, checks;
	size_t len;
	char addr[MAXR][64];
	char addr2[MAXR][64]; /* the second endpoints' (selective completion) */
};
static struct shared *sh;
static int nranks;

static struct fi_info *fi;
static struct fid_fabric *fab;
static struct fid_domain *dom;
static struct fid_av *av;
static struct fid_cq *cq;
static struct fid_eq *eq;
static struct fid_cntr *cntr;
static struct fid_ep *ep;
/* A second endpoint: its CQ (FI_CQ_FORMAT_CONTEXT) bound with
 * FI_SELECTIVE_COMPLETION, no counter. */
static struct fid_cq *cq2;
static struct fid_ep *ep2;
static struct fid_av_set *set;
static struct fid_mc *mc;
static fi_addr_t coll;
static uint64_t ncoll; /* collectives completed here: the counter's value */

/* All ranks meet (not a collective of the provider). */
static void sync_all(void)
{
	int g = __atomic_load_n(&sh->gen, __ATOMIC_ACQUIRE);
	if (__atomic_add_fetch(&sh->arrived, 1, __ATOMIC_ACQ_REL) == nranks) {
		__atomic_store_n(&sh->arrived, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&sh->gen, g + 1, __ATOMIC_RELEASE);
		return;
	}
	double t0 = now();
	while (__atomic_load_n(&sh->gen, __ATOMIC_ACQUIRE) == g) {
		usleep(100);
		CHECK(now() - t0 < 60);
	}
}

/* Waits (20 s at most) for the completion of the collective `ctx`. */
static void wait_coll(void *ctx)
{
	struct fi_cq_tagged_entry e;
	double t0 = now();
	for (;;) {
		ssize_t r = fi_cq_read(cq, &e, 1);
		if (r == 1) {
			CHECK(e.op_context == ctx);
			CHECK(e.flags & FI_COLLECTIVE);
			break;
		}
		if (r == -FI_EAVAIL) {
			struct fi_cq_err_entry ee = { 0 };
			CHECK(fi_cq_readerr(cq, &ee, 0) == 1);
			fprintf(stderr, "fi_coll (rank %d): error completion %d (%s)\n", rank, ee.err,
				fi_strerror(ee.err));
			CHECK(!"an error completion");
		}
		CHECK(r == -FI_EAGAIN);
		CHECK(now() - t0 < 20);
	}
	ncoll++;
	/* At least: a collective posted after this one may have completed
	 * too (checked equal where none is in flight). */
	if (fi_cntr_read(cntr) < ncoll)
		CHECK_FAIL_AT("counter %llu, want %llu\n", (unsigned long long)fi_cntr_read(cntr),
			      (unsigned long long)ncoll);
}

/* ---- element values ---- */

static size_t dt_size(enum fi_datatype dt)
{
	switch (dt) {
	case FI_INT8: case FI_UINT8: return 1;
	case FI_INT16: case FI_UINT16: return 2;
	case FI_INT32: case FI_UINT32: case FI_FLOAT: return 4;
	case FI_INT64: case FI_UINT64: case FI_DOUBLE: return 8;
	case FI_DOUBLE_COMPLEX: return 16;
	default: CHECK(!"a datatype of the test"); return 0;
	}
}

static int is_unsigned(enum fi_datatype dt)
{
	return dt == FI_UINT8 || dt == FI_UINT16 || dt == FI_UINT32 || dt == FI_UINT64;
}

/* Rank r's element k for op: small, exact in every type, negatives for
 * signed types (nonzero for products). */
static int64_t val(int r, size_t k, enum fi_op op, enum fi_datatype dt)
{
	int64_t v = (int64_t)((r * 7 + k * 3) % 11);
	if (op == FI_PROD)
		return (int64_t)((r + k) % 3) + 1;
	if (!is_unsigned(dt) && op != FI_BOR && op != FI_BAND && op != FI_BXOR)
		v -= 5;
	if (op == FI_BAND)
		v = (int64_t)(((r * 5 + k) % 7) | 0x30);
	return v;
}

static void put_el(void *p, size_t i, enum fi_datatype dt, int64_t v)
{
	switch (dt) {
	case FI_INT8: ((int8_t *)p)[i] = (int8_t)v; break;
	case FI_UINT8: ((uint8_t *)p)[i] = (uint8_t)v; break;
	case FI_INT16: ((int16_t *)p)[i] = (int16_t)v; break;
	case FI_UINT16: ((uint16_t *)p)[i] = (uint16_t)v; break;
	case FI_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
	case FI_UINT32: ((uint32_t *)p)[i] = (uint32_t)v; break;
	case FI_INT64: ((int64_t *)p)[i] = v; break;
	case FI_UINT64: ((uint64_t *)p)[i] = (uint64_t)v; break;
	case FI_FLOAT: ((float *)p)[i] = (float)v; break;
	case FI_DOUBLE: ((double *)p)[i] = (double)v; break;
	default: CHECK(!"a datatype of the test");
	}
}

static int64_t get_el(const void *p, size_t i, enum fi_datatype dt)
{
	switch (dt) {
	case FI_INT8: return ((const int8_t *)p)[i];
	case FI_UINT8: return ((const uint8_t *)p)[i];
	case FI_INT16: return ((const int16_t *)p)[i];
	case FI_UINT16: return ((const uint16_t *)p)[i];
	case FI_INT32: return ((const int32_t *)p)[i];
	case FI_UINT32: return ((const uint32_t *)p)[i];
	case FI_INT64: return ((const int64_t *)p)[i];
	case FI_UINT64: return (int64_t)((const uint64_t *)p)[i];
	case FI_FLOAT: return (int64_t)((const float *)p)[i];
	case FI_DOUBLE: return (int64_t)((const double *)p)[i];
	default: CHECK(!"a datatype of the test"); return 0;
	}
}

static int64_t apply(enum fi_op op, int64_t a, int64_t b)
{
	switch (op) {
	case FI_SUM: return a + b;
	case FI_PROD: return a * b;
	case FI_MIN: return a < b ? a : b;
	case FI_MAX: return a > b ? a : b;
	case FI_BOR: return a | b;
	case FI_BAND: return a & b;
	case FI_BXOR: return a ^ b;
	default: CHECK(!"an op of the test"); return 0;
	}
}

/* The reduction of element k over the ranks, serially. */
static int64_t ref(size_t k, enum fi_op op, enum fi_datatype dt)
{
	int64_t acc = val(0, k, op, dt);
	for (int r = 1; r < nranks; r++)
		acc = apply(op, acc, val(r, k, op, dt));
	return acc;
}

/* ---- setup ---- */

static void open_all(int autop)
{
	struct fi_info *h = fi_allocinfo(), *d;
	struct fi_av_attr aa = { .type = FI_AV_TABLE };
	struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_TAGGED, .wait_obj = FI_WAIT_UNSPEC };
	struct fi_eq_attr ea = { .wait_obj = FI_WAIT_UNSPEC };
	struct fi_cntr_attr na = { .events = FI_CNTR_EVENTS_COMP, .wait_obj = FI_WAIT_UNSPEC };

	CHECK(h);
	h->fabric_attr->prov_name = strdup("shmfab");
	h->ep_attr->type = FI_EP_RDM;
	h->caps = FI_MSG | FI_TAGGED | FI_COLLECTIVE;
	if (autop)
		h->domain_attr->data_progress = FI_PROGRESS_AUTO;
	EXPECT(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &fi), 0);
	CHECK(fi->caps & FI_COLLECTIVE);
	CHECK(fi->tx_attr->caps & FI_COLLECTIVE);
	/* Not offered by default. */
	h->caps = 0;
	EXPECT(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &d), 0);
	CHECK(!(d->caps & FI_COLLECTIVE));
	fi_freeinfo(d);
	fi_freeinfo(h);
	EXPECT(fi_fabric(fi->fabric_attr, &fab, NULL), 0);
	EXPECT(fi_domain(fab, fi, &dom, NULL), 0);
	EXPECT(fi_av_open(dom, &aa, &av, NULL), 0);
	EXPECT(fi_cq_open(dom, &ca, &cq, NULL), 0);
	EXPECT(fi_eq_open(fab, &ea, &eq, NULL), 0);
	EXPECT(fi_cntr_open(dom, &na, &cntr, NULL), 0);
	EXPECT(fi_endpoint(dom, fi, &ep, NULL), 0);
	EXPECT(fi_ep_bind(ep, &av->fid, 0), 0);
	EXPECT(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV), 0);
	EXPECT(fi_ep_bind(ep, &cntr->fid, FI_SEND), 0);
	EXPECT(fi_ep_bind(ep, &eq->fid, 0), 0);
	EXPECT(fi_enable(ep), 0);
	ca.format = FI_CQ_FORMAT_CONTEXT;
	EXPECT(fi_cq_open(dom, &ca, &cq2, NULL), 0);
	EXPECT(fi_endpoint(dom, fi, &ep2, NULL), 0);
	EXPECT(fi_ep_bind(ep2, &av->fid, 0), 0);
	EXPECT(fi_ep_bind(ep2, &cq2->fid, FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION), 0);
	EXPECT(fi_ep_bind(ep2, &eq->fid, 0), 0);
	EXPECT(fi_enable(ep2), 0);
	size_t len = sizeof(sh->addr[0]);
	EXPECT(fi_getname(&ep2->fid, sh->addr2[rank], &len), 0);
	len = sizeof(sh->addr[0]);
	EXPECT(fi_getname(&ep->fid, sh->addr[rank], &len), 0);
	sh->len = len;
	sync_all();
	for (int r = 0; r < nranks; r++) {
		fi_addr_t a;
		EXPECT(fi_av_insert(av, sh->addr[r], 1, &a, 0, NULL), 1);
		CHECK(a == (fi_addr_t)r);
	}
}

/* ---- query ---- */

static void test_query(void)
{
	struct fi_collective_attr a;

	memset(&a, 0, sizeof(a));
	a.op = FI_NOOP;
	a.datatype = FI_VOID;
	EXPECT(fi_query_collective(dom, FI_BARRIER, &a, 0), 0);
	CHECK(a.max_members >= (size_t)nranks);

	memset(&a, 0, sizeof(a));
	a.op = FI_SUM;
	a.datatype = FI_INT32;
	EXPECT(fi_query_collective(dom, FI_ALLREDUCE, &a, 0), 0);
	CHECK(a.datatype_attr.size == 4 && a.datatype_attr.count >= 1024);
	a.datatype = FI_DOUBLE;
	a.op = FI_MAX;
	EXPECT(fi_query_collective(dom, FI_REDUCE, &a, 0), 0);
	CHECK(a.datatype_attr.size == 8);
	a.op = FI_BXOR;
	a.datatype = FI_UINT16;
	EXPECT(fi_query_collective(dom, FI_REDUCE_SCATTER, &a, 0), 0);
	CHECK(a.datatype_attr.size == 2);
	a.datatype = FI_DOUBLE;
	EXPECT(fi_query_collective(dom, FI_ALLREDUCE, &a, 0), -FI_EOPNOTSUPP); /* bit op on a float */
	a.op = FI_LOR;
	a.datatype = FI_INT32;
	EXPECT(fi_query_collective(dom, FI_ALLREDUCE, &a, 0), -FI_EOPNOTSUPP);
	a.op = FI_SUM;
	a.datatype = FI_FLOAT_COMPLEX;
	EXPECT(fi_query_collective(dom, FI_ALLREDUCE, &a, 0), -FI_EOPNOTSUPP);
	a.op = FI_NOOP;
	a.datatype = FI_LONG_DOUBLE;
	EXPECT(fi_query_collective(dom, FI_BROADCAST, &a, 0), 0);
	CHECK(a.datatype_attr.size == 16);
	a.datatype = FI_VOID;
	EXPECT(fi_query_collective(dom, FI_ALLGATHER, &a, 0), -FI_EOPNOTSUPP);
	a.datatype = FI_INT8;
	EXPECT(fi_query_collective(dom, FI_ALLTOALL, &a, 0), 0);
	EXPECT(fi_query_collective(dom, FI_SCATTER, &a, 0), -FI_EOPNOTSUPP);
	EXPECT(fi_query_collective(dom, FI_GATHER, &a, 0), -FI_EOPNOTSUPP);
	EXPECT(fi_query_collective(dom, (enum fi_collective_op)99, &a, 0), -FI_EINVAL);
	EXPECT(fi_query_collective(dom, FI_BARRIER, NULL, 0), -FI_EINVAL);
	EXPECT(fi_query_collective(dom, FI_BARRIER, &a, 1), -FI_EBADFLAGS);
}

/* ---- AV sets ---- */

static struct fid_av_set *mkset(fi_addr_t start, fi_addr_t end, uint64_t stride, size_t count, uint64_t flags)
{
	struct fi_av_set_attr a = { .count = count, .start_addr = start, .end_addr = end, .stride = stride,
				    .flags = flags };
	struct fid_av_set *s;
	EXPECT(fi_av_set(av, &a, &s, NULL), 0);
	return s;
}

static int set_call(fi_addr_t start, fi_addr_t end, uint64_t stride, size_t count, uint64_t flags)
{
	struct fi_av_set_attr a = { .count = count, .start_addr = start, .end_addr = end, .stride = stride,
				    .flags = flags };
	struct fid_av_set *s = NULL;
	int r = fi_av_set(av, &a, &s, NULL);
	if (r == 0)
		EXPECT(fi_close(&s->fid), 0);
	return r;
}

/* Whether `a` is in `s` (removes it: probes scratch sets). */
static int has(struct fid_av_set *s, fi_addr_t a)
{
	int r = fi_av_set_remove(s, a);
	CHECK(r == 0 || r == -FI_EINVAL);
	return r == 0;
}

static void test_av_sets(void)
{
	int n = nranks;
	struct fid_av_set *s, *t;
	fi_addr_t ca = 0, cb = 0;

	/* Empty, then inserts. */
	s = mkset(NA, NA, 0, n, 0);
	for (int r = 0; r < n; r++)
		EXPECT(fi_av_set_insert(s, r), 0);
	EXPECT(fi_av_set_insert(s, 0), -FI_EINVAL);    /* already there */
	EXPECT(fi_av_set_insert(s, 1000), -FI_EINVAL); /* not in the AV */
	EXPECT(fi_av_set_remove(s, 1000), -FI_EINVAL);
	EXPECT(fi_av_set_addr(s, &ca), 0);
	EXPECT(fi_av_set_addr(s, NULL), -FI_EINVAL);
	for (int r = 0; r < n; r++)
		CHECK(has(s, r));
	CHECK(!has(s, 0));
	EXPECT(fi_close(&s->fid), 0);

	/* Range and stride: the even ranks; count bounds the range. */
	s = mkset(0, n - 1, 2, 0, 0);
	for (int r = 0; r < n; r++)
		CHECK(has(s, r) == (r % 2 == 0));
	EXPECT(fi_close(&s->fid), 0);
	s = mkset(0, n + 5, 1, n + 6, 0); /* addresses past the AV's are left out */
	for (int r = 0; r < n; r++)
		CHECK(has(s, r));
	CHECK(!has(s, n));
	EXPECT(fi_close(&s->fid), 0);
	EXPECT(set_call(0, n - 1, 1, 1, 0), -FI_EINVAL);  /* more than count */
	EXPECT(set_call(0, n - 1, 0, 0, 0), -FI_EINVAL);  /* no stride */
	EXPECT(set_call(1, 0, 1, 0, 0), -FI_EINVAL);      /* end before start */
	EXPECT(set_call(NA, 0, 0, 0, 0), -FI_EINVAL);     /* half a range */
	EXPECT(set_call(NA, NA, 1, 0, 0), -FI_EINVAL);    /* a stride without a range */
	EXPECT(set_call(NA, NA, 0, 0, 1ULL << 3), -FI_EBADFLAGS);
	EXPECT(set_call(NA, NA, 0, 0, FI_SCATTER_SET), -FI_EOPNOTSUPP);
	EXPECT(set_call(NA, NA, 0, 0, FI_ALLREDUCE_SET | FI_BARRIER_SET), 0);
	EXPECT(set_call(0, 0, 1, 0, FI_UNIVERSE), -FI_EINVAL);
	{
		uint8_t key[4] = { 1, 2, 3, 4 };
		struct fi_av_set_attr a = { .start_addr = NA, .end_addr = NA, .comm_key_size = 4, .comm_key = key };
		EXPECT(fi_av_set(av, &a, &s, NULL), -FI_EOPNOTSUPP);
	}
	EXPECT(fi_av_set(av, NULL, &s, NULL), -FI_EINVAL);

	/* FI_UNIVERSE: every address. */
	s = mkset(NA, NA, 0, 0, FI_UNIVERSE);
	for (int r = 0; r < n; r++)
		CHECK(has(s, r));
	EXPECT(fi_close(&s->fid), 0);

	/* Union, intersect, diff. */
	s = mkset(NA, NA, 0, 0, 0);
	t = mkset(NA, NA, 0, 0, 0);
	EXPECT(fi_av_set_insert(s, 0), 0);
	EXPECT(fi_av_set_insert(t, 1), 0);
	EXPECT(fi_av_set_insert(t, 0), 0);
	EXPECT(fi_av_set_union(s, t), 0);
	EXPECT(fi_av_set_union(s, s), 0);
	CHECK(has(s, 1) && has(s, 0) && !has(s, 0));
	EXPECT(fi_close(&s->fid), 0);
	s = mkset(NA, NA, 0, 0, FI_UNIVERSE);
	EXPECT(fi_av_set_remove(t, 0), 0); /* t = {1} */
	EXPECT(fi_av_set_intersect(s, t), 0);
	CHECK(!has(s, 0) && has(s, 1));
	EXPECT(fi_close(&s->fid), 0);
	s = mkset(NA, NA, 0, 0, FI_UNIVERSE);
	EXPECT(fi_av_set_diff(s, t), 0);
	CHECK(has(s, 0) && !has(s, 1));
	EXPECT(fi_av_set_diff(t, t), 0);
	CHECK(!has(t, 1));
	EXPECT(fi_av_set_addr(t, &cb), 0);
	CHECK(ca != cb);
	EXPECT(fi_close(&s->fid), 0);
	EXPECT(fi_close(&t->fid), 0);
}

/* ---- join ---- */

static void test_join(void)
{
	static int jctx;
	struct fid_mc *m = NULL;
	struct fi_collective_addr addr;
	uint32_t event;
	struct fi_eq_entry ent;

	set = mkset(0, nranks - 1, 1, nranks, 0);
	EXPECT(fi_av_set_addr(set, &coll), 0);
	/* Bad arguments (nothing is exchanged). */
	EXPECT(fi_join_collective(ep, coll, set, 0, NULL, &jctx), -FI_EINVAL);
	EXPECT(fi_join_collective(ep, 12345, set, 0, &m, &jctx), -FI_EINVAL);
	EXPECT(fi_join_collective(ep, coll, NULL, 0, &m, &jctx), -FI_EINVAL);
	EXPECT(fi_join_collective(ep, coll, set, FI_TAGGED, &m, &jctx), -FI_EBADFLAGS);
	addr.set = set;
	addr.coll_addr = coll;
	EXPECT(fi_join(ep, &addr, 0, &m, &jctx), -FI_ENOSYS); /* multicast */
	{
		/* A set without this endpoint. */
		struct fid_av_set *o = mkset(NA, NA, 0, 0, 0);
		fi_addr_t oa;
		EXPECT(fi_av_set_insert(o, (rank + 1) % nranks), 0);
		EXPECT(fi_av_set_addr(o, &oa), 0);
		EXPECT(fi_join_collective(ep, oa, o, 0, &m, &jctx), -FI_EINVAL);
		EXPECT(fi_close(&o->fid), 0);
	}
	CHECK(fi_eq_read(eq, &event, &ent, sizeof(ent), 0) == -FI_EAGAIN);

	/* Every rank joins; rank 0 late, with a receive posted that rank 1
	 * matches before it joins: the join reads that completion from the
	 * CQ (as it reads its key exchange) and gives it back. */
	static int rctx;
	uint64_t word = 0, w1 = 0x1234;
	if (rank == 0)
		EXPECT(fi_trecv(ep, &word, 8, NULL, FI_ADDR_UNSPEC, 0x77, 0, &rctx), 0);
	sync_all();
	if (rank == 1) {
		EXPECT(fi_tinject(ep, &w1, 8, 0, 0x77), 0);
		ncoll++; /* a send: counted by the FI_SEND counter */
	}
	if (rank == 0)
		usleep(100000);
	EXPECT(fi_join_collective(ep, coll, set, 0, &mc, &jctx), 0);
	if (rank == 0) {
		struct fi_cq_tagged_entry e;
		double t0 = now();
		ssize_t r;
		while ((r = fi_cq_read(cq, &e, 1)) == -FI_EAGAIN)
			CHECK(now() - t0 < 10);
		EXPECT(r, 1);
		CHECK(e.op_context == &rctx && e.tag == 0x77 && e.len == 8 && (e.flags & FI_RECV));
		CHECK(word == 0x1234);
	}
	/* The join completed before returning: the event is there. */
	CHECK(fi_eq_read(eq, &event, &ent, sizeof(ent), 0) == sizeof(ent));
	CHECK(event == FI_JOIN_COMPLETE);
	CHECK(ent.fid == &mc->fid);
	CHECK(ent.context == &jctx);
	CHECK(fi_mc_addr(mc) != coll && fi_mc_addr(mc) != NA);
	/* The join's key exchange sent a message to each other member, which
	 * count on the FI_SEND counter. */
	ncoll += nranks - 1;
	CHECK(fi_cntr_read(cntr) == ncoll);
	coll = fi_mc_addr(mc);
}

/* ---- collectives ---- */

static void test_barrier(void)
{
	static int ctx;
	for (int round = 0; round < 3; round++) {
		if (rank == round % nranks) {
			usleep(50000);
			__atomic_store_n(&sh->flag, round + 1, __ATOMIC_RELEASE);
		}
		EXPECT(fi_barrier(ep, coll, &ctx), 0);
		wait_coll(&ctx);
		/* Nobody leaves before the late rank entered. */
		CHECK(__atomic_load_n(&sh->flag, __ATOMIC_ACQUIRE) == round + 1);
		sync_all();
	}
	/* Two back to back: the second is -FI_EAGAIN until the first completed. */
	static int c1, c2;
	EXPECT(fi_barrier(ep, coll, &c1), 0);
	double t0 = now();
	ssize_t r;
	int again = 0;
	while ((r = fi_barrier(ep, coll, &c2)) == -FI_EAGAIN) {
		again++;
		CHECK(now() - t0 < 20);
		usleep(100);
	}
	EXPECT(r, 0);
	(void)again;
	wait_coll(&c1);
	wait_coll(&c2);
	CHECK(fi_cntr_read(cntr) == ncoll);
}

static void test_allreduce(void)
{
	static const enum fi_datatype dts[] = { FI_INT16, FI_INT32, FI_UINT32, FI_INT64, FI_UINT64, FI_FLOAT,
						FI_DOUBLE };
	static const enum fi_op ops[] = { FI_SUM, FI_PROD, FI_MIN, FI_MAX, FI_BOR, FI_BAND, FI_BXOR };
	static const size_t counts[] = { 1, 13 };
	static int ctx;
	char *in = malloc(65536), *out = malloc(65536);
	CHECK(in && out);
	for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++) {
		enum fi_datatype dt = dts[d];
		for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++) {
			enum fi_op op = ops[o];
			int bit = op == FI_BOR || op == FI_BAND || op == FI_BXOR;
			if (bit && (dt == FI_FLOAT || dt == FI_DOUBLE)) {
				EXPECT(fi_allreduce(ep, in, 1, NULL, out, NULL, coll, dt, op, 0, &ctx),
				       -FI_EOPNOTSUPP);
				continue;
			}
			for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
				size_t n = counts[c];
				for (size_t k = 0; k < n; k++)
					put_el(in, k, dt, val(rank, k, op, dt));
				memset(out, 0xee, n * dt_size(dt));
				EXPECT(fi_allreduce(ep, in, n, NULL, out, NULL, coll, dt, op, 0, &ctx), 0);
				wait_coll(&ctx);
				for (size_t k = 0; k < n; k++) {
					int64_t want = ref(k, op, dt), got = get_el(out, k, dt);
					if (dt == FI_INT16)
						want = (int16_t)want;
					else if (dt == FI_INT32)
						want = (int32_t)want;
					else if (dt == FI_UINT32)
						want = (uint32_t)want;
					if (got != want)
						CHECK_FAIL_AT("allreduce dt %d op %d count %zu [%zu]: %lld, want %lld\n",
							      dt, op, n, k, (long long)got, (long long)want);
					checks++;
				}
			}
		}
	}
	/* Above the ring threshold (32 KiB): 6000 int64 and doubles. */
	for (int d = 0; d < 2; d++) {
		enum fi_datatype dt = d ? FI_DOUBLE : FI_INT64;
		size_t n = 6000;
		for (size_t k = 0; k < n; k++)
			put_el(in, k, dt, val(rank, k, FI_SUM, dt));
		EXPECT(fi_allreduce(ep, in, n, NULL, out, NULL, coll, dt, FI_SUM, 0, &ctx), 0);
		wait_coll(&ctx);
		for (size_t k = 0; k < n; k++)
			if (get_el(out, k, dt) != ref(k, FI_SUM, dt))
				CHECK_FAIL_AT("ring allreduce [%zu]\n", k);
		checks++;
	}
	free(in);
	free(out);
}

static void test_broadcast(void)
{
	static int ctx;
	for (int root = 0; root < nranks; root++) {
		int32_t b[10];
		for (int k = 0; k < 10; k++)
			b[k] = rank == root ? root * 1000 + k : -1;
		EXPECT(fi_broadcast(ep, b, 10, NULL, coll, root, FI_INT32, 0, &ctx), 0);
		wait_coll(&ctx);
		for (int k = 0; k < 10; k++)
			CHECK(b[k] == root * 1000 + k);
		/* 16-byte elements. */
		double z[6];
		for (int k = 0; k < 6; k++)
			z[k] = rank == root ? root + k * 0.5 : -1;
		EXPECT(fi_broadcast(ep, z, 3, NULL, coll, root, FI_DOUBLE_COMPLEX, 0, &ctx), 0);
		wait_coll(&ctx);
		for (int k = 0; k < 6; k++)
			CHECK(z[k] == root + k * 0.5);
	}
}

static void test_allgather(void)
{
	static int ctx;
	uint8_t s[5], r[5 * MAXR];
	for (int k = 0; k < 5; k++)
		s[k] = (uint8_t)(rank * 10 + k);
	memset(r, 0xff, sizeof(r));
	EXPECT(fi_allgather(ep, s, 5, NULL, r, NULL, coll, FI_UINT8, 0, &ctx), 0);
	wait_coll(&ctx);
	for (int j = 0; j < nranks; j++)
		for (int k = 0; k < 5; k++)
			CHECK(r[j * 5 + k] == j * 10 + k);
	int64_t s2[3], r2[3 * MAXR];
	for (int k = 0; k < 3; k++)
		s2[k] = -(int64_t)rank * 100 - k;
	EXPECT(fi_allgather(ep, s2, 3, NULL, r2, NULL, coll, FI_INT64, 0, &ctx), 0);
	wait_coll(&ctx);
	for (int j = 0; j < nranks; j++)
		for (int k = 0; k < 3; k++)
			CHECK(r2[j * 3 + k] == -(int64_t)j * 100 - k);
}

static void test_reduce_scatter(void)
{
	static int ctx;
	int32_t s[3 * MAXR], r[3];
	size_t n = 3 * (size_t)nranks;
	for (size_t k = 0; k < n; k++)
		s[k] = (int32_t)val(rank, k, FI_SUM, FI_INT32);
	EXPECT(fi_reduce_scatter(ep, s, n, NULL, r, NULL, coll, FI_INT32, FI_SUM, 0, &ctx), 0);
	wait_coll(&ctx);
	for (int k = 0; k < 3; k++)
		CHECK(r[k] == ref((size_t)rank * 3 + k, FI_SUM, FI_INT32));
	double sd[3 * MAXR], rd[3];
	for (size_t k = 0; k < n; k++)
		sd[k] = (double)val(rank, k, FI_MAX, FI_DOUBLE);
	EXPECT(fi_reduce_scatter(ep, sd, n, NULL, rd, NULL, coll, FI_DOUBLE, FI_MAX, 0, &ctx), 0);
	wait_coll(&ctx);
	for (int k = 0; k < 3; k++)
		CHECK(rd[k] == (double)ref((size_t)rank * 3 + k, FI_MAX, FI_DOUBLE));
}

static void test_alltoall(void)
{
	static int ctx;
	int32_t s[2 * MAXR], r[2 * MAXR];
	size_t n = 2 * (size_t)nranks;
	for (int j = 0; j < nranks; j++)
		for (int x = 0; x < 2; x++)
			s[j * 2 + x] = rank * 100 + j * 10 + x;
	memset(r, 0xff, sizeof(r));
	EXPECT(fi_alltoall(ep, s, n, NULL, r, NULL, coll, FI_INT32, 0, &ctx), 0);
	wait_coll(&ctx);
	for (int j = 0; j < nranks; j++)
		for (int x = 0; x < 2; x++)
			CHECK(r[j * 2 + x] == j * 100 + rank * 10 + x);
}

static void test_reduce(void)
{
	static int ctx;
	for (int root = 0; root < nranks; root++) {
		int64_t s[4], r[4] = { 0 };
		for (int k = 0; k < 4; k++)
			s[k] = val(rank, k, FI_SUM, FI_INT64) + root;
		EXPECT(fi_reduce(ep, s, 4, NULL, rank == root ? r : NULL, NULL, coll, root, FI_INT64, FI_SUM, 0,
				 &ctx),
		       0);
		wait_coll(&ctx);
		for (int k = 0; k < 4; k++)
			CHECK(r[k] == (rank == root ? ref(k, FI_SUM, FI_INT64) + root * nranks : 0));
	}
}

/* A group whose set lists the ranks in reverse: its ranks are reversed. */
static void test_set_order(void)
{
	static int jctx, ctx;
	struct fid_av_set *rs = mkset(NA, NA, 0, 0, 0);
	struct fid_mc *rm;
	fi_addr_t ra;
	uint32_t event;
	struct fi_eq_entry ent;
	for (int r = nranks - 1; r >= 0; r--)
		EXPECT(fi_av_set_insert(rs, r), 0);
	EXPECT(fi_av_set_addr(rs, &ra), 0);
	/* FI_ADDR_NOTAVAIL as the collective address: the set says it all. */
	EXPECT(fi_join_collective(ep, NA, rs, 0, &rm, &jctx), 0);
	CHECK(fi_eq_read(eq, &event, &ent, sizeof(ent), 0) == sizeof(ent));
	CHECK(event == FI_JOIN_COMPLETE && ent.fid == &rm->fid && ent.context == &jctx);
	ncoll += nranks - 1;
	int32_t s = rank, r[MAXR];
	EXPECT(fi_allgather(ep, &s, 1, NULL, r, NULL, fi_mc_addr(rm), FI_INT32, 0, &ctx), 0);
	wait_coll(&ctx);
	for (int j = 0; j < nranks; j++)
		CHECK(r[j] == nranks - 1 - j);
	/* A closed group's address, and a set's, name no group. */
	fi_addr_t gone = fi_mc_addr(rm);
	EXPECT(fi_close(&rm->fid), 0);
	EXPECT(fi_barrier(ep, gone, &ctx), -FI_EINVAL);
	EXPECT(fi_barrier(ep, ra, &ctx), -FI_EINVAL);
	EXPECT(fi_close(&rs->fid), 0);
}

/* The second endpoints' group: FI_SELECTIVE_COMPLETION (an entry only
 * with FI_COMPLETION), FI_CQ_FORMAT_CONTEXT entries, fi_cq_sread. */
static void test_selective(void)
{
	static int jctx, c1, c2;
	struct fid_av_set *s2 = mkset(NA, NA, 0, 0, 0);
	struct fid_mc *m2;
	fi_addr_t a2;
	uint32_t event;
	struct fi_eq_entry ent;
	struct fi_cq_entry ce;
	for (int r = 0; r < nranks; r++) {
		fi_addr_t a;
		EXPECT(fi_av_insert(av, sh->addr2[r], 1, &a, 0, NULL), 1);
		CHECK(a == (fi_addr_t)(nranks + r));
		EXPECT(fi_av_set_insert(s2, a), 0);
	}
	EXPECT(fi_av_set_addr(s2, &a2), 0);
	EXPECT(fi_join_collective(ep2, a2, s2, 0, &m2, &jctx), 0);
	CHECK(fi_eq_read(eq, &event, &ent, sizeof(ent), 0) == sizeof(ent));
	CHECK(event == FI_JOIN_COMPLETE && ent.fid == &m2->fid && ent.context == &jctx);
	/* The first group is not ep2's. */
	EXPECT(fi_barrier(ep2, coll, &c1), -FI_EINVAL);
	int64_t in[5], out[5];
	for (int k = 0; k < 5; k++)
		in[k] = val(rank, k, FI_MAX, FI_INT64);
	EXPECT(fi_allreduce(ep2, in, 5, NULL, out, NULL, fi_mc_addr(m2), FI_INT64, FI_MAX, 0, &c1), 0);
	/* The next is -FI_EAGAIN until the allreduce completed, which makes
	 * no entry. */
	double t0 = now();
	ssize_t r;
	while ((r = fi_barrier2(ep2, fi_mc_addr(m2), FI_COMPLETION, &c2)) == -FI_EAGAIN) {
		EXPECT(fi_cq_read(cq2, &ce, 1), -FI_EAGAIN);
		CHECK(now() - t0 < 20);
	}
	EXPECT(r, 0);
	for (int k = 0; k < 5; k++)
		CHECK(out[k] == ref(k, FI_MAX, FI_INT64));
	CHECK(fi_cq_sread(cq2, &ce, 1, NULL, 10000) == 1);
	CHECK(ce.op_context == &c2);
	EXPECT(fi_cq_read(cq2, &ce, 1), -FI_EAGAIN);
	sync_all();
	EXPECT(fi_close(&m2->fid), 0);
	EXPECT(fi_close(&s2->fid), 0);
}

/* The last rank leaves without a word while the others are in an
 * allreduce: they get an FI_EIO error entry in bounded time, the
 * counter's error value, and the group refuses more. */
static void test_member_dies(void)
{
	static int ctx;
	int64_t in = rank, out;
	sync_all();
	if (rank == nranks - 1) {
		__atomic_add_fetch(&sh->checks, checks, __ATOMIC_RELAXED);
		_exit(0);
	}
	EXPECT(fi_allreduce(ep, &in, 1, NULL, &out, NULL, coll, FI_INT64, FI_SUM, 0, &ctx), 0);
	struct fi_cq_tagged_entry e;
	double t0 = now();
	ssize_t r;
	while ((r = fi_cq_read(cq, &e, 1)) == -FI_EAGAIN) {
		CHECK(now() - t0 < 10);
		usleep(1000);
	}
	EXPECT(r, -FI_EAVAIL);
	struct fi_cq_err_entry ee = { 0 };
	CHECK(fi_cq_readerr(cq, &ee, 0) == 1);
	CHECK(ee.err == FI_EIO && ee.op_context == &ctx && (ee.flags & FI_COLLECTIVE));
	CHECK(fi_cntr_readerr(cntr) == 1);
	CHECK(fi_cntr_read(cntr) == ncoll);
	EXPECT(fi_barrier(ep, coll, &ctx), -FI_EIO);
	EXPECT(fi_cq_read(cq, &e, 1), -FI_EAGAIN);
}

/* FI_PROGRESS_AUTO: an allreduce completes while every rank only sleeps
 * (no call at all): the result is in place before the CQ is read. */
static void test_completes_while_sleeping(void)
{
	static int ctx;
	int64_t in[64], out[64];
	for (int k = 0; k < 64; k++) {
		in[k] = val(rank, k, FI_SUM, FI_INT64);
		out[k] = -999;
	}
	EXPECT(fi_allreduce(ep, in, 64, NULL, out, NULL, coll, FI_INT64, FI_SUM, 0, &ctx), 0);
	int done = 0;
	for (int t = 0; t < 400 && !done; t++) {
		usleep(5000);
		done = 1;
		for (int k = 0; k < 64; k++)
			if (__atomic_load_n(&out[k], __ATOMIC_ACQUIRE) != ref(k, FI_SUM, FI_INT64))
				done = 0;
	}
	CHECK(done);
	wait_coll(&ctx);
}

static void test_bad_calls(void)
{
	static int ctx;
	int64_t b[8] = { 0 }, r[8 * MAXR];
	EXPECT(fi_allreduce(ep, b, 1, NULL, r, NULL, coll, FI_INT32, FI_LOR, 0, &ctx), -FI_EOPNOTSUPP);
	EXPECT(fi_allreduce(ep, b, 1, NULL, r, NULL, coll, FI_FLOAT_COMPLEX, FI_SUM, 0, &ctx), -FI_EOPNOTSUPP);
	EXPECT(fi_allreduce(ep, b, 1, NULL, r, NULL, coll, FI_INT32, FI_ATOMIC_WRITE, 0, &ctx), -FI_EOPNOTSUPP);
	EXPECT(fi_allreduce(ep, b, 1, NULL, r, NULL, coll, FI_VOID, FI_SUM, 0, &ctx), -FI_EINVAL);
	EXPECT(fi_allreduce(ep, b, 1, NULL, r, NULL, 77, FI_INT32, FI_SUM, 0, &ctx), -FI_EINVAL);
	EXPECT(fi_allreduce(ep, b, 0, NULL, r, NULL, coll, FI_INT32, FI_SUM, 0, &ctx), -FI_EINVAL);
	EXPECT(fi_allreduce(ep, NULL, 1, NULL, r, NULL, coll, FI_INT32, FI_SUM, 0, &ctx), -FI_EINVAL);
	EXPECT(fi_allreduce(ep, b, 1, NULL, NULL, NULL, coll, FI_INT32, FI_SUM, 0, &ctx), -FI_EINVAL);
	EXPECT(fi_allreduce(ep, b, 1, NULL, r, NULL, coll, FI_INT32, FI_SUM, FI_TAGGED, &ctx), -FI_EBADFLAGS);
	EXPECT(fi_broadcast(ep, b, 1, NULL, coll, 999, FI_INT32, 0, &ctx), -FI_EINVAL);
	EXPECT(fi_reduce(ep, b, 1, NULL, r, NULL, coll, 999, FI_INT32, FI_SUM, 0, &ctx), -FI_EINVAL);
	if (nranks > 1) {
		EXPECT(fi_alltoall(ep, b, nranks + 1, NULL, r, NULL, coll, FI_INT8, 0, &ctx), -FI_EINVAL);
		EXPECT(fi_reduce_scatter(ep, b, nranks + 1, NULL, r, NULL, coll, FI_INT8, FI_SUM, 0, &ctx),
		       -FI_EINVAL);
	}
	EXPECT(fi_scatter(ep, b, 1, NULL, r, NULL, coll, 0, FI_INT32, 0, &ctx), -FI_ENOSYS);
	EXPECT(fi_gather(ep, b, 1, NULL, r, NULL, coll, 0, FI_INT32, 0, &ctx), -FI_ENOSYS);
	/* More than the slots hold. */
	size_t big = 1 << 20;
	int64_t *bb = calloc(big, 8), *br = calloc(big, 8);
	CHECK(bb && br);
	EXPECT(fi_allreduce(ep, bb, big, NULL, br, NULL, coll, FI_INT64, FI_SUM, 0, &ctx), -FI_EMSGSIZE);
	free(bb);
	free(br);
	/* Nothing was posted: no completion, the counter unchanged. */
	struct fi_cq_tagged_entry e;
	EXPECT(fi_cq_read(cq, &e, 1), -FI_EAGAIN);
	CHECK(fi_cntr_read(cntr) == ncoll);
	/* The group still works. */
	EXPECT(fi_barrier(ep, coll, &ctx), 0);
	wait_coll(&ctx);
}

int main(int argc, char **argv)
{
	int autop = 0;
	nranks = 2;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "auto"))
			autop = 1;
		else
			nranks = atoi(argv[i]);
	}
	CHECK(nranks >= 2 && nranks <= MAXR);
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(sh != MAP_FAILED);
	memset(sh, 0, sizeof(*sh));
	pid_t pids[MAXR];
	for (int r = 0; r < nranks; r++) {
		pids[r] = fork();
		CHECK(pids[r] >= 0);
		if (pids[r] == 0) {
			rank = r;
			break;
		}
	}
	if (rank < 0) {
		int ok = 1;
		/* Any child first: a rank that left early is reaped at once
		 * (the others see it gone, not a zombie). */
		for (int r = 0; r < nranks; r++) {
			int status;
			CHECK(waitpid(-1, &status, 0) > 0);
			if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
				ok = 0;
		}
		CHECK(ok);
		printf("fi_coll (%d ranks%s): %d checks passed\n", nranks, autop ? ", auto progress" : "",
		       sh->checks);
		return 0;
	}

	open_all(autop);
	test_query();
	test_av_sets();
	test_join();
	sync_all();
	test_barrier();
	test_allreduce();
	test_broadcast();
	test_allgather();
	test_reduce_scatter();
	test_alltoall();
	test_reduce();
	if (autop)
		test_completes_while_sleeping();
	test_bad_calls();
	test_set_order();
	test_selective();
	test_member_dies();

	/* Closes refused while in use. */
	EXPECT(fi_close(&ep->fid), -FI_EBUSY); /* a group is open */
	EXPECT(fi_close(&av->fid), -FI_EBUSY); /* a set is open */
	EXPECT(fi_close(&mc->fid), 0);
	EXPECT(fi_close(&set->fid), 0);
	EXPECT(fi_close(&eq->fid), -FI_EBUSY); /* bound to the endpoints */
	EXPECT(fi_close(&ep->fid), 0);
	EXPECT(fi_close(&ep2->fid), 0);
	EXPECT(fi_close(&cq2->fid), 0);
	EXPECT(fi_close(&eq->fid), 0);
	EXPECT(fi_close(&cntr->fid), 0);
	EXPECT(fi_close(&cq->fid), 0);
	EXPECT(fi_close(&av->fid), 0);
	EXPECT(fi_close(&dom->fid), 0);
	EXPECT(fi_close(&fab->fid), 0);
	fi_freeinfo(fi);
	__atomic_add_fetch(&sh->checks, checks, __ATOMIC_RELAXED);
	_exit(0);
}
