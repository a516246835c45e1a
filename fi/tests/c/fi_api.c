/*
 * The provider through libfabric's C API, as a client sees it: hints,
 * the objects and their calls, and the error codes the man pages give;
 * then two processes (fork) exchange tagged messages of 1 B to 4 MiB.
 * Built and run by fi/tests/c_api.rs (FI_PROVIDER_PATH set to the
 * provider); prints "fi_api: N checks passed" and exits 0, or names the
 * first failed check and exits 1.
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
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "check.h"

static struct fi_info *hints(void)
{
	struct fi_info *h = fi_allocinfo();
	CHECK(h);
	h->fabric_attr->prov_name = strdup("shmfab");
	h->ep_attr->type = FI_EP_RDM;
	h->caps = FI_MSG | FI_TAGGED;
	return h;
}

/* fi_getinfo with hints `h` (freed): 0 or the error, info in *out. */
static int getinfo(struct fi_info *h, struct fi_info **out)
{
	struct fi_info *i = NULL;
	int r = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &i);
	fi_freeinfo(h);
	if (out)
		*out = i;
	else if (i)
		fi_freeinfo(i);
	return r;
}

static void test_hints(void)
{
	struct fi_info *h, *i;

	h = hints();
	h->caps |= FI_DIRECTED_RECV | FI_SOURCE | FI_MULTI_RECV;
	h->mode = FI_CONTEXT | FI_CONTEXT2;
	h->domain_attr->av_type = FI_AV_MAP;
	h->domain_attr->threading = FI_THREAD_DOMAIN;
	h->domain_attr->cq_data_size = 8;
	h->tx_attr->inject_size = 4096;
	h->tx_attr->iov_limit = 4;
	EXPECT(getinfo(h, &i), 0);
	CHECK(i && !i->next);
	CHECK(!strcmp(i->fabric_attr->prov_name, "shmfab"));
	CHECK((i->caps & (FI_TAGGED | FI_DIRECTED_RECV | FI_SOURCE)) ==
	      (FI_TAGGED | FI_DIRECTED_RECV | FI_SOURCE));
	CHECK(i->mode == 0); /* no mode bit required */
	CHECK(i->domain_attr->av_type == FI_AV_MAP);
	CHECK(i->domain_attr->threading == FI_THREAD_DOMAIN);
	CHECK(i->tx_attr->inject_size == 4096);
	CHECK(i->addr_format == FI_FORMAT_UNSPEC);
	CHECK(i->ep_attr->mem_tag_format >> 63); /* 64 tag bits, none asked */
	fi_freeinfo(i);
	h = hints();
	h->ep_attr->mem_tag_format = 0xffff;
	EXPECT(getinfo(h, &i), 0);
	CHECK(i->ep_attr->mem_tag_format == 0xffff);
	fi_freeinfo(i);

	/* max_err_data: what fi_cq_readerr may return at most; hints asking
	 * for more are refused. */
	h = hints();
	EXPECT(getinfo(h, &i), 0);
	size_t max_err = i->domain_attr->max_err_data;
	CHECK(max_err > 0);
	fi_freeinfo(i);
	h = hints();
	h->domain_attr->max_err_data = max_err;
	EXPECT(getinfo(h, NULL), 0);
	h = hints();
	h->domain_attr->max_err_data = max_err + 1;
	EXPECT(getinfo(h, NULL), -FI_ENODATA);

	h = hints();
	h->caps |= FI_RMA;
	EXPECT(getinfo(h, NULL), -FI_ENODATA);
	h = hints();
	h->caps |= FI_ATOMIC;
	EXPECT(getinfo(h, NULL), -FI_ENODATA);
	h = hints();
	h->ep_attr->type = FI_EP_MSG;
	EXPECT(getinfo(h, NULL), -FI_ENODATA);
	h = hints();
	h->tx_attr->inject_size = 8192;
	EXPECT(getinfo(h, NULL), -FI_ENODATA);
	h = hints();
	h->tx_attr->iov_limit = 5;
	EXPECT(getinfo(h, NULL), -FI_ENODATA);
	h = hints();
	h->domain_attr->cq_data_size = 16;
	EXPECT(getinfo(h, NULL), -FI_ENODATA);
	h = hints();
	h->domain_attr->max_ep_srx_ctx = 2; /* one per endpoint */
	EXPECT(getinfo(h, NULL), -FI_ENODATA);
	h = hints();
	h->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
	EXPECT(getinfo(h, &i), 0);
	CHECK(i->tx_attr->op_flags == FI_DELIVERY_COMPLETE);
	fi_freeinfo(i);
	/* Orders involving sends before RMA do not hold (sends go through
	 * rings, RMA lands at once): refused. */
	h = hints();
	h->tx_attr->msg_order = FI_ORDER_RAS;
	EXPECT(getinfo(h, NULL), -FI_ENODATA);
	h = hints();
	h->rx_attr->msg_order = FI_ORDER_WAS;
	EXPECT(getinfo(h, NULL), -FI_ENODATA);
	/* Those of RMA and atomics among themselves and sends after them
	 * hold (each RMA or atomic call is done when it returns), at any
	 * size. */
	h = hints();
	h->caps |= FI_RMA | FI_ATOMIC;
	h->domain_attr->mr_mode = FI_MR_PROV_KEY;
	h->tx_attr->msg_order = FI_ORDER_SAS | FI_ORDER_SAW | FI_ORDER_SAR | FI_ORDER_RAW | FI_ORDER_WAR |
				FI_ORDER_WAW | FI_ORDER_RAR | FI_ORDER_RMA_RAW | FI_ORDER_ATOMIC_WAW;
	h->rx_attr->msg_order = FI_ORDER_SAW | FI_ORDER_RAW;
	h->ep_attr->max_order_raw_size = SIZE_MAX;
	h->ep_attr->max_order_waw_size = 1 << 20;
	EXPECT(getinfo(h, &i), 0);
	CHECK((i->tx_attr->msg_order & (FI_ORDER_SAW | FI_ORDER_SAR | FI_ORDER_RAW | FI_ORDER_WAR | FI_ORDER_WAW)) ==
	      (FI_ORDER_SAW | FI_ORDER_SAR | FI_ORDER_RAW | FI_ORDER_WAR | FI_ORDER_WAW));
	CHECK(!(i->tx_attr->msg_order & (FI_ORDER_RAS | FI_ORDER_WAS)));
	CHECK(i->ep_attr->max_order_raw_size == SIZE_MAX && i->ep_attr->max_order_war_size == SIZE_MAX &&
	      i->ep_attr->max_order_waw_size == SIZE_MAX);
	fi_freeinfo(i);
	/* mr_cnt: provider keys are the library's registrations, 1024 of
	 * them; the application's keys have no such limit. */
	h = hints();
	h->domain_attr->mr_mode = FI_MR_PROV_KEY;
	EXPECT(getinfo(h, &i), 0);
	size_t mr_cnt = i->domain_attr->mr_cnt;
	fi_freeinfo(i);
	h = hints();
	h->domain_attr->mr_mode = FI_MR_PROV_KEY;
	h->domain_attr->mr_cnt = mr_cnt;
	EXPECT(getinfo(h, NULL), 0);
	h = hints();
	h->domain_attr->mr_mode = FI_MR_PROV_KEY;
	h->domain_attr->mr_cnt = mr_cnt + 1;
	EXPECT(getinfo(h, NULL), -FI_ENODATA);
	h = hints();
	h->domain_attr->mr_cnt = mr_cnt + 1;
	EXPECT(getinfo(h, NULL), 0);
	h = hints();
	h->ep_attr->max_msg_size = (size_t)1 << 41;
	EXPECT(getinfo(h, NULL), -FI_ENODATA);
	h = hints();
	h->domain_attr->resource_mgmt = (enum fi_resource_mgmt)7;
	EXPECT(getinfo(h, NULL), -FI_ENODATA);
	h = hints();
	h->addr_format = FI_SOCKADDR_IN;
	EXPECT(getinfo(h, NULL), -FI_ENODATA);
}

/* One endpoint with its CQ (and the shared AV). */
struct side {
	struct fid_ep *ep;
	struct fid_cq *cq;
	fi_addr_t addr;
};

static struct fid_fabric *fabric;
static struct fid_domain *domain;
static struct fid_av *av;
static struct fi_info *info;

static void open_side_waiting(struct side *s, enum fi_cq_format fmt, enum fi_wait_obj wait)
{
	struct fi_cq_attr ca = { .format = fmt, .wait_obj = wait };
	char name[64];
	size_t len = sizeof(name);

	EXPECT(fi_cq_open(domain, &ca, &s->cq, NULL), 0);
	EXPECT(fi_endpoint(domain, info, &s->ep, NULL), 0);
	EXPECT(fi_ep_bind(s->ep, &av->fid, 0), 0);
	EXPECT(fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV), 0);
	EXPECT(fi_enable(s->ep), 0);
	EXPECT(fi_getname(&s->ep->fid, name, &len), 0);
	CHECK(len == 24);
	EXPECT(fi_av_insert(av, name, 1, &s->addr, 0, NULL), 1);
}

static void open_side(struct side *s, enum fi_cq_format fmt)
{
	open_side_waiting(s, fmt, FI_WAIT_UNSPEC);
}

static void close_side(struct side *s)
{
	EXPECT(fi_close(&s->ep->fid), 0);
	EXPECT(fi_close(&s->cq->fid), 0);
}

/* Reads one completion of a tagged-format CQ, driving progress. */
static void read_tagged(struct fid_cq *cq, struct fi_cq_tagged_entry *e, fi_addr_t *src)
{
	ssize_t r;
	for (int i = 0; i < 1000000; i++) {
		r = src ? fi_cq_readfrom(cq, e, 1, src) : fi_cq_read(cq, e, 1);
		if (r != -FI_EAGAIN)
			break;
	}
	EXPECT(r, 1);
}

static void test_av_and_names(struct side *a)
{
	char name[64], tiny[4], str[128];
	size_t len = sizeof(tiny);

	memset(tiny, 0, sizeof(tiny));
	EXPECT(fi_getname(&a->ep->fid, tiny, &len), -FI_ETOOSMALL);
	CHECK(len == 24);
	len = sizeof(name);
	EXPECT(fi_av_lookup(av, a->addr, name, &len), 0);
	CHECK(len == 24);
	/* The short buffer got the address truncated (fi_cm(3)). */
	CHECK(!memcmp(tiny, name, sizeof(tiny)));
	len = sizeof(str);
	CHECK(fi_av_straddr(av, name, str, &len) == str);
	CHECK(!strncmp(str, "shmfab://", 9) && len == strlen(str) + 1);
	/* Inserting the same address again gives the same handle. */
	fi_addr_t again;
	EXPECT(fi_av_insert(av, name, 1, &again, 0, NULL), 1);
	CHECK(again == a->addr);
	/* A malformed address: not inserted, FI_ADDR_NOTAVAIL. */
	char bad[24] = { 0 };
	fi_addr_t b = 0;
	EXPECT(fi_av_insert(av, bad, 1, &b, 0, NULL), 0);
	CHECK(b == FI_ADDR_NOTAVAIL);
	EXPECT(fi_av_lookup(av, 12345, name, &len), -FI_ENOENT);
	/* FI_AV_UNSPEC: the type chosen comes back in the attributes. */
	struct fi_av_attr ua = { .type = FI_AV_UNSPEC };
	struct fid_av *uav;
	EXPECT(fi_av_open(domain, &ua, &uav, NULL), 0);
	CHECK(ua.type == FI_AV_TABLE);
	EXPECT(fi_close(&uav->fid), 0);
}

static void test_tagged_and_data(struct side *a, struct side *b)
{
	struct fi_cq_tagged_entry e;
	char buf[64] = { 0 };
	fi_addr_t src = 0;

	/* Directed tagged receive; the source comes back from readfrom. */
	EXPECT(fi_trecv(b->ep, buf, sizeof(buf), NULL, a->addr, 0x1200, 0xff, (void *)0xb1), 0);
	EXPECT(fi_tsend(a->ep, "tagged!", 8, NULL, b->addr, 0x1234, (void *)0xa1), 0);
	read_tagged(b->cq, &e, &src);
	CHECK(e.op_context == (void *)0xb1 && e.len == 8 && e.tag == 0x1234);
	CHECK((e.flags & (FI_TAGGED | FI_RECV)) == (FI_TAGGED | FI_RECV));
	CHECK(!strcmp(buf, "tagged!") && src == a->addr);
	read_tagged(a->cq, &e, NULL);
	CHECK(e.op_context == (void *)0xa1 && (e.flags & FI_SEND));

	/* Remote CQ data. */
	EXPECT(fi_recv(b->ep, buf, sizeof(buf), NULL, FI_ADDR_UNSPEC, (void *)0xb2), 0);
	EXPECT(fi_senddata(a->ep, "data", 5, NULL, 0xfeedULL, b->addr, (void *)0xa2), 0);
	read_tagged(b->cq, &e, NULL);
	CHECK(e.op_context == (void *)0xb2 && (e.flags & FI_REMOTE_CQ_DATA) && e.data == 0xfeed);
	read_tagged(a->cq, &e, NULL);

	/* iov send into a receive of two segments. */
	char x[3] = "ab", y[8] = { 0 }, z[8] = { 0 };
	struct iovec siov[2] = { { x, 2 }, { "cdef", 4 } };
	struct iovec riov[2] = { { y, 3 }, { z, 8 } };
	EXPECT(fi_recvv(b->ep, riov, NULL, 2, FI_ADDR_UNSPEC, (void *)0xb3), 0);
	EXPECT(fi_sendv(a->ep, siov, NULL, 2, b->addr, (void *)0xa3), 0);
	read_tagged(b->cq, &e, NULL);
	CHECK(e.len == 6 && !memcmp(y, "abc", 3) && !memcmp(z, "def", 3));
	read_tagged(a->cq, &e, NULL);

	/* A segment of length 0 may have a NULL base (it is never read); a
	 * segment with bytes needs one. */
	struct iovec siov0[3] = { { NULL, 0 }, { x, 2 }, { NULL, 0 } };
	struct iovec riov0[3] = { { NULL, 0 }, { y, 1 }, { z, 8 } };
	memset(y, 0, sizeof(y));
	memset(z, 0, sizeof(z));
	EXPECT(fi_recvv(b->ep, riov0, NULL, 3, FI_ADDR_UNSPEC, (void *)0xb5), 0);
	EXPECT(fi_sendv(a->ep, siov0, NULL, 3, b->addr, (void *)0xa5), 0);
	read_tagged(b->cq, &e, NULL);
	CHECK(e.op_context == (void *)0xb5 && e.len == 2 && y[0] == 'a' && z[0] == 'b');
	read_tagged(a->cq, &e, NULL);
	CHECK(e.op_context == (void *)0xa5);
	struct iovec bad[2] = { { x, 2 }, { NULL, 4 } };
	EXPECT(fi_sendv(a->ep, bad, NULL, 2, b->addr, NULL), -FI_EINVAL);
	EXPECT(fi_recvv(b->ep, bad, NULL, 2, FI_ADDR_UNSPEC, NULL), -FI_EINVAL);

	/* A read of 0 entries drives progress (manual progress here): the
	 * message lands in the receive buffer, and nothing is retrieved. */
	memset(buf, 0, sizeof(buf));
	EXPECT(fi_recv(b->ep, buf, sizeof(buf), NULL, FI_ADDR_UNSPEC, (void *)0xb9), 0);
	EXPECT(fi_send(a->ep, "zero", 5, NULL, b->addr, (void *)0xa9), 0);
	for (int i = 0; i < 100000 && strcmp(buf, "zero"); i++) {
		EXPECT(fi_cq_read(b->cq, NULL, 0), -FI_EAGAIN);
		EXPECT(fi_cq_readfrom(b->cq, NULL, 0, NULL), -FI_EAGAIN);
	}
	CHECK(!strcmp(buf, "zero"));
	read_tagged(b->cq, &e, NULL);
	CHECK(e.op_context == (void *)0xb9);
	read_tagged(a->cq, &e, NULL);

	/* inject: no completion. */
	EXPECT(fi_trecv(b->ep, buf, sizeof(buf), NULL, FI_ADDR_UNSPEC, 7, 0, (void *)0xb4), 0);
	EXPECT(fi_tinject(a->ep, "inj", 4, b->addr, 7), 0);
	read_tagged(b->cq, &e, NULL);
	CHECK(e.op_context == (void *)0xb4 && !strcmp(buf, "inj"));
	EXPECT(fi_cq_read(a->cq, &e, 1), -FI_EAGAIN);
	/* inject above inject_size */
	static char big[8192];
	EXPECT(fi_inject(a->ep, big, sizeof(big), b->addr), -FI_EMSGSIZE);
}

/* Reads one completion of `size` bytes into `out` (followed by a guard
 * that must stay untouched), driving progress. */
static void read_sized(struct fid_cq *cq, void *out, size_t size)
{
	unsigned char raw[sizeof(struct fi_cq_tagged_entry) + 64];
	ssize_t r = -FI_EAGAIN;
	memset(raw, 0xa5, sizeof(raw));
	for (int i = 0; i < 1000000 && r == -FI_EAGAIN; i++)
		r = fi_cq_read(cq, raw, 1);
	EXPECT(r, 1);
	for (size_t i = size; i < sizeof(raw); i++)
		CHECK(raw[i] == 0xa5); /* nothing written past the entry */
	memcpy(out, raw, size);
}

/* An entry read in each CQ format, with the fields the format has; an
 * FI_CQ_FORMAT_UNSPEC CQ tells which format it chose. */
static void test_cq_formats(struct side *a)
{
	static const enum fi_cq_format fmts[] = { FI_CQ_FORMAT_UNSPEC, FI_CQ_FORMAT_CONTEXT, FI_CQ_FORMAT_MSG,
						  FI_CQ_FORMAT_DATA, FI_CQ_FORMAT_TAGGED };
	for (size_t k = 0; k < sizeof(fmts) / sizeof(fmts[0]); k++) {
		struct side s;
		struct fi_cq_attr ca = { .format = fmts[k], .wait_obj = FI_WAIT_UNSPEC };
		struct fi_cq_tagged_entry t;
		struct fi_cq_tagged_entry e;
		char buf[16] = { 0 };
		size_t size;

		EXPECT(fi_cq_open(domain, &ca, &s.cq, NULL), 0);
		EXPECT(fi_endpoint(domain, info, &s.ep, NULL), 0);
		EXPECT(fi_ep_bind(s.ep, &av->fid, 0), 0);
		EXPECT(fi_ep_bind(s.ep, &s.cq->fid, FI_TRANSMIT | FI_RECV), 0);
		EXPECT(fi_enable(s.ep), 0);
		char name[64];
		size_t len = sizeof(name);
		EXPECT(fi_getname(&s.ep->fid, name, &len), 0);
		EXPECT(fi_av_insert(av, name, 1, &s.addr, 0, NULL), 1);
		if (fmts[k] == FI_CQ_FORMAT_UNSPEC)
			CHECK(ca.format == FI_CQ_FORMAT_CONTEXT); /* the format chosen */
		else
			CHECK(ca.format == fmts[k]);
		switch (ca.format) {
		case FI_CQ_FORMAT_CONTEXT: size = sizeof(struct fi_cq_entry); break;
		case FI_CQ_FORMAT_MSG: size = sizeof(struct fi_cq_msg_entry); break;
		case FI_CQ_FORMAT_DATA: size = sizeof(struct fi_cq_data_entry); break;
		default: size = sizeof(struct fi_cq_tagged_entry); break;
		}
		EXPECT(fi_trecv(s.ep, buf, sizeof(buf), NULL, FI_ADDR_UNSPEC, 0x77, 0, (void *)0xf1), 0);
		EXPECT(fi_tsenddata(a->ep, "fmt", 4, NULL, 0xda7a, s.addr, 0x77, (void *)0xf2), 0);
		memset(&t, 0, sizeof(t));
		read_sized(s.cq, &t, size);
		CHECK(t.op_context == (void *)0xf1 && !strcmp(buf, "fmt"));
		if (ca.format != FI_CQ_FORMAT_CONTEXT)
			CHECK(t.len == 4 && (t.flags & (FI_RECV | FI_TAGGED)) == (FI_RECV | FI_TAGGED));
		if (ca.format == FI_CQ_FORMAT_DATA || ca.format == FI_CQ_FORMAT_TAGGED)
			CHECK(t.buf == buf && (t.flags & FI_REMOTE_CQ_DATA) && t.data == 0xda7a);
		if (ca.format == FI_CQ_FORMAT_TAGGED)
			CHECK(t.tag == 0x77);
		read_tagged(a->cq, &e, NULL);
		CHECK(e.op_context == (void *)0xf2);
		close_side(&s);
	}
}

static void test_errors(struct side *a, struct side *b)
{
	struct fi_cq_tagged_entry e;
	struct fi_cq_err_entry err;
	char small[4], data[8];
	const char *s;

	/* Truncation: -FI_EAVAIL, then the error entry, its data copied into
	 * the caller's buffer (API >= 1.5). */
	EXPECT(fi_recv(b->ep, small, sizeof(small), NULL, FI_ADDR_UNSPEC, (void *)0xb5), 0);
	EXPECT(fi_send(a->ep, "0123456789abcdef", 16, NULL, b->addr, (void *)0xa5), 0);
	ssize_t r;
	for (int i = 0; i < 1000000; i++)
		if ((r = fi_cq_read(b->cq, &e, 1)) != -FI_EAGAIN)
			break;
	EXPECT(r, -FI_EAVAIL);
	memset(&err, 0, sizeof(err));
	memset(data, 0, sizeof(data));
	err.err_data = data;
	err.err_data_size = sizeof(data);
	EXPECT(fi_cq_readerr(b->cq, &err, 0), 1);
	CHECK(err.err == FI_ETRUNC && err.op_context == (void *)0xb5 && err.olen == 12);
	/* As much of the provider's text as fits: its first 8 bytes. */
	CHECK(err.err_data == data && err.err_data_size == sizeof(data));
	CHECK(!memcmp(data, "message ", 8));
	s = fi_cq_strerror(b->cq, err.prov_errno, err.err_data, NULL, 0);
	CHECK(s && strlen(s) > 0);
	char sbuf[8];
	CHECK(fi_cq_strerror(b->cq, err.prov_errno, NULL, sbuf, sizeof(sbuf)) == sbuf && strlen(sbuf) == 7);
	EXPECT(fi_cq_readerr(b->cq, &err, 0), -FI_EAGAIN);
	read_tagged(a->cq, &e, NULL);

	/* fi_cancel of a posted receive: FI_ECANCELED, the provider's error
	 * data when the caller gives no buffer. */
	EXPECT(fi_trecv(b->ep, data, sizeof(data), NULL, FI_ADDR_UNSPEC, 99, 0, (void *)0xb6), 0);
	EXPECT(fi_cancel(&b->ep->fid, (void *)0xb6), 0);
	EXPECT(fi_cq_read(b->cq, &e, 1), -FI_EAVAIL);
	memset(&err, 0, sizeof(err));
	EXPECT(fi_cq_readerr(b->cq, &err, 0), 1);
	CHECK(err.err == FI_ECANCELED && err.op_context == (void *)0xb6);
	CHECK(err.err_data != NULL && err.err_data_size > 0);
	CHECK(strstr((const char *)err.err_data, "cancel") != NULL);
	/* Never more than the domain's max_err_data, a C string there. */
	CHECK(err.err_data_size <= info->domain_attr->max_err_data);
	CHECK(strlen((const char *)err.err_data) == err.err_data_size);
	/* Cancelling what is not pending succeeds and does nothing. */
	EXPECT(fi_cancel(&b->ep->fid, (void *)0xb6), 0);
	EXPECT(fi_cq_read(b->cq, &e, 1), -FI_EAGAIN);

	/* Probes and claims: test_probe. Flags that mean nothing, and a
	 * claim of a context that claimed nothing. */
	struct iovec iov = { data, sizeof(data) };
	struct fi_msg_tagged m = { .msg_iov = &iov, .iov_count = 1, .addr = FI_ADDR_UNSPEC, .tag = 1 };
	EXPECT(fi_trecvmsg(b->ep, &m, FI_DISCARD), -FI_EBADFLAGS);
	EXPECT(fi_trecvmsg(b->ep, &m, FI_PEEK | FI_CLAIM | FI_DISCARD), -FI_EBADFLAGS);
	EXPECT(fi_trecvmsg(b->ep, &m, FI_CLAIM), -FI_EINVAL); /* NULL context */
	struct fi_context none;
	m.context = &none;
	EXPECT(fi_trecvmsg(b->ep, &m, FI_CLAIM), -FI_EINVAL);
	m.context = NULL;
	/* RMA to a key nothing registered (test_rma for the rest): taken,
	 * and completed with an error entry. */
	EXPECT(fi_write(a->ep, data, 8, NULL, b->addr, 0, 0, NULL), 0);
	EXPECT(fi_read(a->ep, data, 8, NULL, b->addr, 0, 0, NULL), 0);
	for (int k = 0; k < 2; k++) {
		struct fi_cq_err_entry ee = { 0 };
		ssize_t r = -FI_EAGAIN;
		for (int i = 0; i < 1000000 && r == -FI_EAGAIN; i++)
			r = fi_cq_read(a->cq, &e, 1);
		EXPECT(r, -FI_EAVAIL);
		EXPECT(fi_cq_readerr(a->cq, &ee, 0), 1);
		CHECK(ee.err != 0);
	}
	struct fi_msg mm = { .msg_iov = &iov, .iov_count = 1, .addr = b->addr };
	/* Transmit complete is what every send gives; FI_MORE is a hint
	 * (delivery complete: test_delivery_complete). */
	struct iovec riov = { small, sizeof(small) };
	struct fi_msg rm = { .msg_iov = &riov, .iov_count = 1, .addr = FI_ADDR_UNSPEC };
	iov.iov_len = 4;
	EXPECT(fi_recvmsg(b->ep, &rm, FI_MORE), 0);
	EXPECT(fi_sendmsg(a->ep, &mm, FI_TRANSMIT_COMPLETE | FI_INJECT | FI_MORE), 0);
	read_tagged(a->cq, &e, NULL);
	read_tagged(b->cq, &e, NULL);
}

/* One probe (fi_trecvmsg with `flags`, no buffer) on b and its
 * completion: 1 with *e, or the negated error of its error entry, in *err. */
static ssize_t probe(struct side *b, uint64_t tag, uint64_t flags, void *ctx, struct fi_cq_tagged_entry *e,
		     struct fi_cq_err_entry *err)
{
	struct fi_msg_tagged m = { .iov_count = 0, .addr = FI_ADDR_UNSPEC, .tag = tag, .context = ctx };
	ssize_t r = -FI_EAGAIN;

	EXPECT(fi_trecvmsg(b->ep, &m, flags), 0);
	for (int i = 0; i < 1000000 && r == -FI_EAGAIN; i++)
		r = fi_cq_read(b->cq, e, 1);
	if (r == -FI_EAVAIL) {
		memset(err, 0, sizeof(*err));
		EXPECT(fi_cq_readerr(b->cq, err, 0), 1);
		CHECK(err->op_context == ctx);
		return -err->err;
	}
	EXPECT(r, 1);
	CHECK(e->op_context == ctx);
	return 1;
}

/* As probe, until a message is found (a miss is -FI_ENOMSG). */
static void probe_found(struct side *b, uint64_t tag, uint64_t flags, void *ctx, struct fi_cq_tagged_entry *e)
{
	struct fi_cq_err_entry err;
	ssize_t r;
	int n = 0;

	while ((r = probe(b, tag, flags, ctx, e, &err)) == -FI_ENOMSG && n++ < 100000)
		;
	EXPECT(r, 1);
}

/* FI_PEEK, FI_CLAIM and FI_DISCARD (fi_tagged(3); MPI_Probe, MPI_Improbe
 * and MPI_Mrecv use them): a peek finds nothing (-FI_ENOMSG) or a message
 * (length, tag, data, no buffer) and leaves it; a claimed message is out
 * of reach of peeks and receives until the FI_CLAIM receive of its
 * fi_context, which takes it once; claim and discard, peek and discard. */
static void test_probe(struct side *a, struct side *b)
{
	static char big[30000], got[30000];
	struct fi_cq_tagged_entry e;
	struct fi_cq_err_entry err;
	struct fi_context claim, claim2;
	char buf[16] = { 0 };

	CHECK(probe(b, 0x51, FI_PEEK, (void *)0xd1, &e, &err) == -FI_ENOMSG);
	CHECK(err.flags == (FI_RECV | FI_TAGGED));
	EXPECT(fi_tsenddata(a->ep, "probe me", 9, NULL, 0xd0d0, b->addr, 0x51, (void *)0xd2), 0);
	read_tagged(a->cq, &e, NULL);
	for (int k = 0; k < 2; k++) {
		probe_found(b, 0x51, FI_PEEK, (void *)0xd3, &e);
		CHECK(e.len == 9 && e.tag == 0x51 && e.data == 0xd0d0 && e.buf == NULL);
		CHECK(e.flags == (FI_RECV | FI_TAGGED | FI_REMOTE_CQ_DATA));
	}
	CHECK(probe(b, 0x51, FI_PEEK | FI_CLAIM, &claim, &e, &err) == 1 && e.len == 9);
	/* Claimed: no peek sees it, no receive takes it, the context claims no
	 * other. */
	CHECK(probe(b, 0x51, FI_PEEK, (void *)0xd4, &e, &err) == -FI_ENOMSG);
	EXPECT(fi_trecv(b->ep, buf, sizeof(buf), NULL, FI_ADDR_UNSPEC, 0x51, 0, (void *)0xd5), 0);
	EXPECT(fi_cq_read(b->cq, &e, 1), -FI_EAGAIN);
	struct fi_msg_tagged pm = { .iov_count = 0, .addr = FI_ADDR_UNSPEC, .tag = 0x51, .context = &claim };
	EXPECT(fi_trecvmsg(b->ep, &pm, FI_PEEK | FI_CLAIM), -FI_EINVAL);
	/* The claim's receive takes it, once. */
	struct iovec iov = { got, sizeof(got) };
	struct fi_msg_tagged m = { .msg_iov = &iov, .iov_count = 1, .addr = FI_ADDR_UNSPEC, .context = &claim };
	EXPECT(fi_trecvmsg(b->ep, &m, FI_CLAIM), 0);
	read_tagged(b->cq, &e, NULL);
	CHECK(e.op_context == &claim && e.len == 9 && e.tag == 0x51 && e.data == 0xd0d0 && !strcmp(got, "probe me"));
	EXPECT(fi_trecvmsg(b->ep, &m, FI_CLAIM), -FI_EINVAL);
	/* The receive posted meanwhile takes the next message. */
	EXPECT(fi_tinject(a->ep, "next", 5, b->addr, 0x51), 0);
	read_tagged(b->cq, &e, NULL);
	CHECK(e.op_context == (void *)0xd5 && !strcmp(buf, "next"));

	/* A message through the pool, in fragments: claimed with its full
	 * length, received whole. */
	for (size_t i = 0; i < sizeof(big); i++)
		big[i] = (char)(i * 7 + 1);
	EXPECT(fi_tsend(a->ep, big, sizeof(big), NULL, b->addr, 0x52, (void *)0xd6), 0);
	probe_found(b, 0x52, FI_PEEK | FI_CLAIM, &claim2, &e);
	CHECK(e.len == sizeof(big) && e.tag == 0x52);
	memset(got, 0, sizeof(got));
	m.context = &claim2;
	EXPECT(fi_trecvmsg(b->ep, &m, FI_CLAIM), 0);
	read_tagged(b->cq, &e, NULL);
	CHECK(e.op_context == &claim2 && e.len == sizeof(big) && !memcmp(got, big, sizeof(big)));
	read_tagged(a->cq, &e, NULL);
	CHECK(e.op_context == (void *)0xd6);

	/* Claim then discard: completes with length 0. Peek and discard:
	 * with the message's length. Both gone after. */
	EXPECT(fi_tinject(a->ep, "drop", 5, b->addr, 0x53), 0);
	probe_found(b, 0x53, FI_PEEK | FI_CLAIM, &claim, &e);
	CHECK(probe(b, 0, FI_CLAIM | FI_DISCARD, &claim, &e, &err) == 1 && e.len == 0 && e.tag == 0x53);
	CHECK(probe(b, 0x53, FI_PEEK, (void *)0xd7, &e, &err) == -FI_ENOMSG);
	EXPECT(fi_tinject(a->ep, "drop2", 6, b->addr, 0x54), 0);
	probe_found(b, 0x54, FI_PEEK | FI_DISCARD, (void *)0xd8, &e);
	CHECK(e.len == 6 && e.tag == 0x54);
	CHECK(probe(b, 0x54, FI_PEEK, (void *)0xd9, &e, &err) == -FI_ENOMSG);
	EXPECT(fi_cq_read(b->cq, &e, 1), -FI_EAGAIN);
}

static void test_cq_waits(void)
{
	struct fid_cq *cq;
	struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_NONE };
	struct fi_cq_entry e;
	int fd = -1;
	enum fi_wait_obj wo;

	EXPECT(fi_cq_open(domain, &ca, &cq, NULL), 0);
	EXPECT(fi_cq_sread(cq, &e, 1, NULL, 0), -FI_EINVAL); /* no wait object */
	EXPECT(fi_control(&cq->fid, FI_GETWAITOBJ, &wo), 0);
	CHECK(wo == FI_WAIT_NONE);
	EXPECT(fi_close(&cq->fid), 0);

	ca.wait_obj = FI_WAIT_UNSPEC;
	EXPECT(fi_cq_open(domain, &ca, &cq, NULL), 0);
	EXPECT(fi_cq_sread(cq, &e, 1, NULL, 10), -FI_EAGAIN); /* timeout */
	/* FI_CQ_COND_NONE: cond is not a threshold, and not read. */
	EXPECT(fi_cq_sread(cq, &e, 1, (void *)8, 10), -FI_EAGAIN);
	EXPECT(fi_cq_signal(cq), 0);
	EXPECT(fi_cq_sread(cq, &e, 1, NULL, -1), -FI_EAGAIN); /* interrupted */
	EXPECT(fi_close(&cq->fid), 0);

	ca.wait_obj = FI_WAIT_FD;
	EXPECT(fi_cq_open(domain, &ca, &cq, NULL), 0);
	EXPECT(fi_control(&cq->fid, FI_GETWAIT, &fd), 0);
	CHECK(fd >= 0);
	EXPECT(fi_close(&cq->fid), 0);

	/* FI_WAIT_POLLFD: the fds to poll, -FI_ETOOSMALL (and the count
	 * needed) without room for them. */
	ca.wait_obj = FI_WAIT_POLLFD;
	EXPECT(fi_cq_open(domain, &ca, &cq, NULL), 0);
	struct pollfd pfd[2] = { { .fd = -1 }, { .fd = -1 } };
	struct fi_wait_pollfd wp = { .nfds = 0, .fd = pfd };
	EXPECT(fi_control(&cq->fid, FI_GETWAIT, &wp), -FI_ETOOSMALL);
	CHECK(wp.nfds == 1 && pfd[0].fd == -1);
	wp.nfds = 2;
	EXPECT(fi_control(&cq->fid, FI_GETWAIT, &wp), 0);
	CHECK(wp.nfds == 1 && pfd[0].fd >= 0 && (pfd[0].events & POLLIN) && pfd[1].fd == -1);
	EXPECT(fi_control(&cq->fid, FI_GETWAITOBJ, &wo), 0);
	CHECK(wo == FI_WAIT_POLLFD);
	EXPECT(fi_close(&cq->fid), 0);

	ca.wait_obj = FI_WAIT_SET; /* names no wait set */
	EXPECT(fi_cq_open(domain, &ca, &cq, NULL), -FI_EINVAL);
	struct fi_wait_attr wa = { .wait_obj = FI_WAIT_POLLFD }; /* not built */
	struct fid_wait *ws;
	EXPECT(fi_wait_open(fabric, &wa, &ws), -FI_ENOSYS);
}

/* What another thread does after a pause, while the main thread waits on
 * a wait object (outside the provider: FI_THREAD_DOMAIN holds). */
struct later {
	struct side *from; /* sends "late" to `to` */
	fi_addr_t to;
	struct fid_cntr *cntr; /* else adds 1 to it */
};

static void *later_run(void *arg)
{
	struct later *l = arg;
	usleep(50000);
	if (l->from)
		EXPECT(fi_send(l->from->ep, "late", 5, NULL, l->to, NULL), 0);
	else
		EXPECT(fi_cntr_add(l->cntr, 1), 0);
	return NULL;
}

/* fi_trywait(3)'s protocol on a FI_WAIT_MUTEX_COND object: under its
 * mutex, fi_trywait, then pthread_cond_wait until `done` (10 s at most);
 * `l` runs in another thread meanwhile. Returns whether it woke in time. */
static int cond_wait_for(struct fid *obj, struct fid *tw, struct later *l, int (*done)(void *), void *arg)
{
	struct fi_mutex_cond mc = { 0 };
	struct timespec until;
	pthread_t t;
	int r = 0;

	EXPECT(fi_control(obj, FI_GETWAIT, &mc), 0);
	CHECK(mc.mutex && mc.cond);
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 10;
	CHECK(pthread_mutex_lock(mc.mutex) == 0);
	EXPECT(fi_trywait(fabric, &tw, 1), 0);
	CHECK(pthread_create(&t, NULL, later_run, l) == 0);
	while (!done(arg) && r == 0)
		r = pthread_cond_timedwait(mc.cond, mc.mutex, &until);
	CHECK(pthread_mutex_unlock(mc.mutex) == 0);
	CHECK(pthread_join(t, NULL) == 0);
	return r == 0;
}

static int woken; /* set by the checks below: the wait ended */
static int wake_once(void *arg)
{
	(void)arg;
	return woken++ > 0; /* the first check (before any wait) is false */
}

/* FI_WAIT_MUTEX_COND on CQs and counters: FI_GETWAIT gives the pthread
 * mutex and condition, broadcast when an event comes after fi_trywait;
 * sread and fi_cntr_wait block as for the other wait objects. */
static void test_mutex_cond(struct side *a)
{
	struct side m;
	struct fi_cq_tagged_entry e;
	struct fid_cntr *c;
	struct fi_cntr_attr na = { .events = FI_CNTR_EVENTS_COMP, .wait_obj = FI_WAIT_MUTEX_COND };
	enum fi_wait_obj wo;
	char buf[8] = { 0 };
	uint64_t v;

	open_side_waiting(&m, FI_CQ_FORMAT_TAGGED, FI_WAIT_MUTEX_COND);
	EXPECT(fi_control(&m.cq->fid, FI_GETWAITOBJ, &wo), 0);
	CHECK(wo == FI_WAIT_MUTEX_COND);
	EXPECT(fi_cq_sread(m.cq, &e, 1, NULL, 10), -FI_EAGAIN); /* timeout */
	EXPECT(fi_recv(m.ep, buf, sizeof(buf), NULL, FI_ADDR_UNSPEC, (void *)0xc1), 0);
	struct later l = { .from = a, .to = m.addr };
	woken = 0;
	CHECK(cond_wait_for(&m.cq->fid, &m.cq->fid, &l, wake_once, NULL));
	EXPECT(fi_trywait(fabric, (struct fid **)&m.cq, 1), -FI_EAGAIN); /* it is there */
	read_tagged(m.cq, &e, NULL);
	CHECK(e.op_context == (void *)0xc1 && !strcmp(buf, "late"));
	read_tagged(a->cq, &e, NULL);
	EXPECT(fi_recv(m.ep, buf, sizeof(buf), NULL, FI_ADDR_UNSPEC, (void *)0xc2), 0);
	EXPECT(fi_send(a->ep, "sread", 6, NULL, m.addr, NULL), 0);
	EXPECT(fi_cq_sread(m.cq, &e, 1, NULL, 10000), 1);
	CHECK(e.op_context == (void *)0xc2 && !strcmp(buf, "sread"));
	read_tagged(a->cq, &e, NULL);
	close_side(&m);

	EXPECT(fi_cntr_open(domain, &na, &c, NULL), 0);
	EXPECT(fi_control(&c->fid, FI_GETWAITOBJ, &wo), 0);
	CHECK(wo == FI_WAIT_MUTEX_COND);
	l = (struct later){ .cntr = c };
	woken = 0;
	CHECK(cond_wait_for(&c->fid, &c->fid, &l, wake_once, NULL));
	v = fi_cntr_read(c);
	CHECK(v == 1);
	EXPECT(fi_cntr_wait(c, 1, 1000), 0);
	EXPECT(fi_cntr_wait(c, 2, 10), -FI_ETIMEDOUT);
	EXPECT(fi_close(&c->fid), 0);
}

/* Wait sets with FI_WAIT_FD (an fd from the opening on, readable once a
 * member has an event after fi_trywait on the set) and with
 * FI_WAIT_MUTEX_COND. */
static void test_wait_set_objects(struct side *a)
{
	struct fi_wait_attr wa = { .wait_obj = FI_WAIT_FD };
	struct fid_wait *ws;
	struct fid *tw;
	struct side w;
	struct fi_cq_tagged_entry e;
	struct epoll_event ev = { .events = EPOLLIN }, got;
	enum fi_wait_obj wo;
	char name[64], in[8];
	size_t len;
	int fd = -1, ep;

	EXPECT(fi_wait_open(fabric, &wa, &ws), 0);
	tw = &ws->fid;
	EXPECT(fi_control(&ws->fid, FI_GETWAIT, &fd), 0); /* before any member */
	EXPECT(fi_control(&ws->fid, FI_GETWAITOBJ, &wo), 0);
	CHECK(wo == FI_WAIT_FD && fd >= 0 && (ep = epoll_create1(0)) >= 0);
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0);
	EXPECT(fi_trywait(fabric, &tw, 1), 0); /* no member: nothing to read */
	struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_TAGGED, .wait_obj = FI_WAIT_SET, .wait_set = ws };
	EXPECT(fi_cq_open(domain, &ca, &w.cq, NULL), 0);
	EXPECT(fi_endpoint(domain, info, &w.ep, NULL), 0);
	EXPECT(fi_ep_bind(w.ep, &av->fid, 0), 0);
	EXPECT(fi_ep_bind(w.ep, &w.cq->fid, FI_TRANSMIT | FI_RECV), 0);
	EXPECT(fi_enable(w.ep), 0);
	len = sizeof(name);
	EXPECT(fi_getname(&w.ep->fid, name, &len), 0);
	EXPECT(fi_av_insert(av, name, 1, &w.addr, 0, NULL), 1);
	EXPECT(fi_recv(w.ep, in, sizeof(in), NULL, FI_ADDR_UNSPEC, (void *)0x3c), 0);
	EXPECT(fi_trywait(fabric, &tw, 1), 0);
	CHECK(epoll_wait(ep, &got, 1, 50) == 0); /* quiet */
	EXPECT(fi_send(a->ep, "fdset", 6, NULL, w.addr, NULL), 0);
	CHECK(epoll_wait(ep, &got, 1, 10000) == 1);
	EXPECT(fi_trywait(fabric, &tw, 1), -FI_EAGAIN);
	read_tagged(w.cq, &e, NULL);
	CHECK(e.op_context == (void *)0x3c && !strcmp(in, "fdset"));
	read_tagged(a->cq, &e, NULL);
	EXPECT(fi_trywait(fabric, &tw, 1), 0);
	CHECK(epoll_wait(ep, &got, 1, 50) == 0); /* emptied by trywait */
	EXPECT(fi_close(&ws->fid), -FI_EBUSY);
	close_side(&w);
	EXPECT(fi_close(&ws->fid), 0);
	close(ep);

	wa.wait_obj = FI_WAIT_MUTEX_COND;
	EXPECT(fi_wait_open(fabric, &wa, &ws), 0);
	tw = &ws->fid;
	ca.wait_set = ws;
	EXPECT(fi_cq_open(domain, &ca, &w.cq, NULL), 0);
	EXPECT(fi_endpoint(domain, info, &w.ep, NULL), 0);
	EXPECT(fi_ep_bind(w.ep, &av->fid, 0), 0);
	EXPECT(fi_ep_bind(w.ep, &w.cq->fid, FI_TRANSMIT | FI_RECV), 0);
	EXPECT(fi_enable(w.ep), 0);
	len = sizeof(name);
	EXPECT(fi_getname(&w.ep->fid, name, &len), 0);
	EXPECT(fi_av_insert(av, name, 1, &w.addr, 0, NULL), 1);
	EXPECT(fi_recv(w.ep, in, sizeof(in), NULL, FI_ADDR_UNSPEC, (void *)0x3d), 0);
	struct later l = { .from = a, .to = w.addr };
	woken = 0;
	CHECK(cond_wait_for(&ws->fid, tw, &l, wake_once, NULL));
	EXPECT(fi_wait(ws, 0), 0);
	read_tagged(w.cq, &e, NULL);
	CHECK(e.op_context == (void *)0x3d && !strcmp(in, "late"));
	read_tagged(a->cq, &e, NULL);
	close_side(&w);
	EXPECT(fi_close(&ws->fid), 0);
}

/* An epoll loop over a CQ's FI_WAIT_FD, with fi_trywait before blocking. */
static void test_trywait_epoll(struct side *a)
{
	struct side f;
	struct fi_cq_tagged_entry e;
	struct epoll_event ev = { .events = EPOLLIN }, got;
	struct fid *fids[1];
	char buf[16] = { 0 };
	int fd = -1, ep, n;

	open_side_waiting(&f, FI_CQ_FORMAT_TAGGED, FI_WAIT_FD);
	fids[0] = &f.cq->fid;
	EXPECT(fi_control(&f.cq->fid, FI_GETWAIT, &fd), 0);
	CHECK(fd >= 0 && (ep = epoll_create1(0)) >= 0);
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0);
	EXPECT(fi_recv(f.ep, buf, sizeof(buf), NULL, FI_ADDR_UNSPEC, (void *)0xf1), 0);
	/* Nothing there: safe to block, and the fd stays quiet. */
	EXPECT(fi_trywait(fabric, fids, 1), 0);
	CHECK(epoll_wait(ep, &got, 1, 50) == 0);
	/* A message: the fd becomes readable, the read finds it. */
	EXPECT(fi_send(a->ep, "epoll", 6, NULL, f.addr, NULL), 0);
	n = epoll_wait(ep, &got, 1, 10000);
	CHECK(n == 1);
	/* Something to read: not safe to block. */
	EXPECT(fi_trywait(fabric, fids, 1), -FI_EAGAIN);
	read_tagged(f.cq, &e, NULL);
	CHECK(e.op_context == (void *)0xf1 && !strcmp(buf, "epoll"));
	read_tagged(a->cq, &e, NULL);
	EXPECT(fi_trywait(fabric, fids, 1), 0);
	/* Only CQs and counters with fds. */
	fids[0] = &a->ep->fid;
	EXPECT(fi_trywait(fabric, fids, 1), -FI_EINVAL);
	close(ep);
	close_side(&f);
}

static void test_counters_and_mr(struct side *a, struct side *b)
{
	struct fid_cntr *c;
	struct fi_cntr_attr attr = { .events = FI_CNTR_EVENTS_COMP, .wait_obj = FI_WAIT_UNSPEC };
	struct fid_mr *mr, *mr2;
	static char region[4096];

	EXPECT(fi_cntr_open(domain, &attr, &c, NULL), 0);
	EXPECT(fi_cntr_set(c, 5), 0);
	EXPECT(fi_cntr_add(c, 2), 0);
	CHECK(fi_cntr_read(c) == 7);
	EXPECT(fi_cntr_seterr(c, 1), 0);
	EXPECT(fi_cntr_adderr(c, 1), 0);
	CHECK(fi_cntr_readerr(c) == 2);
	EXPECT(fi_cntr_wait(c, 7, 100), 0);
	EXPECT(fi_cntr_wait(c, 100, 10), -FI_ETIMEDOUT);
	/* Bound after enable: refused as the library refuses it. */
	EXPECT(fi_ep_bind(a->ep, &c->fid, FI_SEND), -FI_EINVAL);
	EXPECT(fi_close(&c->fid), 0);

	EXPECT(fi_mr_reg(domain, region, sizeof(region), FI_SEND | FI_RECV, 0, 7, 0, &mr, NULL), 0);
	CHECK(fi_mr_key(mr) == 7 && fi_mr_desc(mr) != NULL);
	EXPECT(fi_mr_reg(domain, region, sizeof(region), FI_SEND, 0, 7, 0, &mr2, NULL), -FI_ENOKEY);
	EXPECT(fi_mr_reg(domain, region, 0, FI_SEND, 0, 8, 0, &mr2, NULL), -FI_EINVAL);
	EXPECT(fi_mr_reg(domain, region, sizeof(region), FI_SEND, 1, 8, 0, &mr2, NULL), -FI_EINVAL);
	/* A registered buffer's descriptor works in a send. */
	struct fi_cq_tagged_entry e;
	char in[8];
	strcpy(region, "mr");
	EXPECT(fi_recv(b->ep, in, sizeof(in), NULL, FI_ADDR_UNSPEC, NULL), 0);
	EXPECT(fi_send(a->ep, region, 3, fi_mr_desc(mr), b->addr, NULL), 0);
	read_tagged(b->cq, &e, NULL);
	read_tagged(a->cq, &e, NULL);
	CHECK(!strcmp(in, "mr"));
	{
		uint8_t raw[8];
		uint64_t base = 1, mapped = 0;
		size_t ks = sizeof(raw);
		EXPECT(fi_mr_raw_attr(mr, &base, raw, &ks, 0), 0);
		EXPECT(fi_mr_map_raw(domain, base, raw, ks, &mapped, 0), 0);
		CHECK(mapped == 7 && base == 0);
	}
	EXPECT(fi_close(&mr->fid), 0);
	EXPECT(fi_mr_reg(domain, region, sizeof(region), FI_SEND, 0, 7, 0, &mr2, NULL), 0);
	/* The application's keys are no library registration: no counter. */
	EXPECT(fi_cntr_open(domain, &attr, &c, NULL), 0);
	EXPECT(fi_mr_bind(mr2, &c->fid, FI_REMOTE_WRITE), -FI_ENOSYS);
	EXPECT(fi_close(&c->fid), 0);
	EXPECT(fi_close(&mr2->fid), 0);
}

/* Provider keys (FI_MR_PROV_KEY): registrations are the library's. */
static void test_mr_prov_keys(void)
{
	struct fi_info *h = hints(), *pi;
	struct fid_domain *d;
	struct fid_mr *m1, *m2, *m3, *m4;
	struct fid_cntr *c;
	struct fi_cntr_attr ca = { .events = FI_CNTR_EVENTS_COMP };
	static char r1[4096], r2[8192];
	struct iovec iov[5] = {
		{ r1, 100 }, { r2, 200 }, { r1 + 200, 10 }, { r2 + 400, 10 }, { r1 + 300, 1 },
	};

	h->domain_attr->mr_mode = FI_MR_PROV_KEY | FI_MR_LOCAL;
	EXPECT(getinfo(h, &pi), 0);
	CHECK(pi->domain_attr->mr_mode == FI_MR_PROV_KEY);
	CHECK(pi->domain_attr->mr_iov_limit == 4);
	EXPECT(fi_domain(fabric, pi, &d, NULL), 0);
	EXPECT(fi_mr_reg(d, r1, sizeof(r1), FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 7, 0, &m1, NULL), 0);
	EXPECT(fi_mr_reg(d, r2, sizeof(r2), FI_REMOTE_READ, 0, 7, 0, &m2, NULL), 0);
	/* The provider's keys, not the requested one, and distinct. */
	CHECK(fi_mr_key(m1) != fi_mr_key(m2) && fi_mr_desc(m1) != NULL);
	EXPECT(fi_mr_regv(d, iov, 4, FI_REMOTE_WRITE, 0, 0, 0, &m3, NULL), 0);
	EXPECT(fi_mr_regv(d, iov, 5, FI_REMOTE_WRITE, 0, 0, 0, &m4, NULL), -FI_EINVAL);
	EXPECT(fi_mr_regv(d, iov, 0, FI_REMOTE_WRITE, 0, 0, 0, &m4, NULL), -FI_EINVAL);
	struct fi_mr_attr ma = { .mr_iov = iov, .iov_count = 2, .access = FI_REMOTE_READ };
	EXPECT(fi_mr_regattr(d, &ma, 0, &m4), 0);
	CHECK(fi_mr_key(m4) != fi_mr_key(m3));
	/* Unknown access bits are refused. */
	struct fid_mr *bad;
	EXPECT(fi_mr_reg(d, r1, 8, FI_REMOTE_READ | (1ULL << 60), 0, 0, 0, &bad, NULL), -FI_EINVAL);
	/* fi_mr(3): len must be > 0; offset is reserved and must be 0. */
	EXPECT(fi_mr_reg(d, r1, 0, FI_REMOTE_READ, 0, 0, 0, &bad, NULL), -FI_EINVAL);
	EXPECT(fi_mr_reg(d, r1, 8, FI_REMOTE_READ, 8, 0, 0, &bad, NULL), -FI_EINVAL);
	struct iovec z[2] = { { r1, 0 }, { r2, 0 } };
	EXPECT(fi_mr_regv(d, z, 2, FI_REMOTE_READ, 0, 0, 0, &bad, NULL), -FI_EINVAL);
	struct fi_mr_attr mo = { .mr_iov = iov, .iov_count = 1, .access = FI_REMOTE_READ, .offset = 4 };
	EXPECT(fi_mr_regattr(d, &mo, 0, &bad), -FI_EINVAL);
	/* Remote-event counters bind; other flags do not. */
	EXPECT(fi_cntr_open(d, &ca, &c, NULL), 0);
	EXPECT(fi_mr_bind(m1, &c->fid, FI_REMOTE_WRITE | FI_REMOTE_READ), 0);
	EXPECT(fi_mr_bind(m2, &c->fid, FI_REMOTE_READ), 0);
	CHECK(fi_mr_bind(m1, &c->fid, FI_SEND) < 0);
	CHECK(fi_cntr_read(c) == 0);
	/* A counter bound to a registration cannot be closed before it. */
	EXPECT(fi_close(&c->fid), -FI_EBUSY);
	/* Raw keys (fi_mr(3): safe with any registration, any valid key):
	 * 8 bytes, base address 0 (remote addresses are offsets); mapped
	 * back, the key itself. */
	{
		uint8_t raw[16];
		uint64_t base = 99, mapped = 0;
		size_t ks = 4;
		EXPECT(fi_mr_raw_attr(m1, &base, raw, &ks, 0), -FI_ETOOSMALL);
		CHECK(ks == 8 && ks == pi->domain_attr->mr_key_size);
		ks = sizeof(raw);
		EXPECT(fi_mr_raw_attr(m1, &base, raw, &ks, 0), 0);
		CHECK(ks == 8 && base == 0);
		EXPECT(fi_mr_raw_attr(m1, &base, raw, &ks, 1), -FI_EBADFLAGS);
		EXPECT(fi_mr_map_raw(d, base, raw, 8, &mapped, 0), 0);
		CHECK(mapped == fi_mr_key(m1));
		EXPECT(fi_mr_map_raw(d, base, raw, 4, &mapped, 0), -FI_EINVAL);
		EXPECT(fi_mr_unmap_key(d, mapped), 0);
		/* Registrations are enabled at once (no FI_MR_RMA_EVENT mode):
		 * fi_mr_enable has nothing to do. */
		EXPECT(fi_mr_enable(m1), 0);
	}
	EXPECT(fi_close(&d->fid), -FI_EBUSY);
	EXPECT(fi_close(&m1->fid), 0);
	EXPECT(fi_close(&m2->fid), 0);
	EXPECT(fi_close(&m3->fid), 0);
	EXPECT(fi_close(&m4->fid), 0);
	EXPECT(fi_close(&c->fid), 0);
	EXPECT(fi_close(&d->fid), 0);
	fi_freeinfo(pi);
}

/* fi_write / fi_read to a registered buffer of another endpoint, and
 * back; a wrong key gives an error completion and leaves the target as it
 * was. */
static void test_rma(void)
{
	struct fi_info *h = hints(), *pi;
	struct fid_domain *d;
	struct fid_av *v;
	struct fid_cq *cq[2];
	struct fid_ep *ep[2];
	struct fid_mr *mr;
	struct fi_av_attr aa = { .type = FI_AV_TABLE };
	struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_TAGGED };
	struct fi_cq_tagged_entry e;
	struct fi_cq_err_entry ee = { 0 };
	fi_addr_t to[2];
	static const size_t sizes[] = { 1, 8, 100, 4096, 70000, 1 << 20 };
	enum { N = 1 << 20 };
	static char target[N] __attribute__((aligned(64))), src[N], back[N];

	/* Before API 1.5, FI_MR_BASIC means virtual addresses as remote
	 * addresses, which shmfab does not take (offsets): no RMA or atomics
	 * then, asked for or not. */
	{
		struct fi_info *o = NULL;
		h->caps |= FI_RMA;
		EXPECT(fi_getinfo(FI_VERSION(1, 4), NULL, NULL, 0, h, &o), -FI_ENODATA);
		h->domain_attr->mr_mode = FI_MR_BASIC;
		EXPECT(fi_getinfo(FI_VERSION(1, 4), NULL, NULL, 0, h, &o), -FI_ENODATA);
		h->caps = FI_MSG | FI_ATOMIC;
		h->domain_attr->mr_mode = FI_MR_UNSPEC;
		EXPECT(fi_getinfo(FI_VERSION(1, 4), NULL, NULL, 0, h, &o), -FI_ENODATA);
		for (int m = 0; m < 2; m++) {
			h->caps = 0;
			h->domain_attr->mr_mode = m ? FI_MR_BASIC : FI_MR_UNSPEC;
			EXPECT(fi_getinfo(FI_VERSION(1, 4), NULL, NULL, 0, h, &o), 0);
			CHECK(o && !(o->caps & (FI_RMA | FI_ATOMIC | FI_RMA_EVENT)));
			CHECK(!(o->tx_attr->caps & (FI_RMA | FI_ATOMIC)) && o->tx_attr->rma_iov_limit == 0);
			CHECK(o->domain_attr->mr_mode == (m ? FI_MR_BASIC : FI_MR_SCALABLE));
			fi_freeinfo(o);
		}
		fi_freeinfo(h);
		h = hints();
	}
	/* RMA and atomics need provider keys: refused without them. */
	h->caps |= FI_RMA | FI_ATOMIC;
	EXPECT(getinfo(h, NULL), -FI_ENODATA);
	h = hints();
	h->caps |= FI_RMA | FI_REMOTE_WRITE;
	h->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_LOCAL;
	EXPECT(getinfo(h, NULL), -FI_ENODATA);
	/* Without them in the hints, the default capabilities leave them out. */
	h = hints();
	h->caps = 0;
	EXPECT(getinfo(h, &pi), 0);
	CHECK(!(pi->caps & (FI_RMA | FI_ATOMIC)) && pi->domain_attr->mr_mode == 0);
	fi_freeinfo(pi);
	h = hints();
	h->caps = 0;
	h->domain_attr->mr_mode = FI_MR_PROV_KEY | FI_MR_VIRT_ADDR;
	EXPECT(getinfo(h, &pi), 0);
	CHECK((pi->caps & (FI_RMA | FI_ATOMIC | FI_RMA_EVENT)) == (FI_RMA | FI_ATOMIC | FI_RMA_EVENT));
	CHECK(pi->domain_attr->mr_mode == FI_MR_PROV_KEY);
	fi_freeinfo(pi);
	h = hints();
	h->caps |= FI_RMA | FI_ATOMIC | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_RMA_EVENT;
	h->domain_attr->mr_mode = FI_MR_PROV_KEY;
	EXPECT(getinfo(h, &pi), 0);
	CHECK(pi->domain_attr->mr_mode == FI_MR_PROV_KEY && (pi->caps & FI_RMA) && (pi->tx_attr->caps & FI_ATOMIC));
	CHECK(pi->tx_attr->rma_iov_limit > 0);
	EXPECT(fi_domain(fabric, pi, &d, NULL), 0);
	EXPECT(fi_av_open(d, &aa, &v, NULL), 0);
	for (int i = 0; i < 2; i++) {
		char name[64];
		size_t len = sizeof(name);
		EXPECT(fi_cq_open(d, &ca, &cq[i], NULL), 0);
		EXPECT(fi_endpoint(d, pi, &ep[i], NULL), 0);
		EXPECT(fi_ep_bind(ep[i], &v->fid, 0), 0);
		EXPECT(fi_ep_bind(ep[i], &cq[i]->fid, FI_TRANSMIT | FI_RECV), 0);
		EXPECT(fi_enable(ep[i]), 0);
		EXPECT(fi_getname(&ep[i]->fid, name, &len), 0);
		EXPECT(fi_av_insert(v, name, 1, &to[i], 0, NULL), 1);
	}
	EXPECT(fi_mr_reg(d, target, N, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, &mr, NULL), 0);
	uint64_t key = fi_mr_key(mr);
	/* Remote-event counters on the registration (FI_RMA_EVENT). */
	struct fid_cntr *cw, *cr;
	struct fi_cntr_attr cat = { .events = FI_CNTR_EVENTS_COMP };
	EXPECT(fi_cntr_open(d, &cat, &cw, NULL), 0);
	EXPECT(fi_cntr_open(d, &cat, &cr, NULL), 0);
	EXPECT(fi_mr_bind(mr, &cw->fid, FI_REMOTE_WRITE), 0);
	EXPECT(fi_mr_bind(mr, &cr->fid, FI_REMOTE_READ), 0);
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		size_t n = sizes[k], off = k * 3;
		if (off + n > N)
			off = 0;
		for (size_t i = 0; i < n; i++)
			src[i] = (char)(i * 7 + k);
		EXPECT(fi_write(ep[0], src, n, NULL, to[1], off, key, &e), 0);
		read_tagged(cq[0], &e, NULL);
		CHECK(e.flags & FI_WRITE);
		CHECK(!memcmp(target + off, src, n));
		memset(back, 0, n);
		EXPECT(fi_read(ep[0], back, n, NULL, to[1], off, key, &e), 0);
		read_tagged(cq[0], &e, NULL);
		CHECK(e.flags & FI_READ);
		CHECK(!memcmp(back, src, n));
	}
	/* Each write and each read landed once. */
	CHECK(fi_cntr_read(cw) == sizeof(sizes) / sizeof(sizes[0]));
	CHECK(fi_cntr_read(cr) == sizeof(sizes) / sizeof(sizes[0]));
	/* A wrong key: an error completion; the target is untouched. */
	memset(target, 'T', 64);
	memset(src, 'x', 64);
	EXPECT(fi_write(ep[0], src, 64, NULL, to[1], 0, key ^ 0x5a5a0000, NULL), 0);
	ssize_t r = -FI_EAGAIN;
	for (int i = 0; i < 1000000 && r == -FI_EAGAIN; i++)
		r = fi_cq_read(cq[0], &e, 1);
	EXPECT(r, -FI_EAVAIL);
	memset(&ee, 0, sizeof(ee)); /* err_data: the provider's, each time */
	EXPECT(fi_cq_readerr(cq[0], &ee, 0), 1);
	CHECK(ee.err != 0);
	for (int i = 0; i < 64; i++)
		CHECK(target[i] == 'T');
	/* Out of range: refused as well. */
	EXPECT(fi_write(ep[0], src, 64, NULL, to[1], N - 8, key, NULL), 0);
	r = -FI_EAGAIN;
	for (int i = 0; i < 1000000 && r == -FI_EAGAIN; i++)
		r = fi_cq_read(cq[0], &e, 1);
	EXPECT(r, -FI_EAVAIL);
	memset(&ee, 0, sizeof(ee)); /* err_data: the provider's, each time */
	EXPECT(fi_cq_readerr(cq[0], &ee, 0), 1);
	/* The refused writes counted nothing. */
	CHECK(fi_cntr_read(cw) == sizeof(sizes) / sizeof(sizes[0]));
	/* writev, readmsg and inject. */
	struct iovec wv[2] = { { src, 10 }, { src + 20, 10 } };
	memcpy(src, "0123456789abcdefghijKLMNOPQRST", 30);
	EXPECT(fi_writev(ep[0], wv, NULL, 2, to[1], 100, key, NULL), 0);
	read_tagged(cq[0], &e, NULL);
	CHECK(!memcmp(target + 100, "0123456789KLMNOPQRST", 20));
	EXPECT(fi_inject_write(ep[0], "inj", 3, to[1], 200, key), 0);
	CHECK(!memcmp(target + 200, "inj", 3));
	struct iovec rv = { back, 3 };
	struct fi_rma_iov ri = { 200, 3, key };
	struct fi_msg_rma m = { .msg_iov = &rv, .iov_count = 1, .addr = to[1], .rma_iov = &ri, .rma_iov_count = 1 };
	EXPECT(fi_readmsg(ep[0], &m, FI_COMPLETION), 0);
	read_tagged(cq[0], &e, NULL);
	CHECK(!memcmp(back, "inj", 3));

	/* Atomics: fetch-add, compare-swap (taken and refused), max. */
	uint64_t *w = (uint64_t *)(target + 512), one = 1, old = 0, cmp, nv;
	*w = 41;
	EXPECT(fi_fetch_atomic(ep[0], &one, 1, NULL, &old, NULL, to[1], 512, key, FI_UINT64, FI_SUM, NULL), 0);
	read_tagged(cq[0], &e, NULL);
	CHECK(old == 41 && *w == 42);
	cmp = 42, nv = 7;
	EXPECT(fi_compare_atomic(ep[0], &nv, 1, NULL, &cmp, NULL, &old, NULL, to[1], 512, key, FI_UINT64,
				 FI_CSWAP, NULL), 0);
	read_tagged(cq[0], &e, NULL);
	CHECK(old == 42 && *w == 7);
	cmp = 42, nv = 9;
	EXPECT(fi_compare_atomic(ep[0], &nv, 1, NULL, &cmp, NULL, &old, NULL, to[1], 512, key, FI_UINT64,
				 FI_CSWAP, NULL), 0);
	read_tagged(cq[0], &e, NULL);
	CHECK(old == 7 && *w == 7);
	nv = 100;
	EXPECT(fi_atomic(ep[0], &nv, 1, NULL, to[1], 512, key, FI_UINT64, FI_MAX, NULL), 0);
	read_tagged(cq[0], &e, NULL);
	CHECK(*w == 100);
	EXPECT(fi_fetch_atomic(ep[0], NULL, 1, NULL, &old, NULL, to[1], 512, key, FI_UINT64, FI_ATOMIC_READ, NULL), 0);
	read_tagged(cq[0], &e, NULL);
	CHECK(old == 100);
	/* A wrong key: an error completion, the word untouched. */
	EXPECT(fi_fetch_atomic(ep[0], &one, 1, NULL, &old, NULL, to[1], 512, key ^ 0x5a5a0000, FI_UINT64, FI_SUM,
			       NULL), 0);
	r = -FI_EAGAIN;
	for (int i = 0; i < 1000000 && r == -FI_EAGAIN; i++)
		r = fi_cq_read(cq[0], &e, 1);
	EXPECT(r, -FI_EAVAIL);
	memset(&ee, 0, sizeof(ee)); /* err_data: the provider's, each time */
	EXPECT(fi_cq_readerr(cq[0], &ee, 0), 1);
	CHECK(*w == 100);
	/* The valid queries and fi_query_atomic. */
	size_t cnt = 0;
	EXPECT(fi_atomicvalid(ep[0], FI_UINT64, FI_SUM, &cnt), 0);
	CHECK(cnt > 0);
	cnt = 0;
	EXPECT(fi_fetch_atomicvalid(ep[0], FI_DOUBLE, FI_MIN, &cnt), 0);
	CHECK(cnt > 0);
	EXPECT(fi_compare_atomicvalid(ep[0], FI_INT32, FI_CSWAP_GE, &cnt), 0);
	EXPECT(fi_compare_atomicvalid(ep[0], FI_UINT64, FI_SUM, &cnt), -FI_EOPNOTSUPP);
	EXPECT(fi_atomicvalid(ep[0], FI_UINT64, FI_CSWAP, &cnt), -FI_EOPNOTSUPP);
	EXPECT(fi_atomicvalid(ep[0], FI_LONG_DOUBLE, FI_SUM, &cnt), -FI_EOPNOTSUPP);
	struct fi_atomic_attr at;
	EXPECT(fi_query_atomic(d, FI_INT32, FI_CSWAP, &at, FI_COMPARE_ATOMIC), 0);
	CHECK(at.size == 4 && at.count > 0);
	EXPECT(fi_query_atomic(d, FI_INT32, FI_CSWAP, &at, 0), -FI_EOPNOTSUPP);

	/* fi_inject_atomic: applied when the call returns, no completion. */
	*w = 5;
	nv = 3;
	EXPECT(fi_inject_atomic(ep[0], &nv, 1, to[1], 512, key, FI_UINT64, FI_SUM), 0);
	CHECK(*w == 8);
	EXPECT(fi_cq_read(cq[0], &e, 1), -FI_EAGAIN);

	/* The RMA and atomic calls without flags take the endpoint's default
	 * op_flags, as fi_send does: with FI_SELECTIVE_COMPLETION, a
	 * completion exactly when the defaults hold FI_COMPLETION. */
	{
		struct fid_cq *scq;
		struct fid_ep *sep;
		uint64_t of = FI_TRANSMIT, one64 = 1, got = 0;
		EXPECT(fi_cq_open(d, &ca, &scq, NULL), 0);
		pi->tx_attr->op_flags = FI_COMPLETION;
		EXPECT(fi_endpoint(d, pi, &sep, NULL), 0);
		pi->tx_attr->op_flags = 0;
		EXPECT(fi_ep_bind(sep, &v->fid, 0), 0);
		EXPECT(fi_ep_bind(sep, &scq->fid, FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION), 0);
		EXPECT(fi_enable(sep), 0);
		EXPECT(fi_control(&sep->fid, FI_GETOPSFLAG, &of), 0);
		CHECK(of == FI_COMPLETION);
		struct iovec sv = { src, 4 };
		memcpy(src, "sel!", 4);
		for (int pass = 0; pass < 2; pass++) {
			void *cx = (void *)(uintptr_t)(0x5e10 + pass);
			int want = pass == 0; /* FI_COMPLETION in the defaults */
#define SEL(call)                                                              \
	do {                                                                   \
		EXPECT(call, 0);                                               \
		if (want) {                                                    \
			read_tagged(scq, &e, NULL);                            \
			CHECK(e.op_context == cx);                             \
		} else {                                                       \
			EXPECT(fi_cq_read(scq, &e, 1), -FI_EAGAIN);            \
		}                                                              \
	} while (0)
			SEL(fi_write(sep, src, 4, NULL, to[1], 600, key, cx));
			SEL(fi_writev(sep, &sv, NULL, 1, to[1], 604, key, cx));
			SEL(fi_read(sep, back, 4, NULL, to[1], 600, key, cx));
			CHECK(!memcmp(back, "sel!", 4));
			struct iovec bv = { back, 4 };
			SEL(fi_readv(sep, &bv, NULL, 1, to[1], 604, key, cx));
			SEL(fi_writedata(sep, src, 4, NULL, 0xda7a, to[1], 608, key, cx));
			read_tagged(cq[1], &e, NULL); /* the remote CQ data */
			CHECK(e.data == 0xda7a);
			*w = 0;
			SEL(fi_atomic(sep, &one64, 1, NULL, to[1], 512, key, FI_UINT64, FI_SUM, cx));
			SEL(fi_fetch_atomic(sep, &one64, 1, NULL, &got, NULL, to[1], 512, key, FI_UINT64, FI_SUM,
					    cx));
			CHECK(got == 1 && *w == 2);
			struct fi_ioc io = { &one64, 1 };
			SEL(fi_atomicv(sep, &io, NULL, 1, to[1], 512, key, FI_UINT64, FI_SUM, cx));
			cmp = 3, nv = 9;
			SEL(fi_compare_atomic(sep, &nv, 1, NULL, &cmp, NULL, &got, NULL, to[1], 512, key, FI_UINT64,
					      FI_CSWAP, cx));
			CHECK(got == 3 && *w == 9);
#undef SEL
			of = FI_TRANSMIT; /* no default flag: no completion */
			EXPECT(fi_control(&sep->fid, FI_SETOPSFLAG, &of), 0);
		}
		EXPECT(fi_close(&sep->fid), 0);
		EXPECT(fi_close(&scq->fid), 0);
	}
	EXPECT(fi_close(&mr->fid), 0);
	EXPECT(fi_close(&cw->fid), 0);
	EXPECT(fi_close(&cr->fid), 0);
	for (int i = 0; i < 2; i++) {
		EXPECT(fi_close(&ep[i]->fid), 0);
		EXPECT(fi_close(&cq[i]->fid), 0);
	}
	EXPECT(fi_close(&v->fid), 0);
	EXPECT(fi_close(&d->fid), 0);
	fi_freeinfo(pi);
}

/* FI_DELIVERY_COMPLETE (what Open MPI's btl ofi asks in tx_attr's
 * op_flags). On a send: it completes only once the receiver has the data
 * in its buffer (the send goes by rendezvous; the receiver's FIN
 * completes it), so a send to a peer that posted no receive stays
 * incomplete until it does. One-sided calls: done, data in the target,
 * before they return. */
static int no_entry_for(struct fid_cq *cq, struct fid_cq *other, int passes)
{
	struct fi_cq_tagged_entry e;
	for (int i = 0; i < passes; i++) {
		if (fi_cq_read(cq, &e, 1) != -FI_EAGAIN)
			return 0;
		if (other)
			(void)fi_cq_read(other, &e, 0); /* drives the peer's progress */
	}
	return 1;
}

static void test_delivery_complete(struct side *a, struct side *b)
{
	struct fi_info *h = hints(), *pi;
	struct fid_domain *d;
	struct fid_av *v;
	struct fid_cq *cq;
	struct fid_ep *ep;
	struct fid_mr *mr;
	struct fi_av_attr aa = { .type = FI_AV_TABLE };
	struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_TAGGED };
	struct fi_cq_tagged_entry e;
	static uint64_t target[8] __attribute__((aligned(64)));
	static char out[1 << 20], in[1 << 20];
	static const size_t sizes[] = { 8, 4096, 1 << 20 };
	uint64_t one = 1, old = 99, f;
	char name[64];
	size_t len = sizeof(name);
	fi_addr_t me;

	/* Sends, per call (fi_sendmsg, fi_tsendmsg) and as the endpoint's
	 * default (fi_send): held until the receive is posted and filled. */
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		size_t n = sizes[k];
		for (size_t i = 0; i < n; i++)
			out[i] = (char)(i * 3 + k);
		struct iovec iov = { out, n };
		struct fi_msg m = { .msg_iov = &iov, .iov_count = 1, .addr = b->addr, .context = (void *)0xdc0 };
		EXPECT(fi_sendmsg(a->ep, &m, FI_DELIVERY_COMPLETE | FI_COMPLETION), 0);
		CHECK(no_entry_for(a->cq, b->cq, 2000));
		memset(in, 0, n);
		EXPECT(fi_recv(b->ep, in, n, NULL, FI_ADDR_UNSPEC, (void *)0xdc1), 0);
		read_tagged(b->cq, &e, NULL);
		CHECK(e.op_context == (void *)0xdc1 && e.len == n && !memcmp(in, out, n));
		read_tagged(a->cq, &e, NULL);
		CHECK(e.op_context == (void *)0xdc0 && (e.flags & FI_SEND));
	}
	{
		struct iovec iov = { out, 8 };
		struct fi_msg_tagged tm = { .msg_iov = &iov, .iov_count = 1, .addr = b->addr, .tag = 0xdc,
					    .context = (void *)0xdc2 };
		EXPECT(fi_tsendmsg(a->ep, &tm, FI_DELIVERY_COMPLETE | FI_COMPLETION), 0);
		CHECK(no_entry_for(a->cq, b->cq, 2000));
		EXPECT(fi_trecv(b->ep, in, 8, NULL, FI_ADDR_UNSPEC, 0xdc, 0, (void *)0xdc3), 0);
		read_tagged(b->cq, &e, NULL);
		CHECK(e.op_context == (void *)0xdc3 && e.tag == 0xdc);
		read_tagged(a->cq, &e, NULL);
		CHECK(e.op_context == (void *)0xdc2);
	}
	f = FI_TRANSMIT | FI_DELIVERY_COMPLETE;
	EXPECT(fi_control(&a->ep->fid, FI_SETOPSFLAG, &f), 0);
	EXPECT(fi_send(a->ep, out, 100, NULL, b->addr, (void *)0xdc4), 0);
	CHECK(no_entry_for(a->cq, b->cq, 2000));
	EXPECT(fi_recv(b->ep, in, 100, NULL, FI_ADDR_UNSPEC, (void *)0xdc5), 0);
	read_tagged(b->cq, &e, NULL);
	read_tagged(a->cq, &e, NULL);
	CHECK(e.op_context == (void *)0xdc4);
	f = FI_TRANSMIT;
	EXPECT(fi_control(&a->ep->fid, FI_SETOPSFLAG, &f), 0);

	/* An endpoint for one-sided calls only, with it in its defaults. */
	h->caps = FI_RMA | FI_ATOMIC;
	h->domain_attr->mr_mode = FI_MR_PROV_KEY;
	h->tx_attr->op_flags = FI_DELIVERY_COMPLETE | FI_COMPLETION;
	EXPECT(getinfo(h, &pi), 0);
	CHECK(pi && pi->tx_attr->op_flags == (FI_DELIVERY_COMPLETE | FI_COMPLETION));
	EXPECT(fi_domain(fabric, pi, &d, NULL), 0);
	EXPECT(fi_av_open(d, &aa, &v, NULL), 0);
	EXPECT(fi_cq_open(d, &ca, &cq, NULL), 0);
	EXPECT(fi_endpoint(d, pi, &ep, NULL), 0);
	EXPECT(fi_ep_bind(ep, &v->fid, 0), 0);
	EXPECT(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV), 0);
	EXPECT(fi_enable(ep), 0);
	EXPECT(fi_getname(&ep->fid, name, &len), 0);
	EXPECT(fi_av_insert(v, name, 1, &me, 0, NULL), 1);
	f = FI_TRANSMIT;
	EXPECT(fi_control(&ep->fid, FI_GETOPSFLAG, &f), 0);
	CHECK(f == (FI_DELIVERY_COMPLETE | FI_COMPLETION));
	EXPECT(fi_mr_reg(d, target, sizeof(target), FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, &mr, NULL), 0);
	EXPECT(fi_write(ep, &one, 8, NULL, me, 0, fi_mr_key(mr), (void *)0xd1), 0);
	read_tagged(cq, &e, NULL);
	CHECK(e.op_context == (void *)0xd1 && (e.flags & FI_WRITE) && target[0] == 1);
	EXPECT(fi_fetch_atomic(ep, &one, 1, NULL, &old, NULL, me, 0, fi_mr_key(mr), FI_UINT64, FI_SUM,
			       (void *)0xd2), 0);
	read_tagged(cq, &e, NULL);
	CHECK(e.op_context == (void *)0xd2 && old == 1 && target[0] == 2);
	{
		uint64_t seven = 7;
		struct iovec iov = { .iov_base = &seven, .iov_len = 8 };
		struct fi_rma_iov ri = { .addr = 8, .len = 8, .key = fi_mr_key(mr) };
		struct fi_msg_rma m = { .msg_iov = &iov, .iov_count = 1, .addr = me, .rma_iov = &ri,
					.rma_iov_count = 1, .context = (void *)0xd3 };
		EXPECT(fi_writemsg(ep, &m, FI_DELIVERY_COMPLETE | FI_COMPLETION), 0);
		read_tagged(cq, &e, NULL);
		CHECK(e.op_context == (void *)0xd3 && target[1] == 7);
	}
	EXPECT(fi_close(&mr->fid), 0);
	EXPECT(fi_close(&ep->fid), 0);
	EXPECT(fi_close(&cq->fid), 0);
	EXPECT(fi_close(&v->fid), 0);
	EXPECT(fi_close(&d->fid), 0);
	fi_freeinfo(pi);
}

static void test_ops_flags(struct side *a, struct side *b)
{
	uint64_t f = FI_TRANSMIT;
	EXPECT(fi_control(&a->ep->fid, FI_GETOPSFLAG, &f), 0);
	CHECK(f == 0);
	f = FI_TRANSMIT | FI_COMPLETION;
	EXPECT(fi_control(&a->ep->fid, FI_SETOPSFLAG, &f), 0);
	f = FI_TRANSMIT;
	EXPECT(fi_control(&a->ep->fid, FI_GETOPSFLAG, &f), 0);
	CHECK(f == FI_COMPLETION);
	f = FI_TRANSMIT;
	EXPECT(fi_control(&a->ep->fid, FI_SETOPSFLAG, &f), 0);
	f = FI_TRANSMIT | FI_DELIVERY_COMPLETE;
	EXPECT(fi_control(&a->ep->fid, FI_SETOPSFLAG, &f), 0);
	f = FI_TRANSMIT | FI_MULTI_RECV;
	EXPECT(fi_control(&a->ep->fid, FI_SETOPSFLAG, &f), -FI_EBADFLAGS);
	/* FI_INJECT by default: the buffer is free on return. */
	f = FI_TRANSMIT | FI_INJECT | FI_COMPLETION;
	EXPECT(fi_control(&a->ep->fid, FI_SETOPSFLAG, &f), 0);
	{
		struct fi_cq_tagged_entry e;
		char out[8] = "inject", in[8] = { 0 };
		static char big[8192];
		EXPECT(fi_recv(b->ep, in, sizeof(in), NULL, FI_ADDR_UNSPEC, (void *)0xb7), 0);
		EXPECT(fi_send(a->ep, out, sizeof(out), NULL, b->addr, (void *)0xa7), 0);
		memset(out, 'x', sizeof(out));
		read_tagged(b->cq, &e, NULL);
		CHECK(e.op_context == (void *)0xb7 && !strcmp(in, "inject"));
		read_tagged(a->cq, &e, NULL);
		CHECK(e.op_context == (void *)0xa7);
		EXPECT(fi_send(a->ep, big, sizeof(big), NULL, b->addr, NULL), -FI_EMSGSIZE);
	}
	f = FI_TRANSMIT;
	EXPECT(fi_control(&a->ep->fid, FI_SETOPSFLAG, &f), 0);
	struct fi_info *ih = hints();
	ih->tx_attr->op_flags = FI_INJECT;
	EXPECT(getinfo(ih, NULL), 0);
	size_t v = 128, len = sizeof(v);
	EXPECT(fi_setopt(&a->ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &v, sizeof(v)), 0);
	v = 0;
	EXPECT(fi_getopt(&a->ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &v, &len), 0);
	CHECK(v == 128 && len == sizeof(v));
	EXPECT(fi_getopt(&a->ep->fid, FI_OPT_ENDPOINT, FI_OPT_CM_DATA_SIZE, &v, &len), -FI_ENOPROTOOPT);
}

static void test_eq(void)
{
	struct fid_eq *eq;
	struct fi_eq_attr attr = { .wait_obj = FI_WAIT_UNSPEC };
	uint32_t ev = 0;
	char buf[16];

	EXPECT(fi_eq_open(fabric, &attr, &eq, NULL), 0);
	/* A domain's asynchronous events go to an EQ of its fabric (this
	 * one has none); registrations through the EQ are not built. */
	EXPECT(fi_domain_bind(domain, &eq->fid, 0), 0);
	EXPECT(fi_domain_bind(domain, &eq->fid, FI_REG_MR), -FI_ENOSYS);
	EXPECT(fi_domain_bind(domain, &av->fid, 0), -FI_EINVAL);
	EXPECT(fi_eq_read(eq, &ev, buf, sizeof(buf), 0), -FI_EAGAIN);
	EXPECT(fi_eq_sread(eq, &ev, buf, sizeof(buf), 10, 0), -FI_EAGAIN);
	EXPECT(fi_eq_write(eq, FI_NOTIFY, "event", 6, 0), 6);
	EXPECT(fi_eq_read(eq, &ev, buf, 2, 0), -FI_ETOOSMALL);
	EXPECT(fi_eq_read(eq, &ev, buf, sizeof(buf), FI_PEEK), 6);
	EXPECT(fi_eq_sread(eq, &ev, buf, sizeof(buf), -1, 0), 6);
	CHECK(ev == FI_NOTIFY && !strcmp(buf, "event"));
	EXPECT(fi_eq_read(eq, &ev, buf, sizeof(buf), 0), -FI_EAGAIN);
	/* The fabric is busy while the EQ is open. */
	EXPECT(fi_close(&fabric->fid), -FI_EBUSY);

	/* An AV opened with FI_EVENT reports its inserts through the EQ: an
	 * error entry per failed address (its index), then FI_AV_COMPLETE
	 * with the number inserted. */
	struct fid_av *av2;
	struct fi_av_attr aa = { .type = FI_AV_TABLE, .flags = FI_EVENT };
	struct fi_eq_entry done;
	struct fi_eq_err_entry err;
	char addrs[48];
	size_t len = 24;
	fi_addr_t fa[2];
	EXPECT(fi_av_open(domain, &aa, &av2, NULL), 0);
	EXPECT(fi_av_lookup(av, 0, addrs, &len), 0); /* a valid address */
	memset(addrs + 24, 0, 24);                   /* and an invalid one */
	EXPECT(fi_av_insert(av2, addrs, 2, fa, 0, (void *)0x77), -FI_ENOEQ);
	EXPECT(fi_av_bind(av2, &eq->fid, 0), 0);
	EXPECT(fi_av_insert(av2, addrs, 2, fa, 0, (void *)0x77), 0);
	EXPECT(fi_eq_read(eq, &ev, &done, sizeof(done), 0), -FI_EAVAIL);
	memset(&err, 0, sizeof(err));
	EXPECT(fi_eq_readerr(eq, &err, 0), sizeof(err));
	CHECK(err.fid == &av2->fid && err.context == (void *)0x77 && err.data == 1 && err.err == FI_EINVAL);
	EXPECT(fi_eq_readerr(eq, &err, 0), -FI_EAGAIN);
	EXPECT(fi_eq_sread(eq, &ev, &done, sizeof(done), 1000, 0), sizeof(done));
	CHECK(ev == FI_AV_COMPLETE && done.fid == &av2->fid && done.context == (void *)0x77 && done.data == 1);
	CHECK(fa[1] == FI_ADDR_NOTAVAIL);
	EXPECT(fi_close(&eq->fid), -FI_EBUSY); /* bound to the AV */
	EXPECT(fi_close(&av2->fid), 0);
	EXPECT(fi_close(&eq->fid), 0);
}

/* A shared receive context serving two endpoints: each message takes the
 * next buffer posted to it, and completes at the CQ of the endpoint that
 * received it. */
static void test_srx(struct side *a)
{
	struct fi_rx_attr ra = { .size = 8 };
	struct fid_ep *srx;
	struct side s[2];
	struct fi_cq_tagged_entry e;
	char buf[2][16] = { { 0 } };
	char name[64];
	size_t len;

	EXPECT(fi_srx_context(domain, &ra, &srx, NULL), 0);
	for (int i = 0; i < 2; i++) {
		struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_TAGGED };
		EXPECT(fi_cq_open(domain, &ca, &s[i].cq, NULL), 0);
		EXPECT(fi_endpoint(domain, info, &s[i].ep, NULL), 0);
		EXPECT(fi_ep_bind(s[i].ep, &av->fid, 0), 0);
		EXPECT(fi_ep_bind(s[i].ep, &s[i].cq->fid, FI_TRANSMIT | FI_RECV), 0);
		EXPECT(fi_ep_bind(s[i].ep, &srx->fid, 0), 0);
		EXPECT(fi_enable(s[i].ep), 0);
		len = sizeof(name);
		EXPECT(fi_getname(&s[i].ep->fid, name, &len), 0);
		EXPECT(fi_av_insert(av, name, 1, &s[i].addr, 0, NULL), 1);
	}
	/* Receives, untagged and tagged, go to the shared context, not the
	 * endpoint (test_srx_tagged posts tagged ones on the context). */
	EXPECT(fi_recv(s[0].ep, buf[0], 16, NULL, FI_ADDR_UNSPEC, NULL), -FI_EINVAL);
	EXPECT(fi_trecv(s[0].ep, buf[0], 16, NULL, FI_ADDR_UNSPEC, 1, 0, NULL), -FI_EINVAL);
	/* A segment with bytes needs a base, on the context too. */
	struct iovec bad[2] = { { NULL, 0 }, { NULL, 16 } };
	EXPECT(fi_recvv(srx, bad, NULL, 2, FI_ADDR_UNSPEC, NULL), -FI_EINVAL);
	EXPECT(fi_trecvv(srx, bad, NULL, 2, FI_ADDR_UNSPEC, 1, 0, NULL), -FI_EINVAL);
	EXPECT(fi_recv(srx, buf[0], 16, NULL, FI_ADDR_UNSPEC, (void *)0x51), 0);
	EXPECT(fi_recv(srx, buf[1], 16, NULL, FI_ADDR_UNSPEC, (void *)0x52), 0);
	EXPECT(fi_send(a->ep, "to one", 7, NULL, s[1].addr, NULL), 0);
	read_tagged(s[1].cq, &e, NULL);
	CHECK(e.op_context == (void *)0x51 && !strcmp(buf[0], "to one"));
	EXPECT(fi_send(a->ep, "to zero", 8, NULL, s[0].addr, NULL), 0);
	read_tagged(s[0].cq, &e, NULL);
	CHECK(e.op_context == (void *)0x52 && !strcmp(buf[1], "to zero"));
	read_tagged(a->cq, &e, NULL);
	read_tagged(a->cq, &e, NULL);
	/* fi_cancel on the context: a posted buffer completes once as
	 * FI_ECANCELED in the CQ of the endpoint bound first; the next
	 * message takes the buffer posted after it. */
	struct fi_cq_err_entry err;
	EXPECT(fi_recv(srx, buf[0], 16, NULL, FI_ADDR_UNSPEC, (void *)0x53), 0);
	EXPECT(fi_recv(srx, buf[1], 16, NULL, FI_ADDR_UNSPEC, (void *)0x54), 0);
	EXPECT(fi_cancel(&srx->fid, (void *)0x53), 0);
	EXPECT(fi_cancel(&srx->fid, (void *)0x53), 0); /* nothing left: no entry */
	EXPECT(fi_cq_read(s[0].cq, &e, 1), -FI_EAVAIL);
	memset(&err, 0, sizeof(err));
	EXPECT(fi_cq_readerr(s[0].cq, &err, 0), 1);
	CHECK(err.err == FI_ECANCELED && err.op_context == (void *)0x53);
	EXPECT(fi_cq_read(s[0].cq, &e, 1), -FI_EAGAIN);
	EXPECT(fi_cq_read(s[1].cq, &e, 1), -FI_EAGAIN);
	EXPECT(fi_send(a->ep, "after", 6, NULL, s[1].addr, NULL), 0);
	read_tagged(s[1].cq, &e, NULL);
	CHECK(e.op_context == (void *)0x54 && !strcmp(buf[1], "after"));
	read_tagged(a->cq, &e, NULL);
	EXPECT(fi_close(&srx->fid), -FI_EBUSY); /* endpoints are bound to it */
	for (int i = 0; i < 2; i++)
		close_side(&s[i]);
	EXPECT(fi_close(&srx->fid), 0);

	/* The rx_attr fi_getinfo returned opens a context as it is. */
	EXPECT(fi_srx_context(domain, info->rx_attr, &srx, NULL), 0);
	EXPECT(fi_close(&srx->fid), 0);
	/* Asking for FI_SHARED_CONTEXT: the context serves every receive
	 * capability, offered when no capability is named. */
	struct fi_info *h = hints(), *si;
	h->ep_attr->rx_ctx_cnt = FI_SHARED_CONTEXT;
	EXPECT(getinfo(h, NULL), 0); /* FI_TAGGED */
	h = hints();
	h->caps = FI_MSG | FI_DIRECTED_RECV;
	h->ep_attr->rx_ctx_cnt = FI_SHARED_CONTEXT;
	EXPECT(getinfo(h, NULL), 0);
	h = hints();
	h->caps = FI_MSG;
	h->rx_attr->op_flags = FI_MULTI_RECV;
	h->ep_attr->rx_ctx_cnt = FI_SHARED_CONTEXT;
	EXPECT(getinfo(h, NULL), 0);
	h = hints();
	h->caps = 0;
	h->ep_attr->rx_ctx_cnt = FI_SHARED_CONTEXT;
	EXPECT(getinfo(h, &si), 0);
	CHECK(si->ep_attr->rx_ctx_cnt == FI_SHARED_CONTEXT && (si->caps & FI_MSG));
	CHECK((si->caps & (FI_TAGGED | FI_DIRECTED_RECV | FI_MULTI_RECV)) ==
	      (FI_TAGGED | FI_DIRECTED_RECV | FI_MULTI_RECV));
	EXPECT(fi_srx_context(domain, si->rx_attr, &srx, NULL), 0);
	EXPECT(fi_close(&srx->fid), 0);
	fi_freeinfo(si);
}

/* One completion at any of the `n` CQs: its index, with the entry in *e,
 * or -1 - index for an error entry (in *err). */
static int srx_read_any(struct fid_cq **cqs, int n, struct fi_cq_tagged_entry *e, struct fi_cq_err_entry *err)
{
	for (int i = 0; i < 1000000; i++) {
		for (int k = 0; k < n; k++) {
			ssize_t r = fi_cq_read(cqs[k], e, 1);
			if (r == 1)
				return k;
			if (r == -FI_EAVAIL) {
				memset(err, 0, sizeof(*err));
				EXPECT(fi_cq_readerr(cqs[k], err, 0), 1);
				return -1 - k;
			}
			EXPECT(r, -FI_EAGAIN);
		}
	}
	CHECK(!"a completion");
	return -100;
}

/* A peek or claim (no buffer) on the shared context `srx`. */
static void srx_probe(struct fid_ep *srx, uint64_t tag, uint64_t ignore, uint64_t flags, void *ctx)
{
	struct fi_msg_tagged m = { .iov_count = 0, .addr = FI_ADDR_UNSPEC, .tag = tag, .ignore = ignore, .context = ctx };
	EXPECT(fi_trecvmsg(srx, &m, flags), 0);
}

/* An SRX shared by three endpoints of a domain opened with
 * FI_SHARED_CONTEXT, FI_TAGGED, FI_DIRECTED_RECV and FI_MULTI_RECV, fed by
 * a fourth: tagged receives on the context (ignore masks; messages that
 * waited, unexpected, at different endpoints, each completing at the CQ
 * of its endpoint; a receive posted before its message), FI_PEEK,
 * FI_CLAIM and FI_DISCARD over the endpoints' unexpected messages,
 * directed receives, a FI_MULTI_RECV buffer carved by messages of all
 * three endpoints with FI_OPT_MIN_MULTI_RECV set on the context (its last
 * completion has FI_MULTI_RECV), and fi_cancel of each kind. */
static void test_srx_tagged(void)
{
	struct fi_info *h = hints(), *si;
	struct fid_domain *d;
	struct fid_av *v;
	struct fid_ep *srx, *r[3], *tx;
	struct fid_cq *cq[3], *txcq;
	struct fi_av_attr aa = { .type = FI_AV_TABLE };
	struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_TAGGED };
	struct fi_cq_tagged_entry e;
	struct fi_cq_err_entry err;
	fi_addr_t ra[3], ta;
	char name[64], buf[4][16], one[16];
	static char multi[256] __attribute__((aligned(8)));
	size_t len, mm = 64;
	int k, claimctx, dctx[2];

	h->caps = FI_MSG | FI_TAGGED | FI_DIRECTED_RECV | FI_MULTI_RECV;
	h->ep_attr->rx_ctx_cnt = FI_SHARED_CONTEXT;
	EXPECT(getinfo(h, &si), 0);
	CHECK((si->caps & (FI_TAGGED | FI_DIRECTED_RECV | FI_MULTI_RECV)) ==
	      (FI_TAGGED | FI_DIRECTED_RECV | FI_MULTI_RECV));
	EXPECT(fi_domain(fabric, si, &d, NULL), 0);
	EXPECT(fi_av_open(d, &aa, &v, NULL), 0);
	EXPECT(fi_srx_context(d, si->rx_attr, &srx, NULL), 0);
	for (k = 0; k < 4; k++) {
		struct fid_ep **ep = k < 3 ? &r[k] : &tx;
		struct fid_cq **c = k < 3 ? &cq[k] : &txcq;
		EXPECT(fi_cq_open(d, &ca, c, NULL), 0);
		EXPECT(fi_endpoint(d, si, ep, NULL), 0);
		EXPECT(fi_ep_bind(*ep, &v->fid, 0), 0);
		EXPECT(fi_ep_bind(*ep, &(*c)->fid, FI_TRANSMIT | FI_RECV), 0);
		if (k < 3)
			EXPECT(fi_ep_bind(*ep, &srx->fid, 0), 0);
		EXPECT(fi_enable(*ep), 0);
		len = sizeof(name);
		EXPECT(fi_getname(&(*ep)->fid, name, &len), 0);
		EXPECT(fi_av_insert(v, name, 1, k < 3 ? &ra[k] : &ta, 0, NULL), 1);
	}
	EXPECT(fi_setopt(&srx->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &mm, sizeof(mm)), 0);
	mm = 0;
	len = sizeof(mm);
	EXPECT(fi_getopt(&srx->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &mm, &len), 0);
	CHECK(mm == 64 && len == sizeof(mm));
	/* Receives go through the context only. */
	EXPECT(fi_trecv(r[0], buf[0], 16, NULL, FI_ADDR_UNSPEC, 1, 0, NULL), -FI_EINVAL);

	/* Unexpected at three endpoints. */
	EXPECT(fi_tinject(tx, "at r0", 6, ra[0], 0x101), 0);
	EXPECT(fi_tinject(tx, "at r1", 6, ra[1], 0x102), 0);
	EXPECT(fi_tinject(tx, "at r2", 6, ra[2], 0x201), 0);
	/* A peek (any endpoint) for 0x2xx: found at r2, reported there; a
	 * miss is -FI_ENOMSG at the first endpoint's CQ. */
	for (int n = 0;; n++) {
		srx_probe(srx, 0x200, 0xff, FI_PEEK, &claimctx);
		k = srx_read_any(cq, 3, &e, &err);
		if (k >= 0)
			break;
		CHECK(k == -1 && err.err == FI_ENOMSG && err.op_context == &claimctx && n < 100000);
	}
	CHECK(k == 2 && e.tag == 0x201 && e.len == 6 && e.op_context == &claimctx && e.buf == NULL);
	/* Claim it; then a receive for 0x1xx (ignore mask) takes the ones at
	 * r0 and r1, each completing at its endpoint's CQ. */
	srx_probe(srx, 0x201, 0, FI_PEEK | FI_CLAIM, &claimctx);
	CHECK(srx_read_any(cq, 3, &e, &err) == 2 && e.tag == 0x201);
	EXPECT(fi_trecv(srx, buf[0], 16, NULL, FI_ADDR_UNSPEC, 0x100, 0xfff, (void *)0x61), 0);
	EXPECT(fi_trecv(srx, buf[1], 16, NULL, FI_ADDR_UNSPEC, 0x100, 0xfff, (void *)0x62), 0);
	int seen = 0;
	for (int n = 0; n < 2; n++) {
		k = srx_read_any(cq, 3, &e, &err);
		CHECK(k == 0 || k == 1);
		CHECK(e.tag == (uint64_t)(0x101 + k) && (e.flags & (FI_TAGGED | FI_RECV)) == (FI_TAGGED | FI_RECV));
		CHECK(!strcmp(e.op_context == (void *)0x61 ? buf[0] : buf[1], k ? "at r1" : "at r0"));
		seen |= 1 << k;
	}
	CHECK(seen == 3); /* not the claimed one */
	/* The claim's receive, posted on the context, delivers at r2. */
	struct iovec iv = { .iov_base = one, .iov_len = sizeof(one) };
	struct fi_msg_tagged cm = { .msg_iov = &iv, .iov_count = 1, .addr = FI_ADDR_UNSPEC, .context = &claimctx };
	EXPECT(fi_trecvmsg(srx, &cm, FI_CLAIM), 0);
	CHECK(srx_read_any(cq, 3, &e, &err) == 2 && e.op_context == &claimctx && !strcmp(one, "at r2"));
	EXPECT(fi_trecvmsg(srx, &cm, FI_CLAIM), -FI_EINVAL); /* received once */
	/* Peek and discard: gone. */
	EXPECT(fi_tinject(tx, "gone", 5, ra[1], 0x301), 0);
	for (int n = 0;; n++) {
		srx_probe(srx, 0x301, 0, FI_PEEK | FI_DISCARD, &claimctx);
		if ((k = srx_read_any(cq, 3, &e, &err)) >= 0)
			break;
		CHECK(n < 100000);
	}
	CHECK(k == 1 && e.len == 5);
	srx_probe(srx, 0x301, 0, FI_PEEK, &claimctx);
	CHECK(srx_read_any(cq, 3, &e, &err) == -1 && err.err == FI_ENOMSG);
	/* Posted before its message (fi_trecvv). */
	iv.iov_base = buf[2];
	iv.iov_len = 16;
	EXPECT(fi_trecvv(srx, &iv, NULL, 1, FI_ADDR_UNSPEC, 0x400, 0, (void *)0x63), 0);
	EXPECT(fi_tinject(tx, "posted", 7, ra[2], 0x400), 0);
	CHECK(srx_read_any(cq, 3, &e, &err) == 2 && e.op_context == (void *)0x63 && !strcmp(buf[2], "posted"));

	/* Directed: a source in the receiving endpoint's AV. */
	EXPECT(fi_recv(srx, buf[0], 16, NULL, ra[0], &dctx[0]), 0); /* r0 sends nothing */
	EXPECT(fi_recv(srx, buf[1], 16, NULL, ta, &dctx[1]), 0);
	EXPECT(fi_recv(srx, buf[2], 16, NULL, 77, NULL), -FI_EADDRNOTAVAIL);
	EXPECT(fi_inject(tx, "from tx", 8, ra[1]), 0);
	k = srx_read_any(cq, 3, &e, &err);
	CHECK(k == 1 && e.op_context == &dctx[1] && !strcmp(buf[1], "from tx"));

	/* FI_MULTI_RECV: 256 bytes, released below 64. Messages of 56 bytes
	 * land one after the other, whichever endpoint took them; the fourth
	 * leaves 32: its completion has FI_MULTI_RECV. */
	struct iovec mv = { .iov_base = multi, .iov_len = sizeof(multi) };
	struct fi_msg mm_msg = { .msg_iov = &mv, .iov_count = 1, .addr = FI_ADDR_UNSPEC, .context = (void *)0x70 };
	struct fi_msg_tagged tmm = { .msg_iov = &mv, .iov_count = 1, .addr = FI_ADDR_UNSPEC, .context = (void *)0x70 };
	EXPECT(fi_trecvmsg(srx, &tmm, FI_MULTI_RECV), -FI_EBADFLAGS); /* untagged only */
	EXPECT(fi_recvmsg(srx, &mm_msg, FI_MULTI_RECV), 0);
	for (int n = 0; n < 4; n++) {
		char m[56];
		memset(m, 'a' + n, sizeof(m));
		EXPECT(fi_inject(tx, m, sizeof(m), ra[n % 3]), 0);
		k = srx_read_any(cq, 3, &e, &err);
		CHECK(k == n % 3 && e.op_context == (void *)0x70 && e.len == 56);
		CHECK((char *)e.buf == multi + 56 * n && multi[56 * n] == 'a' + n);
		CHECK(!!(e.flags & FI_MULTI_RECV) == (n == 3));
	}

	/* fi_cancel of each kind: a multi-receive buffer (released: its entry
	 * has FI_MULTI_RECV), a tagged one, and the directed one left. */
	EXPECT(fi_recvmsg(srx, &mm_msg, FI_MULTI_RECV), 0);
	EXPECT(fi_trecv(srx, buf[3], 16, NULL, FI_ADDR_UNSPEC, 0x500, 0, (void *)0x71), 0);
	EXPECT(fi_cancel(&srx->fid, (void *)0x70), 0);
	EXPECT(fi_cancel(&srx->fid, (void *)0x71), 0);
	EXPECT(fi_cancel(&srx->fid, &dctx[0]), 0);
	void *want[3] = { (void *)0x70, &dctx[0], (void *)0x71 };
	uint64_t wflags[3] = { FI_MULTI_RECV, 0, FI_TAGGED };
	for (int n = 0; n < 3; n++) {
		k = srx_read_any(cq, 3, &e, &err);
		CHECK(k == -1 && err.err == FI_ECANCELED);
		int w = err.op_context == want[0] ? 0 : err.op_context == want[1] ? 1 : 2;
		CHECK(err.op_context == want[w] && (err.flags & (FI_MULTI_RECV | FI_TAGGED)) == wflags[w]);
	}
	for (k = 0; k < 3; k++)
		EXPECT(fi_cq_read(cq[k], &e, 1), -FI_EAGAIN);

	EXPECT(fi_close(&srx->fid), -FI_EBUSY);
	for (k = 0; k < 3; k++) {
		EXPECT(fi_close(&r[k]->fid), 0);
		EXPECT(fi_close(&cq[k]->fid), 0);
	}
	EXPECT(fi_close(&tx->fid), 0);
	EXPECT(fi_close(&txcq->fid), 0);
	EXPECT(fi_close(&srx->fid), 0);
	EXPECT(fi_close(&v->fid), 0);
	EXPECT(fi_close(&d->fid), 0);
	fi_freeinfo(si);
}

/* fi_close(ep) discards outstanding operations with no completions
 * (fi_endpoint(3)): receives posted, tagged, untagged and multi-receive,
 * leave no entry in the CQ the endpoint shared with another one. */
/* Resource management (fi_domain(3)): offered when the hints ask for it,
 * FI_RM_DISABLED otherwise; with it, a send whose completion would not fit
 * its transmit CQ fails with -FI_EAGAIN (inline sizes complete at once,
 * rendezvous ones hold their entry until the receiver takes the data),
 * and posting works again once entries are read. */
static void test_resource_mgmt(void)
{
	enum { N = 4, BIG = 1 << 20 };
	struct fi_info *h, *i;
	struct fid_fabric *fab;
	struct fid_domain *dom;
	struct fid_av *rav;
	struct fid_cq *txcq, *rxcq, *cq1;
	struct fid_ep *ep0, *ep1;
	struct fi_av_attr aa = { .type = FI_AV_TABLE };
	struct fi_cq_attr small = { .format = FI_CQ_FORMAT_TAGGED, .size = N };
	struct fi_cq_attr dflt = { .format = FI_CQ_FORMAT_TAGGED };
	struct fi_cq_tagged_entry e[N + 1];
	char name[64];
	size_t len = sizeof(name);
	fi_addr_t to;
	static char out[BIG], in[N + 1][BIG];

	EXPECT(getinfo(hints(), &i), 0);
	EXPECT(i->domain_attr->resource_mgmt, FI_RM_DISABLED);
	fi_freeinfo(i);
	h = hints();
	h->domain_attr->resource_mgmt = FI_RM_ENABLED;
	EXPECT(getinfo(h, &i), 0);
	EXPECT(i->domain_attr->resource_mgmt, FI_RM_ENABLED);

	EXPECT(fi_fabric(i->fabric_attr, &fab, NULL), 0);
	EXPECT(fi_domain(fab, i, &dom, NULL), 0);
	EXPECT(fi_av_open(dom, &aa, &rav, NULL), 0);
	EXPECT(fi_cq_open(dom, &small, &txcq, NULL), 0);
	EXPECT(fi_cq_open(dom, &dflt, &rxcq, NULL), 0);
	EXPECT(fi_cq_open(dom, &dflt, &cq1, NULL), 0);
	EXPECT(fi_endpoint(dom, i, &ep0, NULL), 0);
	EXPECT(fi_endpoint(dom, i, &ep1, NULL), 0);
	EXPECT(fi_ep_bind(ep0, &rav->fid, 0), 0);
	EXPECT(fi_ep_bind(ep1, &rav->fid, 0), 0);
	EXPECT(fi_ep_bind(ep0, &txcq->fid, FI_TRANSMIT), 0);
	EXPECT(fi_ep_bind(ep0, &rxcq->fid, FI_RECV), 0);
	EXPECT(fi_ep_bind(ep1, &cq1->fid, FI_TRANSMIT | FI_RECV), 0);
	EXPECT(fi_enable(ep0), 0);
	EXPECT(fi_enable(ep1), 0);
	EXPECT(fi_getname(&ep1->fid, name, &len), 0);
	EXPECT(fi_av_insert(rav, name, 1, &to, 0, NULL), 1);

	for (int big = 0; big < 2; big++) {
		size_t sz = big ? BIG : 8;
		for (int k = 0; k < N; k++)
			EXPECT(fi_send(ep0, out, sz, NULL, to, (void *)(uintptr_t)(0x100 + k)), 0);
		/* The transmit CQ of N entries is full (or reserved): refused. */
		EXPECT(fi_send(ep0, out, sz, NULL, to, (void *)0x1ff), -FI_EAGAIN);
		EXPECT(fi_send(ep0, out, sz, NULL, to, (void *)0x1ff), -FI_EAGAIN);
		for (int k = 0; k < N; k++) {
			EXPECT(fi_recv(ep1, in[k], sz, NULL, FI_ADDR_UNSPEC, (void *)(uintptr_t)(0x200 + k)), 0);
			read_tagged(cq1, &e[0], NULL);
			CHECK(e[0].op_context == (void *)(uintptr_t)(0x200 + k) && e[0].len == sz);
		}
		for (int k = 0; k < N; k++) {
			read_tagged(txcq, &e[0], NULL);
			CHECK(e[0].op_context == (void *)(uintptr_t)(0x100 + k));
		}
		/* Room again: the refused send goes through, and arrives alone. */
		EXPECT(fi_send(ep0, out, sz, NULL, to, (void *)0x1ff), 0);
		EXPECT(fi_recv(ep1, in[N], sz, NULL, FI_ADDR_UNSPEC, (void *)0x2ff), 0);
		read_tagged(cq1, &e[0], NULL);
		CHECK(e[0].op_context == (void *)0x2ff);
		read_tagged(txcq, &e[0], NULL);
		CHECK(e[0].op_context == (void *)0x1ff);
		EXPECT(fi_cq_read(cq1, e, N + 1), -FI_EAGAIN);
	}

	EXPECT(fi_close(&ep0->fid), 0);
	EXPECT(fi_close(&ep1->fid), 0);
	EXPECT(fi_close(&txcq->fid), 0);
	EXPECT(fi_close(&rxcq->fid), 0);
	EXPECT(fi_close(&cq1->fid), 0);
	EXPECT(fi_close(&rav->fid), 0);
	EXPECT(fi_close(&dom->fid), 0);
	EXPECT(fi_close(&fab->fid), 0);
	fi_freeinfo(i);
}

static void test_close_discards(void)
{
	struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_TAGGED };
	struct fi_cq_tagged_entry e;
	struct fid_cq *cq;
	struct fid_ep *ep[2];
	char buf[3][64];
	struct iovec iov = { .iov_base = buf[2], .iov_len = sizeof(buf[2]) };
	struct fi_msg m = { .msg_iov = &iov, .iov_count = 1, .addr = FI_ADDR_UNSPEC, .context = (void *)0xd3 };

	EXPECT(fi_cq_open(domain, &ca, &cq, NULL), 0);
	for (int i = 0; i < 2; i++) {
		EXPECT(fi_endpoint(domain, info, &ep[i], NULL), 0);
		EXPECT(fi_ep_bind(ep[i], &av->fid, 0), 0);
		EXPECT(fi_ep_bind(ep[i], &cq->fid, FI_TRANSMIT | FI_RECV), 0);
		EXPECT(fi_enable(ep[i]), 0);
	}
	EXPECT(fi_recv(ep[0], buf[0], 64, NULL, FI_ADDR_UNSPEC, (void *)0xd1), 0);
	EXPECT(fi_trecv(ep[0], buf[1], 64, NULL, FI_ADDR_UNSPEC, 4, 0, (void *)0xd2), 0);
	EXPECT(fi_recvmsg(ep[0], &m, FI_MULTI_RECV), 0);
	EXPECT(fi_close(&ep[0]->fid), 0);
	for (int i = 0; i < 1000; i++)
		EXPECT(fi_cq_read(cq, &e, 1), -FI_EAGAIN);
	EXPECT(fi_close(&ep[1]->fid), 0);
	EXPECT(fi_close(&cq->fid), 0);
}

/* FI_SOURCE_ERR (fi_cq(3)): only on request, paired with FI_SOURCE; a
 * message from an address not in the AV is an FI_EADDRNOTAVAIL error
 * entry whose err_data is that address, which fi_av_insert takes; the
 * next message from it then has its fi_addr. */
static void test_source_err(struct side *a)
{
	struct fi_av_attr aa = { .type = FI_AV_TABLE };
	struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_TAGGED };
	struct fi_cq_tagged_entry e;
	struct fi_cq_err_entry err;
	struct fi_info *h, *si;
	struct fid_av *av2;
	struct side s;
	char name[64], aname[64], buf[16], data[64];
	size_t len = sizeof(name), alen = sizeof(aname);
	fi_addr_t src, fa;

	CHECK(!(info->caps & FI_SOURCE_ERR)); /* not a default */
	h = hints();
	h->caps |= FI_SOURCE_ERR;
	EXPECT(getinfo(h, NULL), -FI_ENODATA); /* without FI_SOURCE */
	h = hints();
	h->caps |= FI_SOURCE | FI_SOURCE_ERR;
	EXPECT(getinfo(h, &si), 0);
	CHECK((si->caps & (FI_SOURCE | FI_SOURCE_ERR)) == (FI_SOURCE | FI_SOURCE_ERR));
	CHECK(si->rx_attr->caps & FI_SOURCE_ERR);

	EXPECT(fi_av_open(domain, &aa, &av2, NULL), 0);
	EXPECT(fi_cq_open(domain, &ca, &s.cq, NULL), 0);
	EXPECT(fi_endpoint(domain, si, &s.ep, NULL), 0);
	EXPECT(fi_ep_bind(s.ep, &av2->fid, 0), 0);
	EXPECT(fi_ep_bind(s.ep, &s.cq->fid, FI_TRANSMIT | FI_RECV), 0);
	EXPECT(fi_enable(s.ep), 0);
	EXPECT(fi_getname(&s.ep->fid, name, &len), 0);
	EXPECT(fi_av_insert(av, name, 1, &s.addr, 0, NULL), 1); /* a knows s */
	EXPECT(fi_getname(&a->ep->fid, aname, &alen), 0);

	EXPECT(fi_recv(s.ep, buf, sizeof(buf), NULL, FI_ADDR_UNSPEC, (void *)0xe1), 0);
	EXPECT(fi_send(a->ep, "who?", 5, NULL, s.addr, NULL), 0);
	int r = -FI_EAGAIN;
	for (int i = 0; i < 1000000 && r == -FI_EAGAIN; i++)
		r = fi_cq_readfrom(s.cq, &e, 1, &src);
	EXPECT(r, -FI_EAVAIL);
	memset(&err, 0, sizeof(err));
	err.err_data = data;
	err.err_data_size = sizeof(data);
	EXPECT(fi_cq_readerr(s.cq, &err, 0), 1);
	CHECK(err.err == FI_EADDRNOTAVAIL && err.op_context == (void *)0xe1 && err.len == 5);
	CHECK(err.err_data_size == alen && !memcmp(data, aname, alen));
	CHECK(!strcmp(buf, "who?")); /* received whole */
	EXPECT(fi_av_insert(av2, data, 1, &fa, 0, NULL), 1);
	EXPECT(fi_recv(s.ep, buf, sizeof(buf), NULL, FI_ADDR_UNSPEC, (void *)0xe2), 0);
	EXPECT(fi_send(a->ep, "known", 6, NULL, s.addr, NULL), 0);
	src = FI_ADDR_NOTAVAIL;
	r = -FI_EAGAIN;
	for (int i = 0; i < 1000000 && r == -FI_EAGAIN; i++)
		r = fi_cq_readfrom(s.cq, &e, 1, &src);
	EXPECT(r, 1);
	CHECK(e.op_context == (void *)0xe2 && src == fa && !strcmp(buf, "known"));
	/* The provider's own err_data buffer, when the caller gives none. */
	EXPECT(fi_av_remove(av2, &fa, 1, 0), 0);
	EXPECT(fi_recv(s.ep, buf, sizeof(buf), NULL, FI_ADDR_UNSPEC, (void *)0xe3), 0);
	EXPECT(fi_send(a->ep, "gone", 5, NULL, s.addr, NULL), 0);
	r = -FI_EAGAIN;
	for (int i = 0; i < 1000000 && r == -FI_EAGAIN; i++)
		r = fi_cq_read(s.cq, &e, 1);
	EXPECT(r, -FI_EAVAIL);
	memset(&err, 0, sizeof(err));
	EXPECT(fi_cq_readerr(s.cq, &err, 0), 1);
	CHECK(err.err == FI_EADDRNOTAVAIL && err.op_context == (void *)0xe3);
	CHECK(err.err_data && err.err_data_size == alen && !memcmp(err.err_data, aname, alen));
	for (int i = 0; i < 3; i++)
		read_tagged(a->cq, &e, NULL);
	EXPECT(fi_close(&s.ep->fid), 0);
	EXPECT(fi_close(&s.cq->fid), 0);
	EXPECT(fi_close(&av2->fid), 0);
	EXPECT(fi_av_remove(av, &s.addr, 1, 0), 0);
	fi_freeinfo(si);
}

/* Multi-receive buffers, selective completion with the endpoint's
 * default flags, a send counter, AV removal, automatic progress. */
static void test_misc(struct side *a, struct side *b)
{
	struct fi_cq_tagged_entry e;
	static char mbuf[64];
	struct iovec iov = { mbuf, sizeof(mbuf) };
	struct fi_msg m = { .msg_iov = &iov, .iov_count = 1, .addr = FI_ADDR_UNSPEC, .context = (void *)0x3 };
	size_t min = 16;

	/* Multi-receive: 16-byte messages land one after the other; the one
	 * that leaves less than FI_OPT_MIN_MULTI_RECV releases the buffer. */
	EXPECT(fi_setopt(&b->ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &min, sizeof(min)), 0);
	EXPECT(fi_recvmsg(b->ep, &m, FI_MULTI_RECV), 0);
	for (int i = 0; i < 4; i++) {
		char msg[16];
		memset(msg, 'a' + i, sizeof(msg));
		EXPECT(fi_send(a->ep, msg, sizeof(msg), NULL, b->addr, NULL), 0);
		read_tagged(b->cq, &e, NULL);
		read_tagged(a->cq, &e, NULL);
	}
	/* (the receive side's entries, read above in order, are checked
	 * through the buffer: each message at its own 16 bytes) */
	for (int i = 0; i < 4; i++)
		CHECK(mbuf[16 * i] == 'a' + i && mbuf[16 * i + 15] == 'a' + i);

	/* The release flag, read this time. */
	EXPECT(fi_recvmsg(b->ep, &m, FI_MULTI_RECV), 0);
	for (int i = 0; i < 4; i++) {
		EXPECT(fi_send(a->ep, "0123456789abcde", 16, NULL, b->addr, NULL), 0);
		read_tagged(b->cq, &e, NULL);
		CHECK(e.op_context == (void *)0x3 && e.len == 16 && e.buf == mbuf + 16 * i);
		CHECK(!!(e.flags & FI_MULTI_RECV) == (i == 3));
		read_tagged(a->cq, &e, NULL);
	}
	min = 64;
	EXPECT(fi_setopt(&b->ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &min, sizeof(min)), 0);

	/* Selective completion: only sends that ask have an entry; the
	 * endpoint's default op_flags (FI_SETOPSFLAG) ask for fi_send. */
	struct side s;
	struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_TAGGED };
	struct fi_cntr_attr na = { .events = FI_CNTR_EVENTS_COMP, .wait_obj = FI_WAIT_UNSPEC };
	struct fid_cntr *sent;
	char name[64], in[8];
	size_t len = sizeof(name);
	uint64_t f;

	EXPECT(fi_cq_open(domain, &ca, &s.cq, NULL), 0);
	EXPECT(fi_cntr_open(domain, &na, &sent, NULL), 0);
	EXPECT(fi_endpoint(domain, info, &s.ep, NULL), 0);
	EXPECT(fi_ep_bind(s.ep, &av->fid, 0), 0);
	EXPECT(fi_ep_bind(s.ep, &s.cq->fid, FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION), 0);
	EXPECT(fi_ep_bind(s.ep, &sent->fid, FI_SEND), 0);
	EXPECT(fi_enable(s.ep), 0);
	EXPECT(fi_getname(&s.ep->fid, name, &len), 0);
	EXPECT(fi_av_insert(av, name, 1, &s.addr, 0, NULL), 1);

	EXPECT(fi_recv(b->ep, in, sizeof(in), NULL, FI_ADDR_UNSPEC, NULL), 0);
	EXPECT(fi_send(s.ep, "quiet", 6, NULL, b->addr, (void *)0x51), 0);
	read_tagged(b->cq, &e, NULL);
	EXPECT(fi_cntr_wait(sent, 1, 5000), 0); /* counted */
	EXPECT(fi_cq_read(s.cq, &e, 1), -FI_EAGAIN); /* no entry */
	f = FI_TRANSMIT | FI_COMPLETION;
	EXPECT(fi_control(&s.ep->fid, FI_SETOPSFLAG, &f), 0);
	EXPECT(fi_recv(b->ep, in, sizeof(in), NULL, FI_ADDR_UNSPEC, NULL), 0);
	EXPECT(fi_send(s.ep, "loud", 5, NULL, b->addr, (void *)0x52), 0);
	read_tagged(b->cq, &e, NULL);
	read_tagged(s.cq, &e, NULL);
	CHECK(e.op_context == (void *)0x52 && fi_cntr_read(sent) == 2);
	EXPECT(fi_close(&s.ep->fid), 0);
	EXPECT(fi_close(&s.cq->fid), 0);
	EXPECT(fi_close(&sent->fid), 0);

	/* AV removal: the handle no longer resolves, nor sends. */
	EXPECT(fi_av_remove(av, &s.addr, 1, 0), 0);
	len = sizeof(name);
	EXPECT(fi_av_lookup(av, s.addr, name, &len), -FI_ENOENT);
	EXPECT(fi_av_remove(av, &s.addr, 1, 0), -FI_ENOENT);

	/* Hints may name an open domain and fabric of this provider. */
	struct fi_info *nh = hints(), *ni;
	nh->domain_attr->domain = domain;
	nh->fabric_attr->fabric = fabric;
	EXPECT(getinfo(nh, &ni), 0);
	CHECK(ni->domain_attr->domain == domain && ni->fabric_attr->fabric == fabric);
	fi_freeinfo(ni);
	/* (an AV is no domain) */
	nh = hints();
	nh->domain_attr->domain = (struct fid_domain *)av;
	EXPECT(getinfo(nh, NULL), -FI_ENODATA);

	/* FI_PROGRESS_AUTO: a domain with its progress thread. */
	struct fi_info *h = hints(), *ai;
	struct fid_domain *d2;
	h->domain_attr->data_progress = FI_PROGRESS_AUTO;
	EXPECT(getinfo(h, &ai), 0);
	CHECK(ai->domain_attr->data_progress == FI_PROGRESS_AUTO);
	EXPECT(fi_domain(fabric, ai, &d2, NULL), 0);
	{
		/* Progress happens while the application sleeps, calling
		 * nothing: a message reaches the posted receive's buffer. */
		struct fid_av *av2;
		struct fid_cq *cq2[2];
		struct fid_ep *ep2[2];
		struct fi_av_attr aa2 = { .type = FI_AV_TABLE };
		struct fi_cq_attr ca2 = { .format = FI_CQ_FORMAT_CONTEXT };
		fi_addr_t to;
		char nm[64];
		static char in2[32];
		size_t nl = sizeof(nm);
		struct fi_cq_entry ce;

		EXPECT(fi_av_open(d2, &aa2, &av2, NULL), 0);
		for (int k = 0; k < 2; k++) {
			EXPECT(fi_cq_open(d2, &ca2, &cq2[k], NULL), 0);
			EXPECT(fi_endpoint(d2, ai, &ep2[k], NULL), 0);
			EXPECT(fi_ep_bind(ep2[k], &av2->fid, 0), 0);
			EXPECT(fi_ep_bind(ep2[k], &cq2[k]->fid, FI_TRANSMIT | FI_RECV), 0);
			EXPECT(fi_enable(ep2[k]), 0);
		}
		EXPECT(fi_getname(&ep2[1]->fid, nm, &nl), 0);
		EXPECT(fi_av_insert(av2, nm, 1, &to, 0, NULL), 1);
		EXPECT(fi_recv(ep2[1], in2, sizeof(in2), NULL, FI_ADDR_UNSPEC, (void *)0xd1), 0);
		EXPECT(fi_send(ep2[0], "automatic", 10, NULL, to, (void *)0xd0), 0);
		/* Only memory reads and sleeps from here: no provider call. */
		for (int k = 0; k < 5000 && strcmp(in2, "automatic"); k++)
			usleep(1000);
		CHECK(!strcmp(in2, "automatic"));
		EXPECT(fi_cq_read(cq2[1], &ce, 1), 1);
		CHECK(ce.op_context == (void *)0xd1);
		ssize_t r2 = -FI_EAGAIN;
		for (int k = 0; k < 1000000 && r2 == -FI_EAGAIN; k++)
			r2 = fi_cq_read(cq2[0], &ce, 1);
		EXPECT(r2, 1);
		CHECK(ce.op_context == (void *)0xd0);
		for (int k = 0; k < 2; k++) {
			EXPECT(fi_close(&ep2[k]->fid), 0);
			EXPECT(fi_close(&cq2[k]->fid), 0);
		}
		EXPECT(fi_close(&av2->fid), 0);
	}
	EXPECT(fi_close(&d2->fid), 0);
	fi_freeinfo(ai);
}

/* A poll set over a CQ and a counter: their contexts when they have
 * something. */
static void test_poll(struct side *a, struct side *b)
{
	struct fi_poll_attr pa = { 0 };
	struct fid_poll *ps;
	struct fid_cq *cq;
	struct fid_cntr *c;
	struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_CONTEXT };
	struct fi_cntr_attr na = { .events = FI_CNTR_EVENTS_COMP };
	struct fi_cq_tagged_entry e;
	void *ctx[4];
	char in[8];

	EXPECT(fi_poll_open(domain, &pa, &ps), 0);
	EXPECT(fi_poll_add(ps, &b->cq->fid, 0), 0);
	EXPECT(fi_cntr_open(domain, &na, &c, (void *)0xc0), 0);
	EXPECT(fi_poll_add(ps, &c->fid, 0), 0);
	EXPECT(fi_poll(ps, ctx, 4), 0);
	EXPECT(fi_recv(b->ep, in, sizeof(in), NULL, FI_ADDR_UNSPEC, NULL), 0);
	EXPECT(fi_send(a->ep, "poll", 5, NULL, b->addr, NULL), 0);
	int n = 0;
	for (int i = 0; i < 1000000 && n == 0; i++)
		n = fi_poll(ps, ctx, 4);
	EXPECT(n, 1);
	CHECK(ctx[0] == b->cq->fid.context);
	read_tagged(b->cq, &e, NULL);
	read_tagged(a->cq, &e, NULL);
	EXPECT(fi_cntr_add(c, 1), 0);
	EXPECT(fi_poll(ps, ctx, 4), 1);
	CHECK(ctx[0] == (void *)0xc0);
	EXPECT(fi_poll(ps, ctx, 4), 0);
	/* Members cannot close, nor the set while it has members. */
	EXPECT(fi_close(&ps->fid), -FI_EBUSY);
	EXPECT(fi_close(&c->fid), -FI_EBUSY);
	EXPECT(fi_poll_del(ps, &c->fid, 0), 0);
	EXPECT(fi_poll_del(ps, &c->fid, 0), -FI_ENOENT);
	EXPECT(fi_close(&c->fid), 0);
	EXPECT(fi_cq_open(domain, &ca, &cq, NULL), 0);
	EXPECT(fi_poll_add(ps, &cq->fid, 0), 0);
	EXPECT(fi_poll_del(ps, &cq->fid, 0), 0);
	EXPECT(fi_close(&cq->fid), 0);
	EXPECT(fi_poll_del(ps, &b->cq->fid, 0), 0);
	EXPECT(fi_close(&ps->fid), 0);
}

/* A wait set over a CQ and a counter of one domain. */
static void test_wait_set(struct side *a)
{
	struct fi_wait_attr wa = { .wait_obj = FI_WAIT_UNSPEC };
	struct fid_wait *ws;
	struct side w;
	struct fid_cntr *c;
	struct fi_cq_tagged_entry e;
	char name[64], in[8];
	size_t len = sizeof(name);

	EXPECT(fi_wait_open(fabric, &wa, &ws), 0);
	EXPECT(fi_wait(ws, 10), -FI_ETIMEDOUT); /* no member yet */
	struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_TAGGED, .wait_obj = FI_WAIT_SET, .wait_set = ws };
	struct fi_cntr_attr na = { .events = FI_CNTR_EVENTS_COMP, .wait_obj = FI_WAIT_SET, .wait_set = ws };
	EXPECT(fi_cq_open(domain, &ca, &w.cq, NULL), 0);
	EXPECT(fi_cntr_open(domain, &na, &c, NULL), 0);
	EXPECT(fi_endpoint(domain, info, &w.ep, NULL), 0);
	EXPECT(fi_ep_bind(w.ep, &av->fid, 0), 0);
	EXPECT(fi_ep_bind(w.ep, &w.cq->fid, FI_TRANSMIT | FI_RECV), 0);
	EXPECT(fi_enable(w.ep), 0);
	EXPECT(fi_getname(&w.ep->fid, name, &len), 0);
	EXPECT(fi_av_insert(av, name, 1, &w.addr, 0, NULL), 1);

	EXPECT(fi_wait(ws, 10), -FI_ETIMEDOUT);
	EXPECT(fi_recv(w.ep, in, sizeof(in), NULL, FI_ADDR_UNSPEC, (void *)0x3a), 0);
	EXPECT(fi_send(a->ep, "wait", 5, NULL, w.addr, NULL), 0);
	EXPECT(fi_wait(ws, 10000), 0);
	EXPECT(fi_cq_read(w.cq, &e, 1), 1);
	CHECK(e.op_context == (void *)0x3a && !strcmp(in, "wait"));
	read_tagged(a->cq, &e, NULL);
	EXPECT(fi_cq_sread(w.cq, &e, 1, NULL, 0), -FI_EINVAL); /* waits through its set */
	EXPECT(fi_cntr_add(c, 1), 0);
	EXPECT(fi_wait(ws, 10000), 0);

	/* One domain per wait set: a CQ of another domain is refused. */
	struct fid_domain *d2;
	struct fid_cq *cq2;
	EXPECT(fi_domain(fabric, info, &d2, NULL), 0);
	EXPECT(fi_cq_open(d2, &ca, &cq2, NULL), -FI_ENOSYS);
	EXPECT(fi_close(&d2->fid), 0);

	EXPECT(fi_close(&ws->fid), -FI_EBUSY); /* members wait through it */
	EXPECT(fi_close(&w.cq->fid), -FI_EBUSY); /* bound to the endpoint */
	/* The CQ is in the set again (and still counts in it). */
	EXPECT(fi_close(&ws->fid), -FI_EBUSY);
	EXPECT(fi_recv(w.ep, in, sizeof(in), NULL, FI_ADDR_UNSPEC, (void *)0x3b), 0);
	EXPECT(fi_send(a->ep, "again", 6, NULL, w.addr, NULL), 0);
	EXPECT(fi_wait(ws, 10000), 0);
	read_tagged(w.cq, &e, NULL);
	CHECK(e.op_context == (void *)0x3b && !strcmp(in, "again"));
	read_tagged(a->cq, &e, NULL);
	EXPECT(fi_close(&w.ep->fid), 0);
	EXPECT(fi_close(&w.cq->fid), 0);
	EXPECT(fi_close(&c->fid), 0);
	EXPECT(fi_close(&ws->fid), 0);

	/* A set lives on the domain of its first member, which cannot close
	 * before the set (another domain could take its place); a member of
	 * another domain is refused however the first one came and went. */
	struct fid_domain *d3;
	EXPECT(fi_wait_open(fabric, &wa, &ws), 0);
	ca.wait_set = ws;
	EXPECT(fi_domain(fabric, info, &d2, NULL), 0);
	EXPECT(fi_cq_open(d2, &ca, &cq2, NULL), 0);
	EXPECT(fi_close(&cq2->fid), 0);
	EXPECT(fi_close(&d2->fid), -FI_EBUSY);
	EXPECT(fi_domain(fabric, info, &d3, NULL), 0);
	EXPECT(fi_cq_open(d3, &ca, &cq2, NULL), -FI_ENOSYS);
	EXPECT(fi_close(&d3->fid), 0);
	EXPECT(fi_close(&ws->fid), 0);
	EXPECT(fi_close(&d2->fid), 0);
}

/* FI_THREAD_DOMAIN: calls serialised by the application may come from
 * any thread, one at a time. */
static struct side *ta, *tb;
static void *other_thread(void *arg)
{
	struct fi_cq_tagged_entry e;
	char buf[8] = { 0 };
	(void)arg;
	EXPECT(fi_recv(tb->ep, buf, sizeof(buf), NULL, FI_ADDR_UNSPEC, (void *)0xc1), 0);
	EXPECT(fi_send(ta->ep, "thread", 7, NULL, tb->addr, NULL), 0);
	read_tagged(tb->cq, &e, NULL);
	read_tagged(ta->cq, &e, NULL);
	CHECK(!strcmp(buf, "thread"));
	return NULL;
}

/* Two processes: tagged messages of every protocol's sizes (inline, pool,
 * single copy) and back, each byte checked on both sides. */
static char pattern(size_t i, size_t size)
{
	return (char)((i * 7 + size) & 0xff);
}

static void two_processes(void)
{
	static const size_t sizes[] = { 1, 64, 4096, 20000, 65536, 1 << 20, 4 << 20 };
	int p2c[2], c2p[2];
	CHECK(pipe(p2c) == 0 && pipe(c2p) == 0);
	pid_t pid = fork();
	CHECK(pid >= 0);
	int child = pid == 0;
	int rd = child ? p2c[0] : c2p[0], wr = child ? c2p[1] : p2c[1];

	struct fi_info *h = hints(), *fi;
	struct fid_fabric *fab;
	struct fid_domain *dom;
	struct fid_av *pav;
	struct fid_cq *cq;
	struct fid_ep *ep;
	struct fi_av_attr aa = { .type = FI_AV_MAP };
	struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_TAGGED, .wait_obj = FI_WAIT_UNSPEC };
	char me[64], peer[64];
	size_t len = sizeof(me);
	fi_addr_t to;

	EXPECT(getinfo(h, &fi), 0);
	EXPECT(fi_fabric(fi->fabric_attr, &fab, NULL), 0);
	EXPECT(fi_domain(fab, fi, &dom, NULL), 0);
	EXPECT(fi_av_open(dom, &aa, &pav, NULL), 0);
	EXPECT(fi_cq_open(dom, &ca, &cq, NULL), 0);
	EXPECT(fi_endpoint(dom, fi, &ep, NULL), 0);
	EXPECT(fi_ep_bind(ep, &pav->fid, 0), 0);
	EXPECT(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV), 0);
	EXPECT(fi_enable(ep), 0);
	EXPECT(fi_getname(&ep->fid, me, &len), 0);
	CHECK(write(wr, me, len) == (ssize_t)len && read(rd, peer, len) == (ssize_t)len);
	EXPECT(fi_av_insert(pav, peer, 1, &to, 0, NULL), 1);

	char *buf = malloc(4 << 20), *back = malloc(4 << 20);
	CHECK(buf && back);
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		size_t n = sizes[k];
		struct fi_cq_tagged_entry e[2];
		int got = 0, tries = 0;
		if (child) {
			memset(buf, 0, n);
			EXPECT(fi_trecv(ep, buf, n, NULL, to, n, 0, (void *)1), 0);
			while (got < 1) {
				ssize_t r = fi_cq_sread(cq, e, 1, NULL, 10000);
				CHECK(r == 1 || (r == -FI_EAGAIN && ++tries < 3)); /* 30 s at most */
				got += r == 1;
			}
			CHECK(e[0].len == n && e[0].tag == n);
			for (size_t i = 0; i < n; i++)
				CHECK(buf[i] == pattern(i, n));
			EXPECT(fi_tsend(ep, buf, n, NULL, to, n + 1, (void *)2), 0);
			for (got = 0; got < 1;) {
				ssize_t r = fi_cq_sread(cq, e, 1, NULL, 10000);
				CHECK(r == 1 || (r == -FI_EAGAIN && ++tries < 3)); /* 30 s at most */
				got += r == 1;
			}
		} else {
			for (size_t i = 0; i < n; i++)
				buf[i] = pattern(i, n);
			memset(back, 0, n);
			EXPECT(fi_trecv(ep, back, n, NULL, to, n + 1, 0, (void *)3), 0);
			EXPECT(fi_tsend(ep, buf, n, NULL, to, n, (void *)4), 0);
			while (got < 2) {
				ssize_t r = fi_cq_sread(cq, e, 2 - got, NULL, 10000);
				CHECK(r > 0 || (r == -FI_EAGAIN && ++tries < 3));
				if (r > 0)
					got += (int)r;
			}
			CHECK(!memcmp(back, buf, n));
		}
	}
	free(buf);
	free(back);
	/* The child waits for the parent's word before it closes, so that
	 * the parent's last completions do not race its peer's close. */
	char done = 'x';
	CHECK(write(wr, &done, 1) == 1 && read(rd, &done, 1) == 1);
	EXPECT(fi_close(&ep->fid), 0);
	EXPECT(fi_close(&cq->fid), 0);
	EXPECT(fi_close(&pav->fid), 0);
	EXPECT(fi_close(&dom->fid), 0);
	EXPECT(fi_close(&fab->fid), 0);
	fi_freeinfo(fi);
	if (child)
		_exit(0);
	int status;
	CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* `fi_api exit-auto`: exits with an FI_PROGRESS_AUTO domain (and an
 * endpoint whose CQ its progress thread serves) still open, as programs
 * that skip their cleanup do: libfabric's destructor unloads providers at
 * exit while that thread may still run. */
static int exit_with_auto_progress(void)
{
	struct fi_info *h = hints(), *i;
	struct fid_fabric *fab;
	struct fid_domain *dom;
	struct side s;
	struct fi_av_attr aa = { .type = FI_AV_TABLE };

	h->domain_attr->data_progress = FI_PROGRESS_AUTO;
	EXPECT(getinfo(h, &i), 0);
	info = i;
	EXPECT(fi_fabric(i->fabric_attr, &fab, NULL), 0);
	EXPECT(fi_domain(fab, i, &dom, NULL), 0);
	domain = dom;
	EXPECT(fi_av_open(dom, &aa, &av, NULL), 0);
	open_side(&s, FI_CQ_FORMAT_TAGGED);
	/* Work for the progress thread while the process exits. */
	for (int k = 0; k < 8; k++)
		EXPECT(fi_send(s.ep, "bye", 4, NULL, s.addr, NULL), 0);
	return 0;
}

int main(int argc, char **argv)
{
	struct side a, b;
	struct fi_av_attr aa = { .type = FI_AV_TABLE };
	struct fi_info *h;

	if (argc > 1 && !strcmp(argv[1], "exit-auto"))
		return exit_with_auto_progress();
	test_hints();
	test_resource_mgmt();

	h = hints();
	h->domain_attr->threading = FI_THREAD_DOMAIN;
	EXPECT(getinfo(h, &info), 0);
	EXPECT(fi_fabric(info->fabric_attr, &fabric, NULL), 0);
	EXPECT(fi_domain(fabric, info, &domain, NULL), 0);
	EXPECT(fi_av_open(domain, &aa, &av, NULL), 0);
	open_side(&a, FI_CQ_FORMAT_TAGGED);
	open_side(&b, FI_CQ_FORMAT_TAGGED);

	test_av_and_names(&a);
	test_tagged_and_data(&a, &b);
	test_errors(&a, &b);
	test_probe(&a, &b);
	test_cq_formats(&a);
	test_cq_waits();
	test_trywait_epoll(&a);
	test_counters_and_mr(&a, &b);
	test_mr_prov_keys();
	test_rma();
	test_delivery_complete(&a, &b);
	test_ops_flags(&a, &b);
	test_srx(&a);
	test_srx_tagged();
	test_close_discards();
	test_source_err(&a);
	test_misc(&a, &b);
	test_poll(&a, &b);
	test_wait_set(&a);
	test_mutex_cond(&a);
	test_wait_set_objects(&a);
	test_eq();

	/* The first thread used the domain above; another one now. */
	pthread_t t;
	ta = &a;
	tb = &b;
	CHECK(pthread_create(&t, NULL, other_thread, NULL) == 0);
	CHECK(pthread_join(t, NULL) == 0);

	/* Close order: busy while in use. */
	EXPECT(fi_close(&domain->fid), -FI_EBUSY);
	EXPECT(fi_close(&av->fid), -FI_EBUSY); /* endpoints are bound to it */
	close_side(&a);
	close_side(&b);
	EXPECT(fi_close(&av->fid), 0);
	EXPECT(fi_close(&domain->fid), 0);
	EXPECT(fi_close(&fabric->fid), 0);
	fi_freeinfo(info);

	two_processes();
	printf("fi_api: %d checks passed\n", checks);
	return 0;
}
