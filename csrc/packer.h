/*
 * packer.h -- the hot path of GPU placement for kai-es.
 *
 * One call decides where ONE task goes: it filters every node, scores the
 * survivors, picks the best node and the devices on it, and counts why the
 * other nodes were rejected.  The pure-Python twin
 * kai_es/scheduling/packing/reference.py is the executable specification;
 * this file and that one describe the same function and must give identical
 * answers on every input (a hypothesis property test holds them together).
 *
 * Properties of the implementation (packer.c):
 *   - integers only: every quantity and every score is an int64_t;
 *   - pure and reentrant: no globals, no static mutable state, no I/O;
 *   - no allocation: the caller supplies every buffer;
 *   - total: every input is validated (task, strategy, all table arrays)
 *     before anything is counted; an invalid input gives a negative code;
 *   - ties are always broken by the lowest index (node or device).
 *
 * ---------------------------------------------------------------------------
 * DATA MODEL (struct of arrays, n nodes, d devices in total)
 * ---------------------------------------------------------------------------
 * Node arrays (length n):
 *   free_milli_cpu[i]     free CPU of node i, milli-cores, >= 0
 *   free_memory_bytes[i]  free memory of node i, bytes, >= 0
 *   free_pods[i]          free pod slots of node i, >= 0
 *   alloc_milli_cpu[i]    allocatable CPU of node i, >= 0.  Validated and
 *                         carried; NOT used by any score (binpack/spread rank
 *                         the absolute CPU left, fragmentation the free CPU).
 *   eligible[i]           0/1, the verdict of the Python-side filters (taints,
 *                         selectors, node pool, GPU model, ...) for THIS task;
 *                         passed separately from the table because it changes
 *                         per task.
 *   gpu_start[0..n]       (length n+1) node i owns devices
 *                         [gpu_start[i], gpu_start[i+1]); gpu_start[0] == 0,
 *                         non-decreasing, gpu_start[n] == d.  A node that owns
 *                         no device is a CPU-only node.
 * Device arrays (length d):
 *   dev_free_milli[j]        0..1000 milli-GPU free on device j
 *   dev_total_memory_mib[j]  0..KAI_PACK_MAX_MEMORY_MIB; 0 = unknown
 *   dev_shared[j]            0/1: device j currently hosts fractional
 *                            (shared) allocations
 *
 * ---------------------------------------------------------------------------
 * TASK (kai_pack_task) -- exactly one of three kinds
 * ---------------------------------------------------------------------------
 *   CPU-only : whole_gpus == 0, fraction_milli == 0, gpu_memory_mib == 0,
 *              fraction_devices == 0.
 *   WHOLE    : whole_gpus >= 1, fraction_milli == 0, gpu_memory_mib == 0,
 *              fraction_devices == 0.  Needs whole_gpus idle devices.
 *   SHARED   : whole_gpus == 0, fraction_devices >= 1 and exactly one of
 *              fraction_milli (1..999) or gpu_memory_mib (>= 1).  Needs
 *              fraction_devices DISTINCT devices, each taking a share.
 * Field bounds: 0 <= milli_cpu, memory_bytes <= KAI_PACK_MAX_QUANTITY;
 *   0 <= whole_gpus, fraction_devices <= KAI_PACK_MAX_TASK_DEVICES;
 *   0 <= fraction_milli <= 999; 0 <= gpu_memory_mib <= KAI_PACK_MAX_MEMORY_MIB.
 *   Anything else is KAI_PACK_EINVAL.
 *
 * need(j) -- the milli a SHARED task takes from device j:
 *   fraction task : need(j) = fraction_milli.
 *   memory task   : device j is SIZE-CAPABLE iff
 *                     0 < dev_total_memory_mib[j] and
 *                     gpu_memory_mib <= dev_total_memory_mib[j];
 *                   a device that is not size-capable can never take it.
 *                   For a size-capable device
 *                     need(j) = ceil(gpu_memory_mib * 1000 / total)
 *                             = (gpu_memory_mib * 1000 + total - 1) / total,
 *                   which lies in 1..1000; need(j) == 1000 (the request
 *                   converts to >= 1000 milli) means an idle device.
 *   Device j CAN TAKE the task iff it is size-capable (always true for a
 *   fraction task) and dev_free_milli[j] >= need(j).
 *
 * ---------------------------------------------------------------------------
 * FILTER -- per node, in this order; a rejected node is counted once, under
 * the first reason that fails (enum kai_pack_reason gives the buffer order):
 * ---------------------------------------------------------------------------
 *   0 NOT_ELIGIBLE  eligible[i] == 0
 *   1 PODS          free_pods[i] < 1
 *   2 CPU           free_milli_cpu[i] < milli_cpu
 *   3 MEMORY        free_memory_bytes[i] < memory_bytes
 *   4 GPU           WHOLE : fewer than whole_gpus devices of the node have
 *                           dev_free_milli == 1000;
 *                   SHARED: the node owns fewer than fraction_devices devices
 *                           (in particular a CPU-only node).
 *   5 GPU_SHARE     SHARED: at least fraction_devices devices of the node are
 *                   size-capable but fewer than fraction_devices CAN TAKE the
 *                   task (occupancy is the obstacle; freeing capacity on the
 *                   node could make it fit).
 *   6 GPU_MEMORY    memory task: fewer than fraction_devices devices of the
 *                   node are size-capable, i.e. the devices fail only because
 *                   their memory is unknown (0) or smaller than
 *                   gpu_memory_mib -- even an idle node would not fit.
 *   GPU_SHARE and GPU_MEMORY are mutually exclusive, so their relative order
 *   does not matter.  A CPU-only task never fails 4..6.
 *
 * ---------------------------------------------------------------------------
 * DEVICE CHOICE on a node that passed the filter
 * ---------------------------------------------------------------------------
 *   WHOLE : the whole_gpus lowest-index devices with dev_free_milli == 1000.
 *   SHARED: among the devices that CAN TAKE the task, the first
 *           fraction_devices in this order:
 *             GPUPACK   (device_strategy 0): ascending by
 *                       (shared ? 0 : 1, dev_free_milli, index)
 *                       -- shared devices first, fullest first;
 *             GPUSPREAD (device_strategy 1): ascending by
 *                       (-dev_free_milli, index) -- emptiest first.
 *   devices_out receives the chosen indices in that order (WHOLE: ascending).
 *
 * ---------------------------------------------------------------------------
 * SCORE -- a tuple of int64, compared lexicographically, higher is better;
 * among equal scores the lowest node index wins.
 * ---------------------------------------------------------------------------
 *   cpu_left   = free_milli_cpu[i] - milli_cpu
 *   cpu_key    = -cpu_left (cpu BINPACK, 0)   |  +cpu_left (cpu SPREAD, 1)
 *   gpu_left   = sum of dev_free_milli over the node's devices
 *                - milli taken by the chosen devices
 *                (WHOLE: 1000 * whole_gpus; SHARED: sum of need(j) chosen)
 *   gpu_key    = -gpu_left (gpu BINPACK, 0)   |  +gpu_left (gpu SPREAD, 1)
 *   CPU-only task : (node owns no device ? 1 : 0, cpu_key)
 *   SHARED task   : (number of chosen devices with dev_shared == 1,
 *                    gpu_key, cpu_key)
 *   WHOLE task    : (gpu_key, cpu_key)
 *
 * ---------------------------------------------------------------------------
 * FRAGMENTATION (gpu_strategy 2) -- expected stranded GPU capacity
 * ---------------------------------------------------------------------------
 * The strategy carries a WORKLOAD TABLE: n_shapes (0..KAI_PACK_MAX_SHAPES)
 * rows of KAI_PACK_SHAPE_FIELDS int64, row-major in `shapes`:
 *   milli_cpu, memory_bytes, whole_gpus, fraction_milli, fraction_devices,
 *   gpu_memory_mib, weight
 * -- a task shape m (valid exactly as a task is) that is expected to arrive,
 * with weight w_m in 0..KAI_PACK_MAX_TOTAL_WEIGHT; the weights sum to at most
 * KAI_PACK_MAX_TOTAL_WEIGHT.  The table is validated for EVERY strategy but
 * read only by FRAGMENTATION.  Like FGD (Weng et al., ATC'23) the strategy
 * places a task where the fragmentation -- the weighted free GPU capacity that
 * the workload could not use -- grows least; unlike FGD it asks how many
 * instances of a shape the node could still host, not only whether one fits,
 * so GPUs stranded by the node's CPU, memory or pod slots count too.
 *
 * For a node state (free cpu, mem, pods, device frees), with G = the node's
 * free milli and, for a GPU shape m (want = whole_gpus or fraction_devices):
 *   serves(j)  device j is idle (WHOLE m) or can take one share of m (SHARED
 *              m, need(j) as above with m's fraction_milli/gpu_memory_mib);
 *   slots(j)   1 if j serves a WHOLE m; free/need(j) if it serves a SHARED m;
 *              0 otherwise;
 *   P          free milli of the devices that do not serve m;
 *   stranded_m = G                        if fewer than `want` devices serve m;
 *              = P + (G - P) * (inst - n) / inst     otherwise, where
 *                inst = sum(slots) / want  (>= 1, instances the devices allow)
 *                n    = min(inst, pods, cpu / cpu_m, mem / mem_m)
 *                       (a zero cpu_m or mem_m does not limit);
 *   F(node)    = sum over GPU shapes of w_m * stranded_m;  CPU-only shapes
 *                contribute 0.  All divisions are floor divisions of
 *                non-negative ints.
 * delta = F(after) - F(before), "after" = the node with the task's milli_cpu,
 * memory_bytes and one pod slot taken and the chosen devices' milli taken.
 * Filter and rejection counts: exactly as above.  Devices:
 *   WHOLE : the whole_gpus lowest-index idle devices (as above);
 *   SHARED: the devices that can take the task, ascending by
 *           (key(j), device-strategy order), the first fraction_devices;
 *           key(j) = F of the node with the task's cpu/memory/pod slot and
 *           ONLY device j's need(j) taken.
 * Score (higher is better, ties to the lowest node index):
 *   CPU-only task : (node owns no device ? 1 : 0, -delta, cpu_key)
 *   WHOLE, SHARED : (-delta, -gpu_left, cpu_key)   (gpu_left as above)
 * An empty workload makes delta 0: GPU binpack without the shared-reuse key.
 * Every node must own at most KAI_PACK_MAX_NODE_DEVICES devices (else
 * EINVAL); with the weight bound this keeps every product below 2^53 and F
 * below 2^47.  Cost: O(n_shapes * devices) per node (O(fraction_devices *
 * n_shapes * devices) for a SHARED task), on the stack, no allocation.
 *
 * ---------------------------------------------------------------------------
 * RESULT
 * ---------------------------------------------------------------------------
 *   KAI_PACK_OK (0)        placed: *node_out = chosen node, devices_out[0..k)
 *                          = chosen devices (k = whole_gpus, fraction_devices
 *                          or 0), reasons_out = rejection counts.
 *   KAI_PACK_NO_FIT (1)    no node passed: *node_out = -1, reasons_out counts
 *                          (they sum to n); devices_out untouched.
 *   KAI_PACK_EINVAL (-1)   bad argument: a NULL pointer, reasons_cap <
 *                          KAI_PACK_REASON_COUNT, devices_cap < k, a task,
 *                          strategy (gpu 0..2, cpu 0..1, device 0..1),
 *                          workload or table value out of range, an
 *                          inconsistent gpu_start, or (FRAGMENTATION) a node
 *                          owning more than KAI_PACK_MAX_NODE_DEVICES devices.
 *   KAI_PACK_EUNSUPPORTED (-2)  kept for future reserved strategies; no input
 *                          returns it at ABI version 2.
 *   ABI version 2 (was 1): struct kai_pack_strategy gained n_shapes and
 *   shapes; FRAGMENTATION is implemented.
 *   ABI version 3 (was 2): kai_pack_rank.
 *   ABI version 4 (was 3): kai_pack_table_check, kai_pack_place_trusting,
 *   kai_pack_rank_trusting (below).
 *   On a negative code *node_out (if non-NULL) is -1, reasons_out (if it is
 *   non-NULL and long enough) is all zero, devices_out is untouched.
 *
 * ---------------------------------------------------------------------------
 * RANKING (kai_pack_rank)
 * ---------------------------------------------------------------------------
 * The same filter, scores, rejection counts, result code and devices as
 * kai_pack_place, and the best ranked_cap (1..KAI_PACK_MAX_RANKED) nodes that
 * passed the filter, best first (score descending, equal scores by ascending
 * index), as rows of four int64_t in ranked_out (node, s0, s1, s2: the score
 * tuple, padded with 0 after its last key), their number in *ranked_n_out.
 * Row 0 is kai_pack_place's node.  A caller that knows which nodes changed
 * since (and how their scores moved) knows the next answers without a scan:
 * every node not listed ranks after the last listed one.  ranked_out must
 * hold 4 * ranked_cap values.  On a negative code *ranked_n_out is 0.
 *
 * ---------------------------------------------------------------------------
 * A TABLE CHECKED ONCE (kai_pack_table_check, kai_pack_*_trusting)
 * ---------------------------------------------------------------------------
 * kai_pack_place and kai_pack_rank check every node's and device's values on
 * every call, which costs about what the scan does.  kai_pack_table_check
 * makes those checks alone (the table's contents with eligible, and, for
 * FRAGMENTATION, each node's device count): KAI_PACK_OK or KAI_PACK_EINVAL.
 * kai_pack_place_trusting and kai_pack_rank_trusting are kai_pack_place and
 * kai_pack_rank without them: every other check is made (NULL pointers,
 * n_nodes, n_devices and gpu_start's ends, the task, strategy, workload and
 * caps).  Their caller vouches that kai_pack_table_check accepted the table
 * and that its values have stayed valid since, with gpu_start unchanged and
 * eligible all 0 or 1; then their answers are kai_pack_place's and
 * kai_pack_rank's.  (kai-es's wrapper does so for a table whose writers keep
 * it valid: kai_es.scheduling.packing.native.)
 *
 * The declarations between the CDEF markers are fed verbatim to cffi's
 * cdef(), so they use plain C types and integer-literal #defines only.
 */
#ifndef KAI_ES_PACKER_H
#define KAI_ES_PACKER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CDEF-BEGIN */
#define KAI_PACK_ABI_VERSION 4
#define KAI_PACK_MAX_RANKED 1024
#define KAI_PACK_REASON_COUNT 7
#define KAI_PACK_SHAPE_FIELDS 7
#define KAI_PACK_MAX_SHAPES 64
#define KAI_PACK_MAX_TOTAL_WEIGHT 1048576
#define KAI_PACK_MAX_NODE_DEVICES 65536
#define KAI_PACK_MAX_TASK_DEVICES 1048576
#define KAI_PACK_MAX_MEMORY_MIB 1099511627776
#define KAI_PACK_MAX_QUANTITY 4611686018427387904

enum kai_pack_code {
    KAI_PACK_OK = 0,
    KAI_PACK_NO_FIT = 1,
    KAI_PACK_EINVAL = -1,
    KAI_PACK_EUNSUPPORTED = -2
};

enum kai_pack_reason {
    KAI_PACK_R_NOT_ELIGIBLE = 0,
    KAI_PACK_R_PODS = 1,
    KAI_PACK_R_CPU = 2,
    KAI_PACK_R_MEMORY = 3,
    KAI_PACK_R_GPU = 4,
    KAI_PACK_R_GPU_SHARE = 5,
    KAI_PACK_R_GPU_MEMORY = 6
};

enum kai_pack_gpu_strategy {
    KAI_PACK_GPU_BINPACK = 0,
    KAI_PACK_GPU_SPREAD = 1,
    KAI_PACK_GPU_FRAGMENTATION = 2
};

enum kai_pack_cpu_strategy {
    KAI_PACK_CPU_BINPACK = 0,
    KAI_PACK_CPU_SPREAD = 1
};

enum kai_pack_device_strategy {
    KAI_PACK_DEVICE_GPUPACK = 0,
    KAI_PACK_DEVICE_GPUSPREAD = 1
};

typedef struct kai_pack_table {
    int64_t n_nodes;
    int64_t n_devices;
    const int64_t *free_milli_cpu;       /* n */
    const int64_t *free_memory_bytes;    /* n */
    const int64_t *free_pods;            /* n */
    const int64_t *alloc_milli_cpu;      /* n */
    const int64_t *gpu_start;            /* n + 1 */
    const int64_t *dev_free_milli;       /* d */
    const int64_t *dev_total_memory_mib; /* d */
    const int64_t *dev_shared;           /* d */
} kai_pack_table;

typedef struct kai_pack_task {
    int64_t milli_cpu;
    int64_t memory_bytes;
    int64_t whole_gpus;
    int64_t fraction_milli;
    int64_t fraction_devices;
    int64_t gpu_memory_mib;
} kai_pack_task;

typedef struct kai_pack_strategy {
    int64_t gpu_strategy;
    int64_t cpu_strategy;
    int64_t device_strategy;
    int64_t n_shapes;       /* workload table: 0..KAI_PACK_MAX_SHAPES rows */
    const int64_t *shapes;  /* n_shapes * KAI_PACK_SHAPE_FIELDS, row-major */
} kai_pack_strategy;

int kai_pack_abi_version(void);

int kai_pack_place(const kai_pack_table *table,
                   const int64_t *eligible,
                   const kai_pack_task *task,
                   const kai_pack_strategy *strategy,
                   int64_t *node_out,
                   int64_t *devices_out,
                   int64_t devices_cap,
                   int64_t *reasons_out,
                   int64_t reasons_cap);

int kai_pack_rank(const kai_pack_table *table,
                  const int64_t *eligible,
                  const kai_pack_task *task,
                  const kai_pack_strategy *strategy,
                  int64_t *ranked_out,
                  int64_t ranked_cap,
                  int64_t *ranked_n_out,
                  int64_t *devices_out,
                  int64_t devices_cap,
                  int64_t *reasons_out,
                  int64_t reasons_cap);

int kai_pack_table_check(const kai_pack_table *table,
                         const int64_t *eligible,
                         const kai_pack_strategy *strategy);

int kai_pack_place_trusting(const kai_pack_table *table,
                            const int64_t *eligible,
                            const kai_pack_task *task,
                            const kai_pack_strategy *strategy,
                            int64_t *node_out,
                            int64_t *devices_out,
                            int64_t devices_cap,
                            int64_t *reasons_out,
                            int64_t reasons_cap);

int kai_pack_rank_trusting(const kai_pack_table *table,
                           const int64_t *eligible,
                           const kai_pack_task *task,
                           const kai_pack_strategy *strategy,
                           int64_t *ranked_out,
                           int64_t ranked_cap,
                           int64_t *ranked_n_out,
                           int64_t *devices_out,
                           int64_t devices_cap,
                           int64_t *reasons_out,
                           int64_t reasons_cap);
/* CDEF-END */

#ifdef __cplusplus
}
#endif

#endif /* KAI_ES_PACKER_H */
