/*
 * framing.h -- indexing and verifying the lines of the file event log.
 *
 * The embedded event log (kai_es/adapters/file_log.py) holds one event per
 * line, framed as
 *
 *     <8 hex digits: CRC-32 of BODY> '\t' BODY '\n'     (ends a batch)
 *     <8 hex digits: CRC-32 of '+' BODY> '+' BODY '\n'   (the batch goes on)
 *
 * where the CRC is zlib's CRC-32 (reflected polynomial 0xEDB88320, initial
 * value and final xor 0xFFFFFFFF; what Python's zlib.crc32 returns) and the
 * hex digits may be lower or upper case.  One append is one BATCH: zero or
 * more '+' lines and one '\t' line, so a reader (and a writer recovering
 * from a crash mid-append) can tell a whole append from a torn one; a log
 * written before batches existed has only '\t' lines, each a batch of one.  kai_frame_index() walks a buffer of
 * such lines, records where each valid line starts and stops at the first
 * line that is not valid, saying why; kai_frame_check() takes a cheap second
 * look at lines indexed earlier.  The pure-Python twins in
 * kai_es/adapters/framing.py (index_frames_py, check_frames_py) are the
 * executable specification; this file and that one describe the same
 * functions and must give identical answers on every input (hypothesis
 * property tests hold them together).
 *
 * Properties of the implementation (framing.c):
 *   - pure and reentrant: no state but constant tables (and the compiler
 *     runtime's record of the CPU's features), no I/O;
 *   - no allocation: the caller supplies every buffer;
 *   - bounded: reads only buf[0, len), writes only offsets[0, cap) and *stop.
 *
 * ---------------------------------------------------------------------------
 * A LINE of the buffer is a maximal run of bytes ending with (and including)
 * the first '\n' at or after its start; the bytes after the last '\n' of the
 * buffer, if any, are an unterminated line.  With L its length including the
 * '\n', a line is VALID iff, checked in this order (the first failing check
 * is the reason):
 *   1 NOT_TERMINATED  it ends with '\n' (a buffer that ends mid-line: a torn
 *                     tail, or another writer's append in progress);
 *   2 NO_FRAME        L >= 10 (8 digits, the separator, the '\n'; the body
 *                     may be empty) and byte 8 is '\t' or '+';
 *   3 BAD_HEX         bytes 0..7 are each one of 0-9, a-f, A-F;
 *   4 CRC_MISMATCH    the CRC-32 of bytes 9..L-2 (the body, without the
 *                     separator and the '\n'), preceded by the '+' on a '+'
 *                     line, equals the number those 8 digits spell.
 *
 * kai_frame_index(buf, len, base, offsets, cap, stop)
 *   Walks the lines of buf[0, len) from the start.  For each valid line, in
 *   order, it writes base + (the line's start) to offsets[n++]; it stops at
 *   the first line that is not valid, when the buffer is exhausted, or when
 *   n == cap.  Returns n (0 <= n <= cap) and fills *stop:
 *     offset    base + the end of the n valid lines (the start of the next
 *               line, unread or invalid);
 *     reason    KAI_FRAME_OK if no invalid line was met: then either
 *               offset == base + len (the buffer is exhausted) or n == cap
 *               (call again from offset to go on); otherwise the reason the
 *               line that starts at offset -- line number n of this call --
 *               is not valid;
 *     line_end  reason != OK: base + the end of that invalid line (past its
 *               '\n', or base + len if it is not terminated), so a caller can
 *               tell a bad LAST line (line_end == base + len) from a bad line
 *               in the middle; reason == OK: equal to offset;
 *     committed the number of the n lines up to and including the last '\t'
 *               line among them (0 if none: every line read continues a
 *               batch that has not ended yet);
 *     committed_end  base + the end of that line (base if committed == 0).
 *   Which lines a reader may hand out (whole batches only) is the caller's
 *   business: kai_es/adapters/framing.py keeps only whole batches.
 *   Returns KAI_FRAME_EINVAL (*stop untouched) if stop is NULL, len, base or
 *   cap is negative, base + len overflows int64_t, len exceeds SIZE_MAX, or
 *   buf (offsets) is NULL while len (cap) is positive.
 *
 * kai_frame_check(buf, len, starts, n)
 *   A cheap look at n lines indexed earlier, before they are read again:
 *   line i is [starts[i], starts[i + 1]) (starts has n + 1 entries).
 *   Returns the first i whose line no longer looks like a verified line --
 *   it does not lie inside buf[0, len), it is shorter than
 *   KAI_FRAME_MIN_LINE, its byte 8 is not '\t' or '+' or its last byte is
 *   not '\n'
 *   -- or n if none; KAI_FRAME_EINVAL if len or n is negative, starts is
 *   NULL, or buf is NULL while len is positive.  The CRC is not recomputed.
 *
 * kai_frame_crc32(crc, data, len)
 *   zlib's crc32(): the CRC-32 of data[0, len) continued from crc (0 to
 *   start); crc itself if len <= 0 or data is NULL.  The same function
 *   kai_frame_index uses: carry-less multiplication where the CPU has it
 *   (x86-64 PCLMULQDQ), slicing-by-16 tables elsewhere.
 * kai_frame_crc32_tables(crc, data, len)
 *   The same, always through the tables.  Both are exposed so tests can hold
 *   each path to zlib.crc32.
 *
 * The declarations between the CDEF markers are fed verbatim to cffi's
 * cdef(), so they use plain C types and integer-literal #defines only.
 */
#ifndef KAI_ES_FRAMING_H
#define KAI_ES_FRAMING_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CDEF-BEGIN */
#define KAI_FRAME_ABI_VERSION 2
#define KAI_FRAME_HEAD 9
#define KAI_FRAME_MIN_LINE 10

enum kai_frame_code {
    KAI_FRAME_EINVAL = -1
};

enum kai_frame_reason {
    KAI_FRAME_OK = 0,
    KAI_FRAME_NOT_TERMINATED = 1,
    KAI_FRAME_NO_FRAME = 2,
    KAI_FRAME_BAD_HEX = 3,
    KAI_FRAME_CRC_MISMATCH = 4
};

typedef struct kai_frame_stop {
    int64_t offset;    /* base + end of the valid lines indexed by this call */
    int64_t line_end;  /* reason != OK: base + end of the invalid line; else offset */
    int64_t committed;      /* lines of this call up to the last that ends a batch */
    int64_t committed_end;  /* base + end of that line; base if committed == 0 */
    int32_t reason;    /* enum kai_frame_reason */
} kai_frame_stop;

int kai_frame_abi_version(void);

int64_t kai_frame_check(const unsigned char *buf,
                        int64_t len,
                        const int64_t *starts,
                        int64_t n);

uint32_t kai_frame_crc32(uint32_t crc, const unsigned char *data, int64_t len);

uint32_t kai_frame_crc32_tables(uint32_t crc, const unsigned char *data, int64_t len);

int64_t kai_frame_index(const unsigned char *buf,
                        int64_t len,
                        int64_t base,
                        int64_t *offsets,
                        int64_t cap,
                        kai_frame_stop *stop);
/* CDEF-END */

#ifdef __cplusplus
}
#endif

#endif /* KAI_ES_FRAMING_H */
