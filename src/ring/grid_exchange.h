// The all-to-all within a grid's group: every member sends every other member a message made of
// boxes (strided regions of tensors) packed back to back, and unpacks the messages it gets into
// its own boxes, both through the backend (its memory, its stream).
#pragma once

#include <vector>

#include "engine/context.h"
#include "ring/ring_order.h"

namespace stria {

// A region of a tensor: a TensorView whose data and shape select it (strides as the tensor's).
using Box = TensorView;

// A compact view of `data`: dims in elements, row-major.
Box CompactBox(void* data, DType dtype, std::initializer_list<int64_t> dims);
// Indices [begin, begin + count) of dimension `dim` of `box`.
Box SubBox(const Box& box, int dim, int64_t begin, int64_t count);
size_t BoxBytes(const Box& box);

// One phase of the all-to-all: to[m], the boxes this member sends member m, in order; from[m], the
// boxes member m's message fills here, in order (each the size of the box m sends). A box listed
// for several members is written once, with their sum (float32, rounded once to the box's dtype).
struct Exchange {
  std::vector<std::vector<Box>> to, from;
  explicit Exchange(int members) : to(static_cast<size_t>(members)), from(static_cast<size_t>(members)) {}
  size_t SendBytes() const;
  size_t ReceiveBytes() const;
};

// One phase among the members of this rank's group, in three parts, so that a call can keep
// several phases in flight (a grid's head chunks) while it computes. `send` and `receive` (ring
// buffers) hold at least SendBytes and ReceiveBytes.
//  - PackExchange packs every message into `send` (this member's own share straight into
//    `receive`) on `stream`, the call's: the caller orders the posting after it
//    (RingOrder::BeforePosting: on the host, a synchronisation of the stream; on the device, the
//    transfers wait for an event of it).
//  - PostExchange posts the receives and sends, tagged by the call's `seq` and `phase`, and adds
//    the bytes sent to other members to ctx.traffic().
//  - FinishExchange hands them to `order` (RingOrder::Arrived: waited for on the host, or by the
//    stream with the host's wait deferred; `what` names the phase in timeout messages) and queues
//    the unpacking on `stream`.
struct PendingExchange {
  std::vector<RequestId> recvs, sends;
};
Status PackExchange(Context& ctx, const Exchange& x, void* send, void* receive, void* stream);
Status PostExchange(Context& ctx, uint64_t seq, int phase, const Exchange& x, void* send, void* receive,
                    PendingExchange* pending);
Status FinishExchange(Context& ctx, RingOrder& order, const char* what, const Exchange& x,
                      const PendingExchange& pending, void* receive, void* stream);

}  // namespace stria
