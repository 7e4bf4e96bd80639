// The GPUs of one node summing and exchanging through each other's memory (CUDA IPC): every
// rank owns one buffer that every other rank has mapped (src/backend/cuda/peer.rs), a control
// block of PEER_CTRL bytes and then values. `bases` holds every rank's buffer address in rank
// order (its own included). Control words: [0] exchanges this rank has published, [1]
// exchanges it has finished reading, [2] a wait that timed out (where the kernel says so).
// A rank publishes a count only after a system-wide fence behind the values it wrote, and reads
// the other ranks' values with ld.global.cv (never from a cached line: they change every
// exchange). Sums run in rank order on every rank, so every rank gets the same bits (for two
// ranks the same as NCCL's). A wait gives up after PEER_WAIT_NS (120 s) instead of hanging.
//
// Here: the helpers (also LSQR's loop's, kernels/lsqr.cu), a vector summed outside a graph
// (the backend's allreduce_sum), and GMRES's sums of a few scalars and its halo exchange.

typedef unsigned long long u64;
typedef unsigned int u32;

#define PEER_CTRL 256ull
#define PEER_WAIT_NS 120000000000ull  // 120 s

__device__ __forceinline__ u64 global_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Thread 0: wait until control word `word` of every other rank's buffer is >= want; 0 on
// timeout (the caller then stops: LSQR's loop with error 4, the others set a fault word).
// `mask`: the ranks to wait for (bit r; ranks from 64 on are always waited for).
__device__ int peer_wait_for(const u64* __restrict__ bases, u32 ranks, u32 me, int word, u64 want,
                             u64 mask) {
    const u64 start = global_ns();
    for (u32 r = 0; r < ranks; ++r) {
        if (r == me || (r < 64 && !((mask >> r) & 1ull))) continue;
        const volatile u64* f = (const volatile u64*)bases[r] + word;
        while (*f < want) {
            if (global_ns() - start > PEER_WAIT_NS) return 0;
#if __CUDA_ARCH__ >= 700
            __nanosleep(32);
#endif
        }
    }
    __threadfence_system();
    return 1;
}

__device__ __forceinline__ int peer_wait(const u64* __restrict__ bases, u32 ranks, u32 me, int word,
                                         u64 want) {
    return peer_wait_for(bases, ranks, me, word, want, ~0ull);
}

__device__ __forceinline__ double* peer_slot(const u64* bases, u32 r, u64 off) {
    return (double*)(bases[r] + off);
}

// Value i of the ranks' slots at `off`, added in rank order (the others' with ld.global.cv:
// never from a cached line, they change every exchange).
__device__ __forceinline__ double peer_sum_at(const u64* __restrict__ bases, u32 ranks, u32 me,
                                              u64 off, u64 i) {
    const double* t0 = peer_slot(bases, 0, off) + i;
    double t = me == 0 ? *t0 : __ldcv(t0);
    for (u32 r = 1; r < ranks; ++r) {
        const double* tr = peer_slot(bases, r, off) + i;
        t += r == me ? *tr : __ldcv(tr);
    }
    return t;
}

// ---- A vector summed over the ranks through their buffers outside a graph (the backend's
// allreduce_sum where the GPUs map each other's memory: src/backend/cuda/vector.rs). One slot
// (PEER_CTRL bytes in): peer_vec_begin waits until every rank has read the last sum (word 1),
// the vector is copied into the slot, peer_vec_publish publishes and waits for every rank's,
// peer_vec_sum adds the slots in rank order. A wait that times out sets word 2 of this rank's
// control block (the host reads it after the sum).

extern "C" __global__ void peer_vec_begin(const u64* __restrict__ bases, u32 ranks, u32 me) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    volatile u64* mine = (volatile u64*)bases[me];
    const u64 e = mine[0];
    mine[1] = e;  // every sum up to e read: this kernel follows this rank's last peer_vec_sum
    __threadfence_system();
    if (!peer_wait(bases, ranks, me, 1, e)) mine[2] = 1;
}

extern "C" __global__ void peer_vec_publish(const u64* __restrict__ bases, u32 ranks, u32 me) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    volatile u64* mine = (volatile u64*)bases[me];
    const u64 e = mine[0] + 1;
    __threadfence_system();  // the copy into the slot (an earlier operation) before the count
    mine[0] = e;
    if (!peer_wait(bases, ranks, me, 0, e)) mine[2] = 1;
}

extern "C" __global__ void __launch_bounds__(256)
peer_vec_sum(double* __restrict__ x, u64 n, const u64* __restrict__ bases, u32 ranks, u32 me) {
    if (((const volatile u64*)bases[me])[2]) return;  // a wait timed out: the host says so
    for (u64 i = blockIdx.x * 256ull + threadIdx.x; i < n; i += (u64)gridDim.x * 256ull)
        x[i] = peer_sum_at(bases, ranks, me, PEER_CTRL, i);
}

// ---- GMRES's sums and halo through the other GPUs' memory (src/backend/cuda/vector.rs
// `peer_scalars`, src/backend/cuda/square.rs `PeerHalo`). Every kernel here takes the
// backend's fault word: a wait that times out sets it, every later kernel then does nothing,
// and the host says so after its next read of the scalars.

__device__ __forceinline__ int peer_ok(const u64* fault) { return *(const volatile u64*)fault == 0; }

// sc[0..len) summed over the ranks in rank order, in place; one block. The buffer holds two
// slots of `cap` values that take turns (exchange e in slot e & 1): a rank writes slot e & 1
// again at exchange e + 2, after it has seen every rank publish e + 1, which a rank does only
// after it has read exchange e (in this kernel, before). So no read count is needed.
extern "C" __global__ void __launch_bounds__(256)
peer_scalars_sum(double* __restrict__ sc, u32 len, u32 cap, const u64* __restrict__ bases,
                 u32 ranks, u32 me, u64* fault) {
    __shared__ int go;
    volatile u64* mine = (volatile u64*)bases[me];
    if (threadIdx.x == 0) go = peer_ok(fault);
    __syncthreads();
    if (!go) return;
    const u64 e = mine[0] + 1;
    const u64 off = PEER_CTRL + (e & 1ull) * (u64)cap * 8ull;
    double* slot = peer_slot(bases, me, off);
    for (u32 i = threadIdx.x; i < len; i += blockDim.x) slot[i] = sc[i];
    __threadfence_system();
    __syncthreads();  // (every thread has read mine[0] and written its values)
    if (threadIdx.x == 0) {
        mine[0] = e;
        go = peer_wait(bases, ranks, me, 0, e);
        if (!go) *(volatile u64*)fault = 1;
    }
    __syncthreads();
    if (!go) return;
    for (u32 i = threadIdx.x; i < len; i += blockDim.x) sc[i] = peer_sum_at(bases, ranks, me, off, i);
}

// The halo's first half, one block: once every rank that reads this rank's values (`readers`,
// bit r for rank r) has read its last halo (word 1), x[idx[i]] is gathered into this rank's
// slot (the values for every other rank, in rank order) and the count published. Word 1 is set
// here too: this kernel follows this rank's last peer_halo_pull on the same stream, so every
// halo up to the count has been read. Every rank publishes every halo, values or not.
extern "C" __global__ void __launch_bounds__(1024)
peer_halo_publish(const double* __restrict__ x, const u32* __restrict__ idx, u64 nsend,
                  const u64* __restrict__ bases, u32 ranks, u32 me, u64 readers, u64* fault) {
    __shared__ int go;
    volatile u64* mine = (volatile u64*)bases[me];
    if (threadIdx.x == 0) {
        go = peer_ok(fault);
        if (go) {
            const u64 e = mine[0];
            mine[1] = e;
            __threadfence_system();
            go = peer_wait_for(bases, ranks, me, 1, e, readers);
            if (!go) *(volatile u64*)fault = 1;
        }
    }
    __syncthreads();
    if (!go) return;
    double* slot = peer_slot(bases, me, PEER_CTRL);
    for (u64 i = threadIdx.x; i < nsend; i += blockDim.x) slot[i] = x[idx[i]];
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) mine[0] = mine[0] + 1;
}

// The second half: once every rank this rank reads from (`from`, bit r for rank r) has
// published this halo, the ghosts are read from their slots. `table` has four words per sender
// (in rank order): its rank, where this rank's values start in its slot, where they go in
// `ghosts`, how many.
extern "C" __global__ void __launch_bounds__(256)
peer_halo_pull(double* __restrict__ ghosts, u64 nrecv, const u64* __restrict__ table, u32 senders,
               const u64* __restrict__ bases, u32 ranks, u32 me, u64 from, u64* fault) {
    __shared__ int go;
    if (threadIdx.x == 0) {
        go = peer_ok(fault);
        if (go) {
            const u64 e = ((const volatile u64*)bases[me])[0];  // this rank's own count of it
            go = peer_wait_for(bases, ranks, me, 0, e, from);
            if (!go) *(volatile u64*)fault = 1;
        }
    }
    __syncthreads();
    if (!go) return;
    for (u64 i = blockIdx.x * 256ull + threadIdx.x; i < nrecv; i += (u64)gridDim.x * 256ull) {
        u32 k = 0;
        while (k + 1 < senders && i >= table[4 * (k + 1) + 2]) ++k;
        const u64* t = table + 4 * k;
        ghosts[i] = __ldcv(peer_slot(bases, (u32)t[0], PEER_CTRL) + t[1] + (i - t[2]));
    }
}
