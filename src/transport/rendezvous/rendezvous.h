// The TCP rendezvous that forms a ring across processes: rank 0 listens, every other rank
// connects, proves it knows the job's secret, and hands over an opaque blob (its transport
// endpoint address); rank 0 answers everyone with the table of all blobs. Junk, wrong secrets,
// duplicate or out-of-range ranks are refused with a message and the rendezvous goes on; a rank
// that never comes makes every waiting rank fail when the timeout runs out.
#pragma once

#include <atomic>
#include <functional>
#include <vector>

#include "transport/rendezvous/net.h"
#include "transport/rendezvous/unique_id.h"
#include "transport/rendezvous/wire.h"

namespace stria {

// stria_get_unique_id: opens a listener (at STRIA_ROOT if set, else on an ephemeral port of this
// host) with a fresh random secret, and keeps it for this process's rank 0 to take.
Status OpenRendezvous(RendezvousId* id);

// The id a rank's config names: the caller's id, or (all zero) the environment's.
Status ResolveId(const stria_unique_id_t& given, int world_size, RendezvousId* out);

// Rank 0: serves the rendezvous until all world_size - 1 other ranks joined; table[r] is rank
// r's blob (table[0] = own).
Status ServeRendezvous(const RendezvousId& id, int world_size, const Bytes& own, double timeout_s,
                       const std::atomic<bool>* abort, std::vector<Bytes>* table);

// The same, with a last look before the table goes out: once every rank has joined (never when
// the rendezvous fails), `complete(table)` may check the others' blobs and complete rank 0's own
// ((*table)[0]); a failure it returns goes to every rank. For what rank 0 should make only when
// the whole ring is known to be there and able (NCCL's ids: each starts a thread that waits,
// without a timeout, for every rank of its communicator).
Status ServeRendezvous(const RendezvousId& id, int world_size, Bytes own,
                       const std::function<Status(std::vector<Bytes>* table)>& complete, double timeout_s,
                       const std::atomic<bool>* abort, std::vector<Bytes>* table);

// A world of one needs no rendezvous, but its id is used up all the same: closes the listener
// that stria_get_unique_id opened in this process for `given`, if any (nothing for an all-zero
// id, the environment's, or an id of another process).
void ReleaseUnusedRendezvous(const stria_unique_id_t& given);

// Ranks 1..N-1.
Status JoinRendezvous(const RendezvousId& id, int rank, int world_size, const Bytes& blob, double timeout_s,
                      const std::atomic<bool>* abort, std::vector<Bytes>* table);

}  // namespace stria
