/*
 * shmfab's provider-specific extensions to libfabric (libshmfab-fi.so).
 *
 * The shared heap. Memory allocated here lives in a file every peer of
 * the domain maps, so that a peer's RMA to it is one memcpy by the
 * initiator and its atomics are CPU atomics: the target's process does
 * no work and need not call into libfabric at all (memory registered
 * with fi_mr_reg is reached by single copy or, where that is refused,
 * through the target's progress). It is the provider's counterpart of
 * MPI_Win_allocate next to MPI_Win_create.
 *
 *     struct shmfab_domain_ops_v1 *ops;
 *     void *buf;
 *     struct fid_mr *mr;
 *     if (fi_open_ops(&domain->fid, SHMFAB_DOMAIN_OPS_V1, 0, (void **)&ops, NULL) == 0 &&
 *         ops->size >= sizeof(*ops) &&
 *         ops->alloc_shared(domain, len, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, &buf, &mr, NULL) == 0) {
 *             ... buf holds len zeroed bytes; peers use fi_mr_key(mr) ...
 *             fi_close(&mr->fid); // frees buf
 *     }
 *
 * alloc_shared(domain, len, access, flags, &buf, &mr, context):
 *   allocates len (> 0) zeroed bytes of the domain's shared heap and
 *   registers them with access (FI_SEND, FI_RECV, FI_READ, FI_WRITE,
 *   FI_REMOTE_READ, FI_REMOTE_WRITE), as fi_mr_reg(domain, buf, len,
 *   access, 0, 0, flags, &mr, context) would register ordinary memory:
 *   the same keys (FI_MR_PROV_KEY: remote addresses are offsets from
 *   buf), fi_mr_bind of remote-event counters, fi_mr_desc. flags: 0 or
 *   FI_RMA_EVENT. The memory is freed by fi_close(&mr->fid); buf must
 *   not be used after that. Returns 0, or
 *     -FI_EINVAL      a null argument, len 0, unknown access bits;
 *     -FI_EBADFLAGS   other flags;
 *     -FI_EOPNOTSUPP  the domain was opened without FI_MR_PROV_KEY (the
 *                     heap's keys are the provider's);
 *     -FI_ENOMEM      the heap has no len bytes free (its size per
 *                     domain is SHMFAB_HEAP_SIZE, default 256 MiB);
 *     -FI_ENOSPC      all registrations of the domain are in use.
 *
 * fi_open_ops with another name gives -FI_ENOSYS; flags must be 0
 * (-FI_EBADFLAGS). The table is static: nothing to close.
 */
#ifndef SHMFAB_EXT_H
#define SHMFAB_EXT_H

#include <stddef.h>
#include <stdint.h>
#include <rdma/fi_domain.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The name to pass to fi_open_ops on a domain's fid. */
#define SHMFAB_DOMAIN_OPS_V1 "shmfab_domain_ops_v1"

struct shmfab_domain_ops_v1 {
	/* sizeof the table the provider filled: later versions only add
	 * entries at the end. */
	size_t size;
	int (*alloc_shared)(struct fid_domain *domain, size_t len, uint64_t access, uint64_t flags, void **buf,
			    struct fid_mr **mr, void *context);
};

#ifdef __cplusplus
}
#endif

#endif /* SHMFAB_EXT_H */
