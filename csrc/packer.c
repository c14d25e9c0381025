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

static int table_valid(const kai_pack_table *tb, const int64_t *eligible)
{
    int64_t n = tb->n_nodes, d = tb->n_devices, i, j;
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
    if (tb->gpu_start[0] != 0 || tb->gpu_start[n] != d)
        return 0;
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

/* --- shared-task helpers ------------------------------------------------ */

/* need(j) for a SHARED task, or -1 if device j is not size-capable. */
static int64_t need_milli(const kai_pack_task *t, int64_t total_mib)
{
    if (t->fraction_milli != 0)
        return t->fraction_milli;
    if (total_mib <= 0 || t->gpu_memory_mib > total_mib)
        return -1;
    return (t->gpu_memory_mib * 1000 + total_mib - 1) / total_mib;
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

/* --- the entry point ---------------------------------------------------- */

int kai_pack_place(const kai_pack_table *table,
                   const int64_t *eligible,
                   const kai_pack_task *task,
                   const kai_pack_strategy *strategy,
                   int64_t *node_out,
                   int64_t *devices_out,
                   int64_t devices_cap,
                   int64_t *reasons_out,
                   int64_t reasons_cap)
{
    int kind;
    int64_t i, j, n, want, best = -1;
    int64_t best_s0 = 0, best_s1 = 0, best_s2 = 0;
    int64_t gpu_sign, cpu_sign, gpuspread;

    if (node_out != NULL)
        *node_out = -1;
    if (reasons_out != NULL && reasons_cap >= KAI_PACK_REASON_COUNT)
        for (i = 0; i < KAI_PACK_REASON_COUNT; i++)
            reasons_out[i] = 0;

    if (table == NULL || task == NULL || strategy == NULL || node_out == NULL ||
        reasons_out == NULL || reasons_cap < KAI_PACK_REASON_COUNT)
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
    if (!table_valid(table, eligible))
        return KAI_PACK_EINVAL;
    if (strategy->gpu_strategy == KAI_PACK_GPU_FRAGMENTATION)
        return KAI_PACK_EUNSUPPORTED;

    gpu_sign = strategy->gpu_strategy == KAI_PACK_GPU_SPREAD ? 1 : -1;
    cpu_sign = strategy->cpu_strategy == KAI_PACK_CPU_SPREAD ? 1 : -1;
    gpuspread = strategy->device_strategy == KAI_PACK_DEVICE_GPUSPREAD;
    n = table->n_nodes;

    for (i = 0; i < n; i++) {
        int64_t s = table->gpu_start[i], e = table->gpu_start[i + 1];
        int64_t s0, s1, s2, cpu_key;

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

        if (kind == KIND_CPU) {
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
             * takers): a node whose bound is below the best reuse so far
             * cannot win, so its devices need not be chosen. */
            if (shared_takers > task->fraction_devices)
                shared_takers = task->fraction_devices;
            if (best >= 0 && shared_takers < best_s0)
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

        if (best < 0 || s0 > best_s0 || (s0 == best_s0 && (s1 > best_s1 ||
                                          (s1 == best_s1 && s2 > best_s2)))) {
            best = i;
            best_s0 = s0;
            best_s1 = s1;
            best_s2 = s2;
        }
    }

    if (best < 0)
        return KAI_PACK_NO_FIT;

    *node_out = best;
    if (kind == KIND_WHOLE) {
        int64_t got = 0;
        for (j = table->gpu_start[best]; j < table->gpu_start[best + 1] && got < want; j++)
            if (table->dev_free_milli[j] == 1000)
                devices_out[got++] = j;
    } else if (kind == KIND_SHARED) {
        int64_t reuse, taken;
        choose_shared(table, task, gpuspread, table->gpu_start[best],
                      table->gpu_start[best + 1], devices_out, &reuse, &taken);
    }
    return KAI_PACK_OK;
}
