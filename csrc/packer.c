/*
 * packer.c -- see packer.h for the full specification.  Every rule here has
 * a named counterpart in kai_es/scheduling/packing/reference.py.
 */
#include "packer.h"

#include <stddef.h>

enum { KIND_CPU = 0, KIND_WHOLE = 1, KIND_SHARED = 2 };

int kai_pack_abi_version(void) { return KAI_PACK_ABI_VERSION; }

/* --- validation --------------------------------------------------------- */

static int in_range(int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; }

/* Returns the task kind, or -1 if the task is invalid. */
static int task_kind(const kai_pack_task *t)
{
    if (!in_range(t->milli_cpu, 0, KAI_PACK_MAX_QUANTITY) ||
        !in_range(t->memory_bytes, 0, KAI_PACK_MAX_QUANTITY) ||
        !in_range(t->whole_gpus, 0, KAI_PACK_MAX_TASK_DEVICES) ||
        !in_range(t->fraction_milli, 0, 999) ||
        !in_range(t->fraction_devices, 0, KAI_PACK_MAX_TASK_DEVICES) ||
        !in_range(t->gpu_memory_mib, 0, KAI_PACK_MAX_MEMORY_MIB))
        return -1;
    if (t->whole_gpus > 0) {
        if (t->fraction_milli != 0 || t->gpu_memory_mib != 0 || t->fraction_devices != 0)
            return -1;
        return KIND_WHOLE;
    }
    if (t->fraction_milli == 0 && t->gpu_memory_mib == 0)
        return t->fraction_devices == 0 ? KIND_CPU : -1;
    if (t->fraction_milli != 0 && t->gpu_memory_mib != 0)
        return -1;
    return t->fraction_devices >= 1 ? KIND_SHARED : -1;
}

/* The table's shape: sizes, pointers and gpu_start's ends (constant time). */
static int table_shape_valid(const kai_pack_table *tb, const int64_t *eligible)
{
    int64_t n = tb->n_nodes, d = tb->n_devices;
    if (n < 0 || d < 0)
        return 0;
    if (tb->gpu_start == NULL)
        return 0;
    if (n > 0 && (eligible == NULL || tb->free_milli_cpu == NULL ||
                  tb->free_memory_bytes == NULL || tb->free_pods == NULL ||
                  tb->alloc_milli_cpu == NULL))
        return 0;
    if (d > 0 && (tb->dev_free_milli == NULL || tb->dev_total_memory_mib == NULL ||
                  tb->dev_shared == NULL))
        return 0;
    return tb->gpu_start[0] == 0 && tb->gpu_start[n] == d;
}

/* Every node's and device's values, with eligible (a valid shape assumed). */
static int table_contents_valid(const kai_pack_table *tb, const int64_t *eligible)
{
    int64_t n = tb->n_nodes, d = tb->n_devices, i, j;
    for (i = 0; i < n; i++) {
        if (tb->gpu_start[i + 1] < tb->gpu_start[i] ||
            tb->free_milli_cpu[i] < 0 || tb->free_memory_bytes[i] < 0 ||
            tb->free_pods[i] < 0 || tb->alloc_milli_cpu[i] < 0 ||
            (eligible[i] != 0 && eligible[i] != 1))
            return 0;
    }
    for (j = 0; j < d; j++) {
        if (!in_range(tb->dev_free_milli[j], 0, 1000) ||
            !in_range(tb->dev_total_memory_mib[j], 0, KAI_PACK_MAX_MEMORY_MIB) ||
            (tb->dev_shared[j] != 0 && tb->dev_shared[j] != 1))
            return 0;
    }
    return 1;
}

/* Validates the workload of a strategy (n_shapes rows of KAI_PACK_SHAPE_FIELDS). */
static int workload_valid(const kai_pack_strategy *st)
{
    int64_t m, total = 0;
    if (!in_range(st->n_shapes, 0, KAI_PACK_MAX_SHAPES))
        return 0;
    if (st->n_shapes > 0 && st->shapes == NULL)
        return 0;
    for (m = 0; m < st->n_shapes; m++) {
        const int64_t *row = st->shapes + m * KAI_PACK_SHAPE_FIELDS;
        kai_pack_task t;
        t.milli_cpu = row[0];
        t.memory_bytes = row[1];
        t.whole_gpus = row[2];
        t.fraction_milli = row[3];
        t.fraction_devices = row[4];
        t.gpu_memory_mib = row[5];
        if (task_kind(&t) < 0 || !in_range(row[6], 0, KAI_PACK_MAX_TOTAL_WEIGHT))
            return 0;
        total += row[6];
        if (total > KAI_PACK_MAX_TOTAL_WEIGHT)
            return 0;
    }
    return 1;
}

/* --- shared-task helpers ------------------------------------------------ */

/* need(j) of a share given as fraction_milli or gpu_memory_mib, or -1 if a
 * device of total_mib is not size-capable. */
static int64_t need_of(int64_t fraction_milli, int64_t gpu_memory_mib, int64_t total_mib)
{
    if (fraction_milli != 0)
        return fraction_milli;
    if (total_mib <= 0 || gpu_memory_mib > total_mib)
        return -1;
    return (gpu_memory_mib * 1000 + total_mib - 1) / total_mib;
}

/* need(j) for a SHARED task, or -1 if device j is not size-capable. */
static int64_t need_milli(const kai_pack_task *t, int64_t total_mib)
{
    return need_of(t->fraction_milli, t->gpu_memory_mib, total_mib);
}

/* Device order key: device a precedes device b iff key(a) < key(b).
 * GPUPACK: (shared ? 0 : 1, free, index); GPUSPREAD: (-free, index). */
static int precedes(int64_t gpuspread, const kai_pack_table *tb, int64_t a, int64_t b)
{
    int64_t fa = tb->dev_free_milli[a], fb = tb->dev_free_milli[b];
    if (gpuspread) {
        if (fa != fb)
            return fa > fb;
        return a < b;
    }
    {
        int64_t sa = tb->dev_shared[a] ? 0 : 1, sb = tb->dev_shared[b] ? 0 : 1;
        if (sa != sb)
            return sa < sb;
        if (fa != fb)
            return fa < fb;
        return a < b;
    }
}

/*
 * Choose the devices of a SHARED task on devices [s, e): the first
 * fraction_devices devices that can take it, in strategy order.  Selection by
 * repeated minimum (the k-th pick is the smallest device strictly after the
 * (k-1)-th in the total order), so no scratch buffer is needed.
 * Writes the picks to out (if non-NULL); returns the number picked and stores
 * the shared-reuse count and the milli taken.
 */
static int64_t choose_shared(const kai_pack_table *tb, const kai_pack_task *t,
                             int64_t gpuspread, int64_t s, int64_t e,
                             int64_t *out, int64_t *reuse, int64_t *taken)
{
    int64_t k, j, last = -1, picked = 0;
    *reuse = 0;
    *taken = 0;
    for (k = 0; k < t->fraction_devices; k++) {
        int64_t best = -1, best_need = 0;
        for (j = s; j < e; j++) {
            int64_t nd = need_milli(t, tb->dev_total_memory_mib[j]);
            if (nd < 0 || tb->dev_free_milli[j] < nd)
                continue;
            if (last >= 0 && !precedes(gpuspread, tb, last, j))
                continue;
            if (best < 0 || precedes(gpuspread, tb, j, best)) {
                best = j;
                best_need = nd;
            }
        }
        if (best < 0)
            break;
        if (out != NULL)
            out[picked] = best;
        picked++;
        *reuse += tb->dev_shared[best] ? 1 : 0;
        *taken += best_need;
        last = best;
    }
    return picked;
}

/* --- fragmentation (gpu_strategy 2) -------------------------------------- */

enum { SH_CPU = 0, SH_MEM = 1, SH_WHOLE = 2, SH_FRAC = 3, SH_DEVS = 4, SH_GMEM = 5, SH_WEIGHT = 6 };

/* Per-node aggregates of the fragmentation measure, one slot per shape:
 * serving[m] = devices that serve shape m, stranded[m] = free milli on the
 * devices that do not.  Fixed-size, on the stack: no allocation. */
typedef struct frag_agg {
    int64_t serving[KAI_PACK_MAX_SHAPES];
    int64_t stranded[KAI_PACK_MAX_SHAPES];
    int64_t slots[KAI_PACK_MAX_SHAPES];
} frag_agg;

/* The node-level resources a shape is checked against. */
typedef struct frag_node {
    int64_t cpu, mem, pods, gpu_free;
} frag_node;

static const int64_t *shape_row(const kai_pack_strategy *st, int64_t m)
{
    return st->shapes + m * KAI_PACK_SHAPE_FIELDS;
}

/* serves(m, j, free): a device j with `free` milli free can serve one
 * device's worth of shape m.  CPU-only shapes are never asked. */
static int serves(const int64_t *row, const kai_pack_table *tb, int64_t j, int64_t free)
{
    int64_t nd;
    if (row[SH_WHOLE] > 0)
        return free == 1000;
    nd = need_of(row[SH_FRAC], row[SH_GMEM], tb->dev_total_memory_mib[j]);
    return nd >= 0 && free >= nd;
}

static int64_t slots_of(const int64_t *row, const kai_pack_table *tb, int64_t j, int64_t free)
{
    int64_t nd;
    if (row[SH_WHOLE] > 0)
        return free == 1000;
    nd = need_of(row[SH_FRAC], row[SH_GMEM], tb->dev_total_memory_mib[j]);
    return nd >= 0 && free >= nd ? free / nd : 0;
}

static int is_gpu_shape(const int64_t *row)
{
    return row[SH_WHOLE] > 0 || row[SH_DEVS] > 0;
}

/* Aggregates of devices [s, e) at their current free milli. */
static void frag_collect(const kai_pack_table *tb, const kai_pack_strategy *st,
                         int64_t s, int64_t e, frag_agg *agg)
{
    int64_t m, j;
    for (m = 0; m < st->n_shapes; m++) {
        const int64_t *row = shape_row(st, m);
        int64_t serving = 0, stranded = 0, slots = 0;
        if (is_gpu_shape(row)) {
            for (j = s; j < e; j++) {
                if (serves(row, tb, j, tb->dev_free_milli[j]))
                    serving++;
                else
                    stranded += tb->dev_free_milli[j];
                slots += slots_of(row, tb, j, tb->dev_free_milli[j]);
            }
        }
        agg->serving[m] = serving;
        agg->stranded[m] = stranded;
        agg->slots[m] = slots;
    }
}

/* Contribution of shape m, unweighted, given its aggregates after a
 * hypothetical change of device j from `old_free` to `new_free` (j < 0: no
 * change). */
static int64_t frag_shape(const int64_t *row, const kai_pack_table *tb, const frag_node *nd,
                          int64_t serving, int64_t stranded, int64_t slots,
                          int64_t j, int64_t old_free, int64_t new_free)
{
    int64_t want, inst, n;
    if (!is_gpu_shape(row))
        return 0;
    if (j >= 0) {
        int sa = serves(row, tb, j, old_free), sb = serves(row, tb, j, new_free);
        serving += sb - sa;
        stranded += (sb ? 0 : new_free) - (sa ? 0 : old_free);
        slots += slots_of(row, tb, j, new_free) - slots_of(row, tb, j, old_free);
    }
    want = row[SH_WHOLE] > 0 ? row[SH_WHOLE] : row[SH_DEVS];
    if (serving < want)
        return nd->gpu_free;            /* not even one instance: all stranded */
    inst = slots / want;                /* >= 1: instances the devices allow */
    n = inst;                           /* instances the node allows */
    if (nd->pods < n)
        n = nd->pods;
    if (row[SH_CPU] > 0 && nd->cpu / row[SH_CPU] < n)
        n = nd->cpu / row[SH_CPU];
    if (row[SH_MEM] > 0 && nd->mem / row[SH_MEM] < n)
        n = nd->mem / row[SH_MEM];
    return stranded + (nd->gpu_free - stranded) * (inst - n) / inst;
}

/* F = sum over shapes of weight * contribution (see packer.h). */
static int64_t frag_total(const kai_pack_table *tb, const kai_pack_strategy *st,
                          const frag_node *nd, const frag_agg *agg,
                          int64_t j, int64_t old_free, int64_t new_free)
{
    int64_t m, f = 0;
    for (m = 0; m < st->n_shapes; m++) {
        const int64_t *row = shape_row(st, m);
        if (row[SH_WEIGHT] == 0)
            continue;
        f += row[SH_WEIGHT] * frag_shape(row, tb, nd, agg->serving[m], agg->stranded[m],
                                         agg->slots[m], j, old_free, new_free);
    }
    return f;
}

/* Folds the change of device j (old_free -> new_free) into the aggregates. */
static void frag_apply(const kai_pack_table *tb, const kai_pack_strategy *st, frag_agg *agg,
                       int64_t j, int64_t old_free, int64_t new_free)
{
    int64_t m;
    for (m = 0; m < st->n_shapes; m++) {
        const int64_t *row = shape_row(st, m);
        int sa, sb;
        if (!is_gpu_shape(row))
            continue;
        sa = serves(row, tb, j, old_free);
        sb = serves(row, tb, j, new_free);
        agg->serving[m] += sb - sa;
        agg->stranded[m] += (sb ? 0 : new_free) - (sa ? 0 : old_free);
        agg->slots[m] += slots_of(row, tb, j, new_free) - slots_of(row, tb, j, old_free);
    }
}

/* Device order of a SHARED task under FRAGMENTATION: ascending by
 * (key, device-strategy order). */
static int frag_precedes(int64_t gpuspread, const kai_pack_table *tb,
                         int64_t a, int64_t ka, int64_t b, int64_t kb)
{
    if (ka != kb)
        return ka < kb;
    return precedes(gpuspread, tb, a, b);
}

/*
 * Fragmentation placement on node i (which passed the filter): chooses the
 * devices (written to out if non-NULL) and returns F_after - F_before; also
 * stores the milli taken.  See packer.h, "FRAGMENTATION".
 */
static int64_t frag_place(const kai_pack_table *tb, const kai_pack_task *t, int kind,
                          const kai_pack_strategy *st, int64_t gpuspread, int64_t i,
                          int64_t *out, int64_t *taken_out)
{
    int64_t s = tb->gpu_start[i], e = tb->gpu_start[i + 1], j, k, gpu_free = 0;
    int64_t before, taken = 0;
    frag_agg agg, base;
    frag_node nd;

    for (j = s; j < e; j++)
        gpu_free += tb->dev_free_milli[j];
    if (gpu_free == 0) {
        /* no free milli: every stranded_m is 0 before and after (only a CPU-only
         * task can be placed here), so delta is 0 */
        *taken_out = 0;
        return 0;
    }
    frag_collect(tb, st, s, e, &agg);
    nd.cpu = tb->free_milli_cpu[i];
    nd.mem = tb->free_memory_bytes[i];
    nd.pods = tb->free_pods[i];
    nd.gpu_free = gpu_free;
    before = frag_total(tb, st, &nd, &agg, -1, 0, 0);

    nd.cpu -= t->milli_cpu;
    nd.mem -= t->memory_bytes;
    nd.pods -= 1;

    if (kind == KIND_WHOLE) {
        int64_t got = 0;
        for (j = s; j < e && got < t->whole_gpus; j++) {
            if (tb->dev_free_milli[j] != 1000)
                continue;
            if (out != NULL)
                out[got] = j;
            got++;
            frag_apply(tb, st, &agg, j, 1000, 0);
        }
        taken = 1000 * t->whole_gpus;
    } else if (kind == KIND_SHARED) {
        /* key(j) = F with the node's CPU/memory/pod and only device j's need
         * taken, against the aggregates before any device is taken; the
         * picks are the first fraction_devices takers in (key, order),
         * selected by repeated minimum (no scratch buffer). */
        int64_t last = -1, last_key = 0;
        base = agg;
        nd.gpu_free = gpu_free;
        for (k = 0; k < t->fraction_devices; k++) {
            int64_t best = -1, best_key = 0, best_need = 0;
            for (j = s; j < e; j++) {
                int64_t need = need_milli(t, tb->dev_total_memory_mib[j]), key, f;
                if (need < 0 || tb->dev_free_milli[j] < need)
                    continue;
                f = tb->dev_free_milli[j];
                nd.gpu_free = gpu_free - need;
                key = frag_total(tb, st, &nd, &base, j, f, f - need);
                if (last >= 0 && !frag_precedes(gpuspread, tb, last, last_key, j, key))
                    continue;
                if (best < 0 || frag_precedes(gpuspread, tb, j, key, best, best_key)) {
                    best = j;
                    best_key = key;
                    best_need = need;
                }
            }
            if (best < 0)
                break; /* not reached: the filter guarantees enough takers */
            if (out != NULL)
                out[k] = best;
            frag_apply(tb, st, &agg, best, tb->dev_free_milli[best],
                       tb->dev_free_milli[best] - best_need);
            taken += best_need;
            last = best;
            last_key = best_key;
        }
    }
    nd.gpu_free = gpu_free - taken;
    *taken_out = taken;
    return frag_total(tb, st, &nd, &agg, -1, 0, 0) - before;
}

/* --- the scan ------------------------------------------------------------ */

/* One ranked node: its index and score (s0, s1, s2). */
typedef struct rank_row {
    int64_t node, s0, s1, s2;
} rank_row;

/* Whether score (s0, s1, s2) is strictly better than row r's. */
static int outranks(int64_t s0, int64_t s1, int64_t s2, const rank_row *r)
{
    return s0 > r->s0 || (s0 == r->s0 && (s1 > r->s1 || (s1 == r->s1 && s2 > r->s2)));
}

/* What kai_pack_table_check checks: the table's contents and, for FRAGMENTATION, each
 * node's device count (a valid shape and strategy assumed). */
static int table_checks(const kai_pack_table *table, const int64_t *eligible,
                        const kai_pack_strategy *strategy)
{
    int64_t i;
    if (!table_contents_valid(table, eligible))
        return KAI_PACK_EINVAL;
    if (strategy->gpu_strategy == KAI_PACK_GPU_FRAGMENTATION)
        for (i = 0; i < table->n_nodes; i++)
            if (table->gpu_start[i + 1] - table->gpu_start[i] > KAI_PACK_MAX_NODE_DEVICES)
                return KAI_PACK_EINVAL;
    return KAI_PACK_OK;
}

/*
 * Zero the rejection counts (when they can be), then validate the arguments
 * the entry points share (`trusting`: all but table_checks, see packer.h); on
 * success store the task kind and return KAI_PACK_OK.
 */
static int check_args(const kai_pack_table *table, const int64_t *eligible,
                      const kai_pack_task *task, const kai_pack_strategy *strategy,
                      int64_t *devices_out, int64_t devices_cap,
                      int64_t *reasons_out, int64_t reasons_cap, int trusting, int *kind_out)
{
    int kind;
    int64_t i, want;

    if (reasons_out != NULL && reasons_cap >= KAI_PACK_REASON_COUNT)
        for (i = 0; i < KAI_PACK_REASON_COUNT; i++)
            reasons_out[i] = 0;
    if (table == NULL || task == NULL || strategy == NULL || reasons_out == NULL ||
        reasons_cap < KAI_PACK_REASON_COUNT)
        return KAI_PACK_EINVAL;
    kind = task_kind(task);
    if (kind < 0)
        return KAI_PACK_EINVAL;
    want = kind == KIND_WHOLE ? task->whole_gpus
         : kind == KIND_SHARED ? task->fraction_devices : 0;
    if (devices_cap < want || (want > 0 && devices_out == NULL))
        return KAI_PACK_EINVAL;
    if (!in_range(strategy->gpu_strategy, 0, 2) || !in_range(strategy->cpu_strategy, 0, 1) ||
        !in_range(strategy->device_strategy, 0, 1))
        return KAI_PACK_EINVAL;
    if (!workload_valid(strategy))
        return KAI_PACK_EINVAL;
    if (!table_shape_valid(table, eligible))
        return KAI_PACK_EINVAL;
    if (!trusting && table_checks(table, eligible, strategy) != KAI_PACK_OK)
        return KAI_PACK_EINVAL;
    *kind_out = kind;
    return KAI_PACK_OK;
}

/*
 * Filter and score every node; count the rejected ones in reasons_out and
 * keep the best `cap` (>= 1) that passed in top[0..*count), best first (ties:
 * the lower index first).  With cap == 1 this is exactly the single best node.
 */
static void scan(const kai_pack_table *table, const int64_t *eligible,
                 const kai_pack_task *task, const kai_pack_strategy *strategy, int kind,
                 rank_row *top, int64_t cap, int64_t *count, int64_t *reasons_out)
{
    int64_t i, j, n, m = 0;
    int64_t gpu_sign, cpu_sign, gpuspread, frag;

    frag = strategy->gpu_strategy == KAI_PACK_GPU_FRAGMENTATION;
    gpu_sign = strategy->gpu_strategy == KAI_PACK_GPU_SPREAD ? 1 : -1;
    cpu_sign = strategy->cpu_strategy == KAI_PACK_CPU_SPREAD ? 1 : -1;
    gpuspread = strategy->device_strategy == KAI_PACK_DEVICE_GPUSPREAD;
    n = table->n_nodes;

    for (i = 0; i < n; i++) {
        int64_t s = table->gpu_start[i], e = table->gpu_start[i + 1];
        int64_t s0, s1, s2, cpu_key, at;

        if (eligible[i] == 0) {
            reasons_out[KAI_PACK_R_NOT_ELIGIBLE]++;
            continue;
        }
        if (table->free_pods[i] < 1) {
            reasons_out[KAI_PACK_R_PODS]++;
            continue;
        }
        if (table->free_milli_cpu[i] < task->milli_cpu) {
            reasons_out[KAI_PACK_R_CPU]++;
            continue;
        }
        if (table->free_memory_bytes[i] < task->memory_bytes) {
            reasons_out[KAI_PACK_R_MEMORY]++;
            continue;
        }
        cpu_key = cpu_sign * (table->free_milli_cpu[i] - task->milli_cpu);

        if (frag) {
            /* the GPU filter of the other strategies, then the fragmentation score */
            int64_t gpu_free = 0, taken, delta;
            if (kind == KIND_WHOLE) {
                int64_t idle = 0;
                for (j = s; j < e; j++)
                    idle += table->dev_free_milli[j] == 1000;
                if (idle < task->whole_gpus) {
                    reasons_out[KAI_PACK_R_GPU]++;
                    continue;
                }
            } else if (kind == KIND_SHARED) {
                int64_t capable = 0, takers = 0;
                if (e - s < task->fraction_devices) {
                    reasons_out[KAI_PACK_R_GPU]++;
                    continue;
                }
                for (j = s; j < e; j++) {
                    int64_t nd = need_milli(task, table->dev_total_memory_mib[j]);
                    if (nd < 0)
                        continue;
                    capable++;
                    takers += table->dev_free_milli[j] >= nd;
                }
                if (capable < task->fraction_devices) {
                    reasons_out[KAI_PACK_R_GPU_MEMORY]++;
                    continue;
                }
                if (takers < task->fraction_devices) {
                    reasons_out[KAI_PACK_R_GPU_SHARE]++;
                    continue;
                }
            }
            for (j = s; j < e; j++)
                gpu_free += table->dev_free_milli[j];
            delta = frag_place(table, task, kind, strategy, gpuspread, i, NULL, &taken);
            if (kind == KIND_CPU) {
                s0 = (e == s) ? 1 : 0;
                s1 = -delta;
            } else {
                s0 = -delta;
                s1 = -(gpu_free - taken);
            }
            s2 = cpu_key;
        } else if (kind == KIND_CPU) {
            s0 = (e == s) ? 1 : 0;
            s1 = cpu_key;
            s2 = 0;
        } else if (kind == KIND_WHOLE) {
            int64_t idle = 0, gpu_free = 0;
            for (j = s; j < e; j++) {
                gpu_free += table->dev_free_milli[j];
                idle += table->dev_free_milli[j] == 1000;
            }
            if (idle < task->whole_gpus) {
                reasons_out[KAI_PACK_R_GPU]++;
                continue;
            }
            s0 = gpu_sign * (gpu_free - 1000 * task->whole_gpus);
            s1 = cpu_key;
            s2 = 0;
        } else {
            int64_t capable = 0, takers = 0, shared_takers = 0, gpu_free = 0, reuse, taken;
            if (e - s < task->fraction_devices) {
                reasons_out[KAI_PACK_R_GPU]++;
                continue;
            }
            for (j = s; j < e; j++) {
                int64_t nd = need_milli(task, table->dev_total_memory_mib[j]);
                gpu_free += table->dev_free_milli[j];
                if (nd < 0)
                    continue;
                capable++;
                if (table->dev_free_milli[j] >= nd) {
                    takers++;
                    shared_takers += table->dev_shared[j] != 0;
                }
            }
            if (capable < task->fraction_devices) {
                reasons_out[KAI_PACK_R_GPU_MEMORY]++;
                continue;
            }
            if (takers < task->fraction_devices) {
                reasons_out[KAI_PACK_R_GPU_SHARE]++;
                continue;
            }
            /* The reuse count can never exceed min(fraction_devices, shared
             * takers): a node whose bound is below the reuse of the last
             * node kept (the list being full) cannot enter it, so its
             * devices need not be chosen. */
            if (shared_takers > task->fraction_devices)
                shared_takers = task->fraction_devices;
            if (m == cap && shared_takers < top[m - 1].s0)
                continue;
            if (!gpuspread && task->fraction_milli != 0) {
                /* GPUPACK takes the shared takers first, and every device
                 * takes fraction_milli: the choice itself is not needed. */
                reuse = shared_takers;
                taken = task->fraction_milli * task->fraction_devices;
            } else {
                choose_shared(table, task, gpuspread, s, e, NULL, &reuse, &taken);
            }
            s0 = reuse;
            s1 = gpu_sign * (gpu_free - taken);
            s2 = cpu_key;
        }

        /* keep it if the list has room or it outranks the last kept; it goes
         * after every kept node it does not outrank (those have lower indexes) */
        if (m == cap && !outranks(s0, s1, s2, &top[m - 1]))
            continue;
        at = m < cap ? m : m - 1;
        while (at > 0 && outranks(s0, s1, s2, &top[at - 1])) {
            top[at] = top[at - 1];
            at--;
        }
        top[at].node = i;
        top[at].s0 = s0;
        top[at].s1 = s1;
        top[at].s2 = s2;
        if (m < cap)
            m++;
    }
    *count = m;
}

/* Write the devices `task` takes on node `best` (which passed the filter). */
static void choose_devices(const kai_pack_table *table, const kai_pack_task *task,
                           const kai_pack_strategy *strategy, int kind, int64_t best,
                           int64_t *devices_out)
{
    int64_t j, gpuspread = strategy->device_strategy == KAI_PACK_DEVICE_GPUSPREAD;
    if (strategy->gpu_strategy == KAI_PACK_GPU_FRAGMENTATION) {
        int64_t taken;
        frag_place(table, task, kind, strategy, gpuspread, best, devices_out, &taken);
    } else if (kind == KIND_WHOLE) {
        int64_t got = 0;
        for (j = table->gpu_start[best]; j < table->gpu_start[best + 1] && got < task->whole_gpus; j++)
            if (table->dev_free_milli[j] == 1000)
                devices_out[got++] = j;
    } else if (kind == KIND_SHARED) {
        int64_t reuse, taken;
        choose_shared(table, task, gpuspread, table->gpu_start[best],
                      table->gpu_start[best + 1], devices_out, &reuse, &taken);
    }
}

/* --- the entry points --------------------------------------------------- */

static int place(const kai_pack_table *table, const int64_t *eligible,
                 const kai_pack_task *task, const kai_pack_strategy *strategy,
                 int64_t *node_out, int64_t *devices_out, int64_t devices_cap,
                 int64_t *reasons_out, int64_t reasons_cap, int trusting)
{
    int kind, code;
    int64_t count;
    rank_row top[1];

    if (node_out != NULL)
        *node_out = -1;
    code = check_args(table, eligible, task, strategy, devices_out, devices_cap,
                      reasons_out, reasons_cap, trusting, &kind);
    if (code != KAI_PACK_OK)
        return code;
    if (node_out == NULL)
        return KAI_PACK_EINVAL;
    scan(table, eligible, task, strategy, kind, top, 1, &count, reasons_out);
    if (count == 0)
        return KAI_PACK_NO_FIT;
    *node_out = top[0].node;
    choose_devices(table, task, strategy, kind, top[0].node, devices_out);
    return KAI_PACK_OK;
}

static int rank(const kai_pack_table *table, const int64_t *eligible,
                const kai_pack_task *task, const kai_pack_strategy *strategy,
                int64_t *ranked_out, int64_t ranked_cap, int64_t *ranked_n_out,
                int64_t *devices_out, int64_t devices_cap,
                int64_t *reasons_out, int64_t reasons_cap, int trusting)
{
    int kind, code;
    int64_t i, count;

    if (ranked_n_out != NULL)
        *ranked_n_out = 0;
    code = check_args(table, eligible, task, strategy, devices_out, devices_cap,
                      reasons_out, reasons_cap, trusting, &kind);
    if (code != KAI_PACK_OK)
        return code;
    if (ranked_out == NULL || ranked_n_out == NULL || !in_range(ranked_cap, 1, KAI_PACK_MAX_RANKED))
        return KAI_PACK_EINVAL;
    {
        rank_row top[KAI_PACK_MAX_RANKED];  /* 32 KiB of stack, no allocation */
        scan(table, eligible, task, strategy, kind, top, ranked_cap, &count, reasons_out);
        for (i = 0; i < count; i++) {
            ranked_out[4 * i] = top[i].node;
            ranked_out[4 * i + 1] = top[i].s0;
            ranked_out[4 * i + 2] = top[i].s1;
            ranked_out[4 * i + 3] = top[i].s2;
        }
    }
    *ranked_n_out = count;
    if (count == 0)
        return KAI_PACK_NO_FIT;
    choose_devices(table, task, strategy, kind, ranked_out[0], devices_out);
    return KAI_PACK_OK;
}

int kai_pack_place(const kai_pack_table *table, const int64_t *eligible,
                   const kai_pack_task *task, const kai_pack_strategy *strategy,
                   int64_t *node_out, int64_t *devices_out, int64_t devices_cap,
                   int64_t *reasons_out, int64_t reasons_cap)
{
    return place(table, eligible, task, strategy, node_out, devices_out, devices_cap,
                 reasons_out, reasons_cap, 0);
}

int kai_pack_place_trusting(const kai_pack_table *table, const int64_t *eligible,
                            const kai_pack_task *task, const kai_pack_strategy *strategy,
                            int64_t *node_out, int64_t *devices_out, int64_t devices_cap,
                            int64_t *reasons_out, int64_t reasons_cap)
{
    return place(table, eligible, task, strategy, node_out, devices_out, devices_cap,
                 reasons_out, reasons_cap, 1);
}

int kai_pack_rank(const kai_pack_table *table, const int64_t *eligible,
                  const kai_pack_task *task, const kai_pack_strategy *strategy,
                  int64_t *ranked_out, int64_t ranked_cap, int64_t *ranked_n_out,
                  int64_t *devices_out, int64_t devices_cap,
                  int64_t *reasons_out, int64_t reasons_cap)
{
    return rank(table, eligible, task, strategy, ranked_out, ranked_cap, ranked_n_out,
                devices_out, devices_cap, reasons_out, reasons_cap, 0);
}

int kai_pack_rank_trusting(const kai_pack_table *table, const int64_t *eligible,
                           const kai_pack_task *task, const kai_pack_strategy *strategy,
                           int64_t *ranked_out, int64_t ranked_cap, int64_t *ranked_n_out,
                           int64_t *devices_out, int64_t devices_cap,
                           int64_t *reasons_out, int64_t reasons_cap)
{
    return rank(table, eligible, task, strategy, ranked_out, ranked_cap, ranked_n_out,
                devices_out, devices_cap, reasons_out, reasons_cap, 1);
}

int kai_pack_table_check(const kai_pack_table *table, const int64_t *eligible,
                         const kai_pack_strategy *strategy)
{
    if (table == NULL || strategy == NULL || !table_shape_valid(table, eligible) ||
        !in_range(strategy->gpu_strategy, 0, 2))
        return KAI_PACK_EINVAL;
    return table_checks(table, eligible, strategy);
}
