/*
 * framing.c -- see framing.h for the specification.  The pure-Python twins
 * are index_frames_py and check_frames_py in kai_es/adapters/framing.py.
 */
#include "framing.h"

#include <stddef.h>
#include <string.h>

int kai_frame_abi_version(void) { return KAI_FRAME_ABI_VERSION; }

/* --- CRC-32, slicing-by-16 ------------------------------------------------
 *
 * CRC_TABLE[k][n] is the CRC register (reflected, no initial value, no final
 * xor) after feeding byte n followed by k zero bytes; CRC_TABLE[0] is the
 * classic byte-at-a-time table.  Sixteen tables let the main loop fold 16
 * input bytes with 16 independent lookups.
 *
 * The register update is linear over GF(2), so CRC_TABLE[k][n] is the xor of
 * CRC_TABLE[k][1 << i] over the set bits i of n.  CRC_BASE_k lists those
 * eight values (bit 0 first) and CRC_ROW expands them into the 256 entries of
 * row k at compile time.  The eight values come from the classic
 * construction: T[0][n] is n after eight steps of c = c & 1 ?
 * (c >> 1) ^ 0xEDB88320 : c >> 1, and T[k + 1][n] = (T[k][n] >> 8) ^
 * T[0][T[k][n] & 0xFF].  Tests hold kai_frame_crc32_tables to zlib.crc32 on
 * every length up to 300, all byte values and random buffers.
 */
#define CRC_BASE_0  0x77073096u, 0xee0e612cu, 0x076dc419u, 0x0edb8832u, 0x1db71064u, 0x3b6e20c8u, 0x76dc4190u, 0xedb88320u
#define CRC_BASE_1  0x191b3141u, 0x32366282u, 0x646cc504u, 0xc8d98a08u, 0x4ac21251u, 0x958424a2u, 0xf0794f05u, 0x3b83984bu
#define CRC_BASE_2  0x01c26a37u, 0x0384d46eu, 0x0709a8dcu, 0x0e1351b8u, 0x1c26a370u, 0x384d46e0u, 0x709a8dc0u, 0xe1351b80u
#define CRC_BASE_3  0xb8bc6765u, 0xaa09c88bu, 0x8f629757u, 0xc5b428efu, 0x5019579fu, 0xa032af3eu, 0x9b14583du, 0xed59b63bu
#define CRC_BASE_4  0x3d6029b0u, 0x7ac05360u, 0xf580a6c0u, 0x30704bc1u, 0x60e09782u, 0xc1c12f04u, 0x58f35849u, 0xb1e6b092u
#define CRC_BASE_5  0xcb5cd3a5u, 0x4dc8a10bu, 0x9b914216u, 0xec53826du, 0x03d6029bu, 0x07ac0536u, 0x0f580a6cu, 0x1eb014d8u
#define CRC_BASE_6  0xa6770bb4u, 0x979f1129u, 0xf44f2413u, 0x33ef4e67u, 0x67de9cceu, 0xcfbd399cu, 0x440b7579u, 0x8816eaf2u
#define CRC_BASE_7  0xccaa009eu, 0x4225077du, 0x844a0efau, 0xd3e51bb5u, 0x7cbb312bu, 0xf9766256u, 0x299dc2edu, 0x533b85dau
#define CRC_BASE_8  0x177b1443u, 0x2ef62886u, 0x5dec510cu, 0xbbd8a218u, 0xacc04271u, 0x82f182a3u, 0xde920307u, 0x6655004fu
#define CRC_BASE_9  0xefc26b3eu, 0x04f5d03du, 0x09eba07au, 0x13d740f4u, 0x27ae81e8u, 0x4f5d03d0u, 0x9eba07a0u, 0xe6050901u
#define CRC_BASE_10 0xc18edfc0u, 0x586cb9c1u, 0xb0d97382u, 0xbac3e145u, 0xaef6c4cbu, 0x869c8fd7u, 0xd64819efu, 0x77e1359fu
#define CRC_BASE_11 0x9ba54c6fu, 0xec3b9e9fu, 0x03063b7fu, 0x060c76feu, 0x0c18edfcu, 0x1831dbf8u, 0x3063b7f0u, 0x60c76fe0u
#define CRC_BASE_12 0xdd96d985u, 0x605cb54bu, 0xc0b96a96u, 0x5a03d36du, 0xb407a6dau, 0xb37e4bf5u, 0xbd8d91abu, 0xa06a2517u
#define CRC_BASE_13 0x9d0fe176u, 0xe16ec4adu, 0x19ac8f1bu, 0x33591e36u, 0x66b23c6cu, 0xcd6478d8u, 0x41b9f7f1u, 0x8373efe2u
#define CRC_BASE_14 0xb9fbdbe8u, 0xa886b191u, 0x8a7c6563u, 0xcf89cc87u, 0x44629f4fu, 0x88c53e9eu, 0xcafb7b7du, 0x4e87f0bbu
#define CRC_BASE_15 0xae689191u, 0x87a02563u, 0xd4314c87u, 0x73139f4fu, 0xe6273e9eu, 0x173f7b7du, 0x2e7ef6fau, 0x5cfdedf4u

#define CRC_BIT(n, i, b) ((((unsigned)(n) >> (i)) & 1u) ? (b) : 0u)
#define CRC_ENTRY_(n, b0, b1, b2, b3, b4, b5, b6, b7) \
    (CRC_BIT(n, 0, b0) ^ CRC_BIT(n, 1, b1) ^ CRC_BIT(n, 2, b2) ^ CRC_BIT(n, 3, b3) ^ \
     CRC_BIT(n, 4, b4) ^ CRC_BIT(n, 5, b5) ^ CRC_BIT(n, 6, b6) ^ CRC_BIT(n, 7, b7))
/* "..." is the eight values of a CRC_BASE_k, already expanded */
#define CRC_ENTRY(n, ...) CRC_ENTRY_(n, __VA_ARGS__)
#define CRC_4(n, ...) CRC_ENTRY(n, __VA_ARGS__), CRC_ENTRY((n) + 1, __VA_ARGS__), \
                      CRC_ENTRY((n) + 2, __VA_ARGS__), CRC_ENTRY((n) + 3, __VA_ARGS__)
#define CRC_16(n, ...) CRC_4(n, __VA_ARGS__), CRC_4((n) + 4, __VA_ARGS__), \
                       CRC_4((n) + 8, __VA_ARGS__), CRC_4((n) + 12, __VA_ARGS__)
#define CRC_64(n, ...) CRC_16(n, __VA_ARGS__), CRC_16((n) + 16, __VA_ARGS__), \
                       CRC_16((n) + 32, __VA_ARGS__), CRC_16((n) + 48, __VA_ARGS__)
#define CRC_ROW(B) { CRC_64(0, B), CRC_64(64, B), CRC_64(128, B), CRC_64(192, B) }

static const uint32_t CRC_TABLE[16][256] = {
    CRC_ROW(CRC_BASE_0),  CRC_ROW(CRC_BASE_1),  CRC_ROW(CRC_BASE_2),  CRC_ROW(CRC_BASE_3),
    CRC_ROW(CRC_BASE_4),  CRC_ROW(CRC_BASE_5),  CRC_ROW(CRC_BASE_6),  CRC_ROW(CRC_BASE_7),
    CRC_ROW(CRC_BASE_8),  CRC_ROW(CRC_BASE_9),  CRC_ROW(CRC_BASE_10), CRC_ROW(CRC_BASE_11),
    CRC_ROW(CRC_BASE_12), CRC_ROW(CRC_BASE_13), CRC_ROW(CRC_BASE_14), CRC_ROW(CRC_BASE_15),
};

/* Little-endian load, whatever the host's byte order (compilers turn it into
 * one unaligned load on little-endian machines). */
static uint32_t load_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t crc32_tables(uint32_t c, const unsigned char *p, size_t n)
{
    const uint32_t (*t)[256] = CRC_TABLE;
    while (n >= 16) {
        uint32_t a = c ^ load_le32(p);
        uint32_t b = load_le32(p + 4);
        uint32_t d = load_le32(p + 8);
        uint32_t e = load_le32(p + 12);
        c = t[15][a & 0xFFu] ^ t[14][(a >> 8) & 0xFFu] ^ t[13][(a >> 16) & 0xFFu] ^ t[12][a >> 24] ^
            t[11][b & 0xFFu] ^ t[10][(b >> 8) & 0xFFu] ^ t[9][(b >> 16) & 0xFFu] ^ t[8][b >> 24] ^
            t[7][d & 0xFFu] ^ t[6][(d >> 8) & 0xFFu] ^ t[5][(d >> 16) & 0xFFu] ^ t[4][d >> 24] ^
            t[3][e & 0xFFu] ^ t[2][(e >> 8) & 0xFFu] ^ t[1][(e >> 16) & 0xFFu] ^ t[0][e >> 24];
        p += 16;
        n -= 16;
    }
    while (n > 0) {
        c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFFu];
        n--;
    }
    return c;
}

/* --- CRC-32, carry-less multiplication (x86-64 with PCLMULQDQ) -------------
 *
 * The tables above are load-bound at about 3 GB/s; folding 64 bytes at a time
 * with PCLMULQDQ is several times faster.  This is the algorithm of "Fast CRC
 * Computation for Generic Polynomials Using PCLMULQDQ Instruction" (Gopal,
 * Ozturk et al., Intel, 2009) with the bit-reflected constants for zlib's
 * polynomial given there (also in Linux's crc32-pclmul_asm.S and Chromium's
 * zlib crc32_simd.c).  Chosen at run time when the CPU has the instruction;
 * elsewhere (other CPUs, other compilers) only the tables are used.  Both are
 * held to zlib.crc32 by the tests (kai_frame_crc32_tables is the table path
 * alone).
 */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KAI_FRAME_CLMUL 1
#include <emmintrin.h>
#include <wmmintrin.h>

static int have_clmul(void) { return __builtin_cpu_supports("pclmul"); }

/* The register c (not inverted) after p[0, n); n >= 64 and a multiple of 16. */
__attribute__((target("pclmul")))
static uint32_t crc32_clmul(uint32_t c, const unsigned char *p, size_t n)
{
    static const uint64_t k1k2[2] = {0x0154442bd4u, 0x01c6e41596u};
    static const uint64_t k3k4[2] = {0x01751997d0u, 0x00ccaa009eu};
    static const uint64_t k5k0[2] = {0x0163cd6124u, 0x0000000000u};
    static const uint64_t poly[2] = {0x01db710641u, 0x01f7011641u};
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8;

    x1 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)c));
    x2 = _mm_loadu_si128((const __m128i *)(p + 16));
    x3 = _mm_loadu_si128((const __m128i *)(p + 32));
    x4 = _mm_loadu_si128((const __m128i *)(p + 48));
    p += 64;
    n -= 64;

    /* fold four 128-bit lanes over each further 64 bytes */
    x0 = _mm_loadu_si128((const __m128i *)k1k2);
    while (n >= 64) {
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
        x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), _mm_loadu_si128((const __m128i *)p));
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), _mm_loadu_si128((const __m128i *)(p + 16)));
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), _mm_loadu_si128((const __m128i *)(p + 32)));
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), _mm_loadu_si128((const __m128i *)(p + 48)));
        p += 64;
        n -= 64;
    }

    /* fold the four lanes into one, then fold in each further 16 bytes */
    x0 = _mm_loadu_si128((const __m128i *)k3k4);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    while (n >= 16) {
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, _mm_loadu_si128((const __m128i *)p)), x5);
        p += 16;
        n -= 16;
    }

    /* 128 bits -> 64 bits */
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
    x3 = _mm_setr_epi32(~0, 0, ~0, 0);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
    x0 = _mm_loadu_si128((const __m128i *)k5k0);
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_clmulepi64_si128(_mm_and_si128(x1, x3), x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);

    /* Barrett reduction to 32 bits */
    x0 = _mm_loadu_si128((const __m128i *)poly);
    x2 = _mm_clmulepi64_si128(_mm_and_si128(x1, x3), x0, 0x10);
    x2 = _mm_clmulepi64_si128(_mm_and_si128(x2, x3), x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_cvtsi128_si32(_mm_srli_si128(x1, 4));
}
#endif

/* zlib's crc32(crc, p, n); `fast`: the caller has checked have_clmul(). */
static uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t n, int fast)
{
    uint32_t c = ~crc;
#ifdef KAI_FRAME_CLMUL
    if (fast && n >= 64) {
        size_t bulk = n & ~(size_t)15;
        c = crc32_clmul(c, p, bulk);
        p += bulk;
        n -= bulk;
    }
#else
    (void)fast;
#endif
    return ~crc32_tables(c, p, n);
}

static int crc32_fast(void)
{
#ifdef KAI_FRAME_CLMUL
    return have_clmul();
#else
    return 0;
#endif
}

uint32_t kai_frame_crc32(uint32_t crc, const unsigned char *data, int64_t len)
{
    if (data == NULL || len <= 0 || (uint64_t)len > SIZE_MAX)
        return crc;
    return crc32_update(crc, data, (size_t)len, crc32_fast());
}

uint32_t kai_frame_crc32_tables(uint32_t crc, const unsigned char *data, int64_t len)
{
    if (data == NULL || len <= 0 || (uint64_t)len > SIZE_MAX)
        return crc;
    return crc32_update(crc, data, (size_t)len, 0);
}

/* --- one line -------------------------------------------------------------- */

/* 0..15, or -1 if ch is not a hex digit (either case). */
static int hex_digit(unsigned char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/* zlib.crc32(b"+"): where the CRC of a '+' line starts from. */
#define CRC_OF_PLUS 0x7EBE16CDu

/* The reason a terminated line of `length` bytes (its last byte is the '\n',
 * length >= 1) is not valid, or KAI_FRAME_OK.  Reads only line[0, length). */
static int32_t check_line(const unsigned char *line, int64_t length, int fast)
{
    uint32_t expected = 0;
    uint32_t seed;
    int i;
    if (length < KAI_FRAME_MIN_LINE)
        return KAI_FRAME_NO_FRAME;
    if (line[KAI_FRAME_HEAD - 1] == '\t')
        seed = 0;
    else if (line[KAI_FRAME_HEAD - 1] == '+')
        seed = CRC_OF_PLUS;
    else
        return KAI_FRAME_NO_FRAME;
    for (i = 0; i < KAI_FRAME_HEAD - 1; i++) {
        int v = hex_digit(line[i]);
        if (v < 0)
            return KAI_FRAME_BAD_HEX;
        expected = expected << 4 | (uint32_t)v;
    }
    /* the body: after the separator, before the '\n' */
    if (crc32_update(seed, line + KAI_FRAME_HEAD, (size_t)(length - KAI_FRAME_MIN_LINE), fast) != expected)
        return KAI_FRAME_CRC_MISMATCH;
    return KAI_FRAME_OK;
}

/* --- the index ------------------------------------------------------------- */

int64_t kai_frame_index(const unsigned char *buf, int64_t len, int64_t base,
                        int64_t *offsets, int64_t cap, kai_frame_stop *stop)
{
    int64_t pos = 0;  /* start of the next line, relative to buf */
    int64_t end = 0;  /* end of the line being looked at */
    int64_t n = 0;
    int64_t committed = 0;
    int64_t committed_end = 0;
    int32_t reason = KAI_FRAME_OK;
    int fast;

    if (stop == NULL || len < 0 || base < 0 || cap < 0 || base > INT64_MAX - len ||
        (uint64_t)len > SIZE_MAX || (buf == NULL && len > 0) || (offsets == NULL && cap > 0))
        return KAI_FRAME_EINVAL;

    fast = crc32_fast();
    while (pos < len && n < cap) {
        const unsigned char *nl = memchr(buf + pos, '\n', (size_t)(len - pos));
        if (nl == NULL) {
            end = len;
            reason = KAI_FRAME_NOT_TERMINATED;
            break;
        }
        end = (int64_t)(nl - buf) + 1;
        reason = check_line(buf + pos, end - pos, fast);
        if (reason != KAI_FRAME_OK)
            break;
        offsets[n++] = base + pos;
        if (buf[pos + KAI_FRAME_HEAD - 1] == '\t') {
            committed = n;
            committed_end = end;
        }
        pos = end;
    }
    stop->offset = base + pos;
    stop->line_end = reason == KAI_FRAME_OK ? base + pos : base + end;
    stop->committed = committed;
    stop->committed_end = base + committed_end;
    stop->reason = reason;
    return n;
}

int64_t kai_frame_check(const unsigned char *buf, int64_t len, const int64_t *starts, int64_t n)
{
    int64_t i;
    if (len < 0 || n < 0 || starts == NULL || (buf == NULL && len > 0))
        return KAI_FRAME_EINVAL;
    for (i = 0; i < n; i++) {
        int64_t s = starts[i];
        int64_t e = starts[i + 1];
        /* in this order, so that e - s cannot overflow */
        if (s < 0 || e > len || e < s || e - s < KAI_FRAME_MIN_LINE)
            return i;
        if ((buf[s + KAI_FRAME_HEAD - 1] != '\t' && buf[s + KAI_FRAME_HEAD - 1] != '+') ||
            buf[e - 1] != '\n')
            return i;
    }
    return n;
}
