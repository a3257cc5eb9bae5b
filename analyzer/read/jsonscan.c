/* _jsonscan: the trace reader's hot loop in C.
 *
 * One piece of a Kineto trace's `traceEvents` array (a JSON array of event objects) goes straight from
 * its bytes to flat native columns, with no Python object per event: the per-event Python work of
 * msgspec structs + column building was the whole read time.
 *
 * scan(buf) -> (n, cols, raws) | None
 *
 * The contract is agreement with `msgspec.json.Decoder(list[Event]).decode(buf)` (analyzer/read/events.py):
 * every value this scanner returns is the value msgspec would have put in the structs, to the bit.
 * Whenever the input is not valid for that decoder, or holds something this scanner chooses not to
 * handle (duplicate recognised keys, escaped keys, surrogate escapes, huge or out-of-range numbers,
 * deep nesting, ...), it returns None and the caller takes the exact slow path. None is never wrong;
 * so the scanner is a strict JSON validator for everything it reads and everything it skips.
 *
 * Layout of this file: character-level scanners (whitespace, strings, numbers, literals); the value
 * skipper (validates nested values it does not keep); the raw-text intern table; the columns; the event
 * and args parsers; the Python entry point, which parses with the GIL released and builds the Python
 * objects afterwards.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned char uchar;

/* Nesting deeper than this (counting the outer array as 1) answers None. msgspec raises RecursionError
 * at a depth tied to the Python recursion limit (what is left of it where it is called), so the limit
 * of a call is also at most half of what is left then (see depth_limit). */
#define MAX_DEPTH 256
/* A number literal longer than this answers None where its value matters (columns, Any-typed values). */
#define MAX_NUM_LEN 350

/* ------------------------------------------------------------------------------------------------ */
/* Whitespace: JSON's four characters only (msgspec rejects form feed, vertical tab, BOM, ...). */

static inline const uchar *
skip_ws(const uchar *p, const uchar *end)
{
    /* compact JSON has none: one comparison then */
    while (p < end && *p <= ' ' && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    return p;
}

/* ------------------------------------------------------------------------------------------------ */
/* Strings. `p` points just past the opening quote; returns the pointer just past the closing quote, or
 * NULL for anything msgspec would reject (raw control bytes, bad escapes, truncation) and for any \u
 * escape in the surrogate range (msgspec rejects lone ones; pairs are left to the slow path). Bytes
 * >= 0x80 pass unchecked: the caller decodes the raw texts it uses. 8 bytes at a time (SWAR): a word
 * with no quote, backslash or control byte is skipped whole. */

/* unaligned loads (memcpy compiles to one move) */
static inline uint64_t
load64(const uchar *p)
{
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
}

static inline uint32_t
load32(const uchar *p)
{
    uint32_t w;
    memcpy(&w, p, 4);
    return w;
}

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

static inline int
hexval(uchar c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* (JSONSCAN_PORTABLE: build the byte-at-a-time and always-exact paths only, to test them) */
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ && \
    !defined(JSONSCAN_PORTABLE)
#define FIRST_HIT(hit) ((size_t)__builtin_ctzll(hit) >> 3) /* the lowest flagged byte is exact */
#endif

/* one escape sequence at p (a backslash); the pointer past it, or NULL */
static const uchar *
scan_escape(const uchar *p, const uchar *end)
{
    if (end - p < 2)
        return NULL;
    switch (p[1]) {
    case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
        return p + 2;
    case 'u': {
        if (end - p < 6)
            return NULL;
        int v = 0;
        for (int k = 2; k < 6; k++) {
            int h = hexval(p[k]);
            if (h < 0)
                return NULL;
            v = (v << 4) | h;
        }
        if (v >= 0xD800 && v <= 0xDFFF)
            return NULL;
        return p + 6;
    }
    default:
        return NULL;
    }
}

static const uchar *
scan_string(const uchar *p, const uchar *end, int *escaped)
{
    for (;;) {
        while (end - p >= 8) {
            uint64_t w = load64(p);
            uint64_t q = w ^ (ONES * '"'), b = w ^ (ONES * '\\');
            uint64_t hit = (((q - ONES) & ~q) | ((b - ONES) & ~b) | ((w - ONES * 0x20) & ~w)) & HIGHS;
            if (hit) {
#ifdef FIRST_HIT
                p += FIRST_HIT(hit);
                goto special;
#else
                break;
#endif
            }
            p += 8;
        }
        /* the last bytes, one at a time */
        for (;;) {
            if (p >= end)
                return NULL;
            uchar c = *p;
            if (c == '"' || c == '\\' || c < 0x20)
                break;
            p++;
        }
#ifdef FIRST_HIT
    special:
#endif
        if (*p == '"')
            return p + 1;
        if (*p != '\\')
            return NULL; /* a raw control byte */
        *escaped = 1;
        p = scan_escape(p, end);
        if (!p)
            return NULL;
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* Numbers, strict JSON grammar -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?. What follows the literal
 * is judged by the caller (so `01` and `1.5.3` fail there). The value is classified:
 *   NUM_INT    integer literal of at most 18 digits, exact in `i` (msgspec gives an int; `-0` is 0)
 *   NUM_BIGINT integer literal of more digits (answered with None where the value matters)
 *   NUM_FAST   fraction/exponent literal whose double is computed exactly here (Clinger's fast path:
 *              at most 2^53 as an integer mantissa, power of ten at most 22, one correctly rounded op)
 *   NUM_SLOW   fraction/exponent literal converted later with PyOS_string_to_double (correctly rounded,
 *              locale-independent; needs the GIL, so it waits until the parse is over)
 *   NUM_BAD    too long, or so large or small that overflow/underflow handling could differ: None */

enum { NUM_INT, NUM_BIGINT, NUM_FAST, NUM_SLOW, NUM_BAD };

/* The fast path needs IEEE doubles evaluated as doubles (not x87 extended precision) and no fast-math
 * reassociation; anywhere else every fraction/exponent literal takes the slow, exact conversion. */
#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD == 0 && !defined(__FAST_MATH__) && DBL_MANT_DIG == 53 && \
    !defined(JSONSCAN_PORTABLE)
#define FAST_FLOATS 1
#else
#define FAST_FLOATS 0
#endif

typedef struct {
    int kind;
    int64_t i;
    double d;
} numval;

#if FAST_FLOATS
static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
#endif

#define ISDIGIT(c) ((uchar)((c) - '0') < 10)

#ifdef FIRST_HIT /* little-endian words */
static inline int
all_digits8(uint64_t w)
{
    return (w & 0xF0F0F0F0F0F0F0F0ULL) == 0x3030303030303030ULL &&
           ((w + 0x0606060606060606ULL) & 0xF0F0F0F0F0F0F0F0ULL) == 0x3030303030303030ULL;
}

/* the value of 8 ASCII digits, the first in the lowest byte */
static inline uint64_t
digits8(uint64_t w)
{
    w -= 0x3030303030303030ULL;
    w = (w * 10 + (w >> 8)) & 0x00FF00FF00FF00FFULL;
    w = (w * 100 + (w >> 16)) & 0x0000FFFF0000FFFFULL;
    w = (w * 10000 + (w >> 32)) & 0xFFFFFFFFULL;
    return w;
}
#endif

static const uchar *
scan_number(const uchar *p, const uchar *end, numval *nv)
{
    const uchar *start = p;
    int neg = 0;
    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= end)
        return NULL;
    uint64_t m = 0;
    int nsig = 0, nint = 0, isfloat = 0;
    int64_t nfrac = 0, ex = 0;
    if (*p == '0') {
        p++;
        nint = 1;
    } else if (*p >= '1' && *p <= '9') {
#ifdef FIRST_HIT
        /* 8 digits at a time (timestamps have 16) */
        while (end - p >= 8 && nsig <= 11 && all_digits8(load64(p))) {
            m = m * 100000000ULL + digits8(load64(p));
            nsig += 8;
            nint += 8;
            p += 8;
        }
#endif
        while (p < end && ISDIGIT(*p)) {
            if (nsig < 19)
                m = m * 10 + (uint64_t)(*p - '0');
            nsig++;
            nint++;
            p++;
        }
    } else {
        return NULL;
    }
    if (p < end && *p == '.') {
        isfloat = 1;
        p++;
        if (p >= end || !ISDIGIT(*p))
            return NULL;
        while (p < end && ISDIGIT(*p)) {
            int d = *p - '0';
            nfrac++;
            if (nsig > 0 || d != 0) {
                if (nsig < 19)
                    m = m * 10 + (uint64_t)d;
                nsig++;
            }
            p++;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        isfloat = 1;
        p++;
        int eneg = 0;
        if (p < end && (*p == '+' || *p == '-')) {
            eneg = *p == '-';
            p++;
        }
        if (p >= end || !ISDIGIT(*p))
            return NULL;
        while (p < end && ISDIGIT(*p)) {
            if (ex < 100000000)
                ex = ex * 10 + (*p - '0');
            p++;
        }
        if (eneg)
            ex = -ex;
    }
    if (!isfloat) {
        if (nint > 18) {
            nv->kind = NUM_BIGINT;
        } else {
            nv->kind = NUM_INT;
            nv->i = neg ? -(int64_t)m : (int64_t)m;
        }
        return p;
    }
    if (p - start > MAX_NUM_LEN) {
        nv->kind = NUM_BAD;
        return p;
    }
    if (nsig == 0) { /* a zero: sign kept, as float("-0.0") */
        if (ex > 1000 || ex < -1000) {
            nv->kind = NUM_BAD;
        } else {
            nv->kind = NUM_FAST;
            nv->d = neg ? -0.0 : 0.0;
        }
        return p;
    }
    /* all significant digits as an integer M of nsig digits times 10^e10: M*10^e10 in [10^mag, 10^(mag+1)) */
    int64_t e10 = ex - nfrac;
    int64_t mag = nsig - 1 + e10;
    if (mag > 300 || mag < -300) {
        nv->kind = NUM_BAD;
        return p;
    }
#if FAST_FLOATS
    if (nsig <= 19 && m <= (1ULL << 53) && e10 >= -22 && e10 <= 22) {
        double d = (double)m;
        d = e10 < 0 ? d / POW10[-e10] : d * POW10[e10];
        nv->kind = NUM_FAST;
        nv->d = neg ? -d : d;
        return p;
    }
#endif
    nv->kind = NUM_SLOW;
    return p;
}

/* ------------------------------------------------------------------------------------------------ */
/* after an item of an object or array (p just past its value, NULL if the value failed): past `close`
 * with *closed set, or past ',' and whitespace at the next item; NULL for anything else */
static inline const uchar *
after_item(const uchar *p, const uchar *end, uchar close, int *closed)
{
    *closed = 0;
    if (!p)
        return NULL;
    p = skip_ws(p, end);
    if (p >= end)
        return NULL;
    if (*p == close) {
        *closed = 1;
        return p + 1;
    }
    if (*p != ',')
        return NULL;
    return skip_ws(p + 1, end);
}

/* Skipping a value we do not keep (or keep only as raw text): fully validated, recursively, within the
 * nesting budget (how many containers it may still enter). `strict` is set for values msgspec decodes
 * into Python objects (Any-typed fields), where a number's value matters: huge integers and
 * out-of-range floats answer None there. In values msgspec only skips (unknown keys, msgspec.Raw
 * fields) only the grammar counts, as in msgspec. */

static const uchar *
skip_value(const uchar *p, const uchar *end, int budget, int strict)
{
    if (p >= end)
        return NULL;
    switch (*p) {
    case '"': {
        int esc = 0;
        return scan_string(p + 1, end, &esc);
    }
    case '{': {
        if (budget <= 0)
            return NULL; /* too deep */
        p = skip_ws(p + 1, end);
        if (p < end && *p == '}')
            return p + 1;
        for (;;) {
            if (p >= end || *p != '"')
                return NULL;
            int esc = 0;
            p = scan_string(p + 1, end, &esc);
            if (!p)
                return NULL;
            p = skip_ws(p, end);
            if (p >= end || *p != ':')
                return NULL;
            p = skip_ws(p + 1, end);
            int closed;
            p = after_item(skip_value(p, end, budget - 1, strict), end, '}', &closed);
            if (!p || closed)
                return p;
        }
    }
    case '[': {
        if (budget <= 0)
            return NULL; /* too deep */
        p = skip_ws(p + 1, end);
        if (p < end && *p == ']')
            return p + 1;
        for (;;) {
            int closed;
            p = after_item(skip_value(p, end, budget - 1, strict), end, ']', &closed);
            if (!p || closed)
                return p;
        }
    }
    case 't':
        return (end - p >= 4 && memcmp(p, "true", 4) == 0) ? p + 4 : NULL;
    case 'f':
        return (end - p >= 5 && memcmp(p, "false", 5) == 0) ? p + 5 : NULL;
    case 'n':
        return (end - p >= 4 && memcmp(p, "null", 4) == 0) ? p + 4 : NULL;
    default: {
        numval nv;
        p = scan_number(p, end, &nv);
        if (p && strict && (nv.kind == NUM_BIGINT || nv.kind == NUM_BAD))
            return NULL;
        return p;
    }
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* Raw texts and their ids: an open-addressing table over spans of the input itself (the buffer is held
 * for the whole call, so nothing is copied until the bytes objects are built at the end). */

typedef struct {
    size_t off, len;
    uint64_t hash;
} rawspan;

#define ROTL(x, r) (((x) << (r)) | ((x) >> (64 - (r))))

/* two independent multiply-rotate lanes over 16-byte steps (the multiply's latency is the limit), then a
 * final mix; collisions only cost a comparison */
static inline uint64_t
hash_span(const uchar *p, size_t n)
{
    const uint64_t K1 = 0x9E3779B97F4A7C15ULL, K2 = 0xbf58476d1ce4e5b9ULL;
    uint64_t a = K1 ^ (uint64_t)n, b = K2, w;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a = ROTL((a ^ load64(p + i)) * K2, 29);
        b = ROTL((b ^ load64(p + i + 8)) * K1, 31);
    }
    if (n >= 8) {
        if (n - i > 8)
            a = ROTL((a ^ load64(p + i)) * K2, 29);
        w = load64(p + n - 8); /* the tail, overlapping what came before */
    } else if (n >= 4) {
        w = (uint64_t)load32(p) | ((uint64_t)load32(p + n - 4) << 32);
    } else {
        w = n ? (uint64_t)p[0] | ((uint64_t)p[n / 2] << 8) | ((uint64_t)p[n - 1] << 16) : 0;
    }
    uint64_t h = (a ^ ROTL(b, 17) ^ w) * 0x94d049bb133111ebULL;
    h ^= h >> 32;
    h *= K2;
    h ^= h >> 29;
    return h;
}

/* ------------------------------------------------------------------------------------------------ */
/* Columns: allocated on the first non-missing value, grown by doubling; rows skipped over get the
 * column's missing value when a later row is written (and at the end), so rows never written read as
 * missing. */

enum { T_I32, T_I64, T_F64, T_I8 };

typedef struct {
    const char *name;
    int type;
    int32_t imissing; /* for T_I32 */
} coldef;

enum {
    C_PH, C_CAT, C_NAME, C_PID, C_PID_RAW, C_TID, C_TID_RAW, C_TS, C_DUR, C_HAS_ARGS,
    C_ARGS0 /* the args columns follow, in ARGDEFS order */
};

/* args keys: JSON key, column name, kind */
enum { A_NUM, A_ANY, A_RAW };
typedef struct {
    const char *key;
    const char *col;
    int kind;
} argdef;

static const argdef ARGDEFS[] = {
    {"correlation", "correlation", A_NUM},
    {"External id", "external_id", A_NUM},
    {"external id", "external_id_legacy", A_NUM},
    {"stream", "stream", A_NUM},
    {"device", "device", A_NUM},
    {"bytes", "nbytes", A_NUM},
    {"Bytes", "mem_bytes", A_NUM},
    {"Total Allocated", "total_allocated", A_NUM},
    {"Total Reserved", "total_reserved", A_NUM},
    {"Device Type", "device_type", A_NUM},
    {"Device Id", "device_id", A_NUM},
    {"Addr", "addr", A_NUM},
    {"Python id", "python_id", A_NUM},
    {"Python parent id", "python_parent_id", A_NUM},
    {"Sequence number", "sequence_number", A_NUM},
    {"Group size", "group_size", A_NUM},
    {"In msg nelems", "in_nelems", A_NUM},
    {"Out msg nelems", "out_nelems", A_NUM},
    {"Seq", "comm_seq", A_NUM},
    {"graph id", "graph_id", A_NUM},
    {"graph node id", "graph_node_id", A_NUM},
    {"Input type", "input_type", A_RAW},
    {"Input Dims", "input_dims", A_RAW},
    {"Concrete Inputs", "input_concrete", A_RAW},
    {"Call stack", "call_stack", A_ANY},
    {"Collective name", "collective_name", A_ANY},
    {"Process Group Name", "pg_name", A_ANY},
    {"Process Group Description", "pg_desc", A_ANY},
    {"Process Group Ranks", "pg_ranks", A_ANY},
    {"Comms Id", "comms_id", A_RAW},
    {"dtype", "dtype", A_ANY},
    {"name", "meta_name", A_ANY},
    {"labels", "labels", A_ANY},
};
#define NARGS ((int)(sizeof(ARGDEFS) / sizeof(ARGDEFS[0])))
#define NCOLS (C_ARGS0 + NARGS)
#define MAX_ARG_KEYLEN 25

static coldef COLDEFS[NCOLS]; /* filled at module init */
/* args keys by length and first byte (low 5 bits): up to 4 candidates, -1 after the last */
static signed char BYLEN[MAX_ARG_KEYLEN + 1][32][4];

typedef struct {
    uchar *data;
    size_t cap;    /* rows allocated */
    size_t filled; /* rows [0, filled) hold a value or the missing value; the rest is untouched memory */
    /* raw-id columns: the last text seen, tried before the table (ph and cat mostly repeat) */
    size_t last_off, last_len;
    int32_t last_id;
} column;

typedef struct {
    int col;
    int64_t row;
    size_t off, len;
} fixup;

typedef struct {
    const uchar *buf;
    int64_t row; /* the event being parsed */
    int max_depth; /* nesting allowed, the outer array counting as 1 */
    column cols[NCOLS];
    size_t init_rows;
    /* raw texts */
    rawspan *raws;
    int32_t nraw, rawcap;
    int32_t *table;
    size_t tmask;
    /* float literals converted after the parse */
    fixup *fx;
    size_t nfx, fxcap;
    int oom;
} scanner;

static size_t
type_size(int t)
{
    return t == T_I32 ? 4 : t == T_I8 ? 1 : 8;
}

static int
col_grow(scanner *s, int ci, int64_t row)
{
    column *c = &s->cols[ci];
    size_t ncap = c->cap ? c->cap * 2 : s->init_rows;
    while (ncap <= (size_t)row)
        ncap *= 2;
    uchar *data = realloc(c->data, ncap * type_size(COLDEFS[ci].type));
    if (!data) {
        s->oom = 1;
        return 0;
    }
    c->data = data;
    c->cap = ncap;
    return 1;
}

/* rows [filled, upto) get the column's missing value */
static void
col_fill(column *c, const coldef *d, size_t upto)
{
    size_t i;
    switch (d->type) {
    case T_I32:
        for (i = c->filled; i < upto; i++)
            ((int32_t *)c->data)[i] = d->imissing;
        break;
    case T_I64:
        memset(c->data + c->filled * 8, 0, (upto - c->filled) * 8);
        break;
    case T_I8:
        memset(c->data + c->filled, 0, upto - c->filled);
        break;
    case T_F64:
        for (i = c->filled; i < upto; i++)
            ((double *)c->data)[i] = NAN;
        break;
    }
    c->filled = upto;
}

/* make row s->row of column ci writable: allocated, and every earlier row filled */
static inline int
ensure(scanner *s, int ci)
{
    column *c = &s->cols[ci];
    size_t row = (size_t)s->row;
    if (row >= c->cap && !col_grow(s, ci, s->row))
        return 0;
    if (row > c->filled)
        col_fill(c, &COLDEFS[ci], row);
    c->filled = row + 1;
    return 1;
}

/* put_<type>(s, ci, v): row s->row of column ci set to v, one function per column type */
#define DEFINE_PUT(suffix, ctype)                                                                       \
    static inline int put_##suffix(scanner *s, int ci, ctype v)                                          \
    {                                                                                                    \
        if (!ensure(s, ci))                                                                              \
            return 0;                                                                                    \
        ((ctype *)s->cols[ci].data)[s->row] = v;                                                         \
        return 1;                                                                                        \
    }
DEFINE_PUT(i8, int8_t)
DEFINE_PUT(i32, int32_t)
DEFINE_PUT(i64, int64_t)
DEFINE_PUT(f64, double)
#undef DEFINE_PUT

/* two spans of the buffer, of the same length n, byte for byte */
static inline int
span_eq(const uchar *a, const uchar *b, size_t n)
{
    if (n < 8) {
        if (n >= 4) /* two overlapping 4-byte words */
            return load32(a) == load32(b) && load32(a + n - 4) == load32(b + n - 4);
        for (size_t i = 0; i < n; i++)
            if (a[i] != b[i])
                return 0;
        return 1;
    }
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        if (load64(a + i) != load64(b + i))
            return 0;
    return load64(a + n - 8) == load64(b + n - 8);
}

/* the id of the raw text buf[off:off+len], new ids in first-seen order; -1 when out of memory */
static int32_t
intern(scanner *s, size_t off, size_t len)
{
    const uchar *p = s->buf + off;
    uint64_t h = hash_span(p, len);
    size_t i = (size_t)h & s->tmask;
    for (;;) {
        int32_t id = s->table[i];
        if (id < 0)
            break;
        const rawspan *r = &s->raws[id];
        if (r->hash == h && r->len == len && span_eq(s->buf + r->off, p, len))
            return id;
        i = (i + 1) & s->tmask;
    }
    if (s->nraw == INT32_MAX) {
        s->oom = 1;
        return -1;
    }
    if (s->nraw == s->rawcap) {
        int32_t ncap = s->rawcap > INT32_MAX / 2 ? INT32_MAX : s->rawcap * 2;
        rawspan *nr = realloc(s->raws, (size_t)ncap * sizeof(rawspan));
        if (!nr) {
            s->oom = 1;
            return -1;
        }
        s->raws = nr;
        s->rawcap = ncap;
    }
    int32_t id = s->nraw++;
    s->raws[id].off = off;
    s->raws[id].len = len;
    s->raws[id].hash = h;
    s->table[i] = id;
    if ((size_t)s->nraw * 2 > s->tmask) { /* keep the load under one half */
        size_t nsize = (s->tmask + 1) * 2;
        int32_t *nt = malloc(nsize * sizeof(int32_t));
        if (!nt) {
            s->oom = 1;
            return -1;
        }
        memset(nt, 0xff, nsize * sizeof(int32_t));
        for (int32_t k = 0; k < s->nraw; k++) {
            size_t j = (size_t)s->raws[k].hash & (nsize - 1);
            while (nt[j] >= 0)
                j = (j + 1) & (nsize - 1);
            nt[j] = k;
        }
        free(s->table);
        s->table = nt;
        s->tmask = nsize - 1;
    }
    return id;
}

/* ------------------------------------------------------------------------------------------------ */
/* Typed values. Each returns the pointer past the value, or NULL (None answer, or out of memory with
 * s->oom set). */

/* a float64 column: number or null */
static const uchar *
read_float(scanner *s, const uchar *p, const uchar *end, int ci)
{
    if (p >= end)
        return NULL;
    if (*p == 'n')
        return (end - p >= 4 && memcmp(p, "null", 4) == 0) ? p + 4 : NULL;
    numval nv;
    const uchar *q = scan_number(p, end, &nv);
    if (!q)
        return NULL;
    switch (nv.kind) {
    case NUM_INT:
        return put_f64(s, ci, (double)nv.i) ? q : NULL;
    case NUM_FAST:
        return put_f64(s, ci, nv.d) ? q : NULL;
    case NUM_SLOW:
        if (!put_f64(s, ci, NAN))
            return NULL;
        if (s->nfx == s->fxcap) {
            size_t ncap = s->fxcap ? s->fxcap * 2 : 256;
            fixup *nf = realloc(s->fx, ncap * sizeof(fixup));
            if (!nf) {
                s->oom = 1;
                return NULL;
            }
            s->fx = nf;
            s->fxcap = ncap;
        }
        s->fx[s->nfx].col = ci;
        s->fx[s->nfx].row = s->row;
        s->fx[s->nfx].off = (size_t)(p - s->buf);
        s->fx[s->nfx].len = (size_t)(q - p);
        s->nfx++;
        return q;
    default:
        return NULL;
    }
}

/* a raw-id column: any value (strict: Any-typed, its numbers must be decodable) */
static const uchar *
read_raw(scanner *s, const uchar *p, const uchar *end, int ci, int budget, int strict)
{
    const uchar *q = skip_value(p, end, budget, strict);
    if (!q)
        return NULL;
    size_t off = (size_t)(p - s->buf), len = (size_t)(q - p);
    column *c = &s->cols[ci];
    int32_t id;
    if (c->filled > 0 && c->last_len == len && span_eq(s->buf + c->last_off, p, len)) {
        id = c->last_id;
    } else {
        id = intern(s, off, len);
        if (id < 0)
            return NULL;
        c->last_off = off;
        c->last_len = len;
        c->last_id = id;
    }
    return put_i32(s, ci, id) ? q : NULL;
}

/* pid/tid: an integer (at most 18 digits), a string (raw id) or null */
static const uchar *
read_ident(scanner *s, const uchar *p, const uchar *end, int ci, int ci_raw)
{
    if (p >= end)
        return NULL;
    if (*p == 'n')
        return (end - p >= 4 && memcmp(p, "null", 4) == 0) ? p + 4 : NULL;
    if (*p == '"') {
        int esc = 0;
        const uchar *q = scan_string(p + 1, end, &esc);
        if (!q)
            return NULL;
        int32_t id = intern(s, (size_t)(p - s->buf), (size_t)(q - p));
        if (id < 0 || !put_i32(s, ci_raw, id) || !put_i64(s, ci, 0))
            return NULL;
        return q;
    }
    numval nv;
    const uchar *q = scan_number(p, end, &nv);
    if (!q || nv.kind != NUM_INT)
        return NULL;
    if (!put_i64(s, ci, nv.i) || !put_i32(s, ci_raw, -1))
        return NULL;
    return q;
}

/* a key at event or args level: no escapes allowed (keys are matched byte for byte) */
static const uchar *
read_key(const uchar *p, const uchar *end, const uchar **k, size_t *klen)
{
    if (p >= end || *p != '"')
        return NULL;
    int esc = 0;
    const uchar *q = scan_string(p + 1, end, &esc);
    if (!q || esc)
        return NULL;
    *k = p + 1;
    *klen = (size_t)(q - p - 2);
    q = skip_ws(q, end);
    if (q >= end || *q != ':')
        return NULL;
    return skip_ws(q + 1, end);
}

static int
args_key(const uchar *k, size_t n)
{
    if (n > MAX_ARG_KEYLEN || n == 0)
        return -1;
    const signed char *c = BYLEN[n][k[0] & 31];
    for (int j = 0; j < 4 && c[j] >= 0; j++)
        if (span_eq(k, (const uchar *)ARGDEFS[(int)c[j]].key, n))
            return c[j];
    return -1;
}

/* the args object; p points at '{' */
static const uchar *
read_args(scanner *s, const uchar *p, const uchar *end)
{
    uint64_t seen = 0;
    p = skip_ws(p + 1, end);
    if (p < end && *p == '}')
        return p + 1;
    for (;;) {
        const uchar *k;
        size_t klen;
        p = read_key(p, end, &k, &klen);
        if (!p)
            return NULL;
        int a = args_key(k, klen);
        if (a < 0) {
            p = skip_value(p, end, s->max_depth - 3, 0);
        } else {
            uint64_t bit = 1ULL << a;
            if (seen & bit)
                return NULL; /* msgspec keeps the last; not worth following */
            seen |= bit;
            switch (ARGDEFS[a].kind) {
            case A_NUM:
                p = read_float(s, p, end, C_ARGS0 + a);
                break;
            case A_ANY:
                p = read_raw(s, p, end, C_ARGS0 + a, s->max_depth - 3, 1);
                break;
            default:
                p = read_raw(s, p, end, C_ARGS0 + a, s->max_depth - 3, 0);
                break;
            }
        }
        int closed;
        p = after_item(p, end, '}', &closed);
        if (!p || closed)
            return p;
    }
}

enum { K_PH, K_CAT, K_NAME, K_PID, K_TID, K_TS, K_DUR, K_ARGS };

static inline int
event_key(const uchar *k, size_t n)
{
    switch (n) {
    case 2:
        if (k[0] == 'p' && k[1] == 'h')
            return K_PH;
        if (k[0] == 't' && k[1] == 's')
            return K_TS;
        break;
    case 3:
        if (memcmp(k, "pid", 3) == 0)
            return K_PID;
        if (memcmp(k, "tid", 3) == 0)
            return K_TID;
        if (memcmp(k, "cat", 3) == 0)
            return K_CAT;
        if (memcmp(k, "dur", 3) == 0)
            return K_DUR;
        break;
    case 4:
        if (memcmp(k, "name", 4) == 0)
            return K_NAME;
        if (memcmp(k, "args", 4) == 0)
            return K_ARGS;
        break;
    }
    return -1;
}

/* The event-level keys with their quotes ("ph", "cat", ...) as 8-byte patterns and masks, set at module
 * init: one masked compare recognises a key and skips it, instead of a string scan and a lookup. */
static uint64_t EKPAT[8], EKMASK[8];

/* p points at a key's opening quote, with 8 bytes readable: the key id and *after (just past its closing
 * quote), or -2 when this is not one of the event keys (the general path decides then) */
static inline int
fast_event_key(const uchar *p, const uchar **after)
{
    static const signed char first[8][2] = {
        /* by the key's first letter: candidates */
        {K_PH, K_PID}, {K_TS, K_TID}, {K_CAT, -1}, {K_NAME, -1}, {K_DUR, -1}, {K_ARGS, -1}, {-1, -1}, {-1, -1},
    };
    int slot;
    switch (p[1]) {
    case 'p': slot = 0; break;
    case 't': slot = 1; break;
    case 'c': slot = 2; break;
    case 'n': slot = 3; break;
    case 'd': slot = 4; break;
    case 'a': slot = 5; break;
    default: return -2;
    }
    uint64_t w = load64(p);
    for (int j = 0; j < 2; j++) {
        int k = first[slot][j];
        if (k >= 0 && (w & EKMASK[k]) == EKPAT[k]) {
            *after = p + (k == K_PH || k == K_TS ? 4 : k == K_NAME || k == K_ARGS ? 6 : 5);
            return k;
        }
    }
    return -2;
}

/* one event object; p points at '{' */
static const uchar *
read_event(scanner *s, const uchar *p, const uchar *end)
{
    unsigned seen = 0;
    p = skip_ws(p + 1, end);
    if (p < end && *p == '}')
        return p + 1;
    for (;;) {
        const uchar *k, *after;
        size_t klen;
        int key = end - p >= 8 && *p == '"' ? fast_event_key(p, &after) : -2;
        if (key >= 0) {
            p = skip_ws(after, end);
            if (p >= end || *p != ':')
                return NULL;
            p = skip_ws(p + 1, end);
        } else {
            p = read_key(p, end, &k, &klen);
            if (!p)
                return NULL;
            key = event_key(k, klen);
        }
        if (key >= 0) {
            unsigned bit = 1u << key;
            if (seen & bit)
                return NULL; /* a recognised key twice: msgspec keeps the last; the slow path follows it */
            seen |= bit;
        }
        switch (key) {
        case K_PH: /* str */
            if (p >= end || *p != '"')
                return NULL;
            p = read_raw(s, p, end, C_PH, s->max_depth - 2, 1);
            break;
        case K_CAT:
            p = read_raw(s, p, end, C_CAT, s->max_depth - 2, 1);
            break;
        case K_NAME:
            p = read_raw(s, p, end, C_NAME, s->max_depth - 2, 1);
            break;
        case K_PID:
            p = read_ident(s, p, end, C_PID, C_PID_RAW);
            break;
        case K_TID:
            p = read_ident(s, p, end, C_TID, C_TID_RAW);
            break;
        case K_TS:
            p = read_float(s, p, end, C_TS);
            break;
        case K_DUR:
            p = read_float(s, p, end, C_DUR);
            break;
        case K_ARGS:
            if (p < end && *p == '{') {
                if (!put_i8(s, C_HAS_ARGS, 1))
                    return NULL;
                p = read_args(s, p, end);
            } else if (p < end && *p == 'n') {
                p = (end - p >= 4 && memcmp(p, "null", 4) == 0) ? p + 4 : NULL;
            } else {
                return NULL; /* args must be an object or null */
            }
            break;
        default:
            p = skip_value(p, end, s->max_depth - 2, 0);
            break;
        }
        int closed;
        p = after_item(p, end, '}', &closed);
        if (!p || closed)
            return p;
    }
}

/* the whole piece: `[ {...}, ... ]` and nothing but whitespace after; 1 when it parsed */
static int
parse(scanner *s, const uchar *p, const uchar *end)
{
    if (s->max_depth < 3) /* the array, an event, its args */
        return 0;
    p = skip_ws(p, end);
    if (p >= end || *p != '[')
        return 0;
    p = skip_ws(p + 1, end);
    if (p < end && *p == ']') {
        p++;
    } else {
        for (;;) {
            if (p >= end || *p != '{')
                return 0;
            p = read_event(s, p, end);
            if (!p)
                return 0;
            s->row++;
            p = skip_ws(p, end);
            if (p >= end)
                return 0;
            if (*p == ']') {
                p++;
                break;
            }
            if (*p != ',')
                return 0;
            p = skip_ws(p + 1, end);
        }
    }
    p = skip_ws(p, end);
    return p == end;
}

/* ------------------------------------------------------------------------------------------------ */
/* Python entry point: hold the buffer, parse without the GIL, then convert the deferred float literals
 * and build n, the column bytes and the raw texts. */

/* The buffers of the last scan, kept for the next one (the reader scans piece after piece of the same
 * size): fresh memory from the system costs a page fault per 4 KiB, about a sixth of the time on
 * 8 MB pieces. At most CACHE_MAX_BYTES are kept (only columns some piece used are allocated at all).
 * Taken and given back only while the GIL is held, so two threads never share them. */
#define CACHE_MAX_BYTES ((size_t)128 << 20)

static struct {
    int full;
    column cols[NCOLS];
    rawspan *raws;
    int32_t rawcap;
    int32_t *table;
    size_t tmask;
    fixup *fx;
    size_t fxcap;
} CACHE;

/* fresh or cached buffers for s; 0 when out of memory */
static int
scanner_init(scanner *s)
{
    memset(s, 0, sizeof *s);
    if (CACHE.full) {
        CACHE.full = 0;
        for (int i = 0; i < NCOLS; i++) {
            s->cols[i].data = CACHE.cols[i].data;
            s->cols[i].cap = CACHE.cols[i].cap;
        }
        s->raws = CACHE.raws;
        s->rawcap = CACHE.rawcap;
        s->table = CACHE.table;
        s->tmask = CACHE.tmask;
        s->fx = CACHE.fx;
        s->fxcap = CACHE.fxcap;
    } else {
        s->rawcap = 1024;
        s->raws = malloc((size_t)s->rawcap * sizeof(rawspan));
        s->tmask = 4096 - 1;
        s->table = malloc((s->tmask + 1) * sizeof(int32_t));
        if (!s->raws || !s->table)
            return 0;
    }
    memset(s->table, 0xff, (s->tmask + 1) * sizeof(int32_t));
    return 1;
}

static void
scanner_free(scanner *s)
{
    size_t bytes = (size_t)s->rawcap * sizeof(rawspan) + (s->tmask + 1) * sizeof(int32_t) + s->fxcap * sizeof(fixup);
    for (int i = 0; i < NCOLS; i++)
        bytes += s->cols[i].cap * type_size(COLDEFS[i].type);
    if (!CACHE.full && s->raws && s->table && bytes <= CACHE_MAX_BYTES) {
        for (int i = 0; i < NCOLS; i++) {
            CACHE.cols[i].data = s->cols[i].data;
            CACHE.cols[i].cap = s->cols[i].cap;
        }
        CACHE.raws = s->raws;
        CACHE.rawcap = s->rawcap;
        CACHE.table = s->table;
        CACHE.tmask = s->tmask;
        CACHE.fx = s->fx;
        CACHE.fxcap = s->fxcap;
        CACHE.full = 1;
        return;
    }
    for (int i = 0; i < NCOLS; i++)
        free(s->cols[i].data);
    free(s->raws);
    free(s->table);
    free(s->fx);
}

/* column ci complete to n rows: allocated (even when it never got a value) and filled */
static int
col_finish(scanner *s, int ci, int64_t n)
{
    column *c = &s->cols[ci];
    if (c->cap < (size_t)n && !col_grow(s, ci, n - 1))
        return 0;
    if (c->filled < (size_t)n)
        col_fill(c, &COLDEFS[ci], (size_t)n);
    return 1;
}

static PyObject *
build_result(scanner *s)
{
    int64_t n = s->row;
    /* pid/tid values go with their raw column: emit both or neither */
    static const int pairs[2][2] = {{C_PID, C_PID_RAW}, {C_TID, C_TID_RAW}};
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 2; j++)
            if (n > 0 && s->cols[pairs[k][j]].filled > 0 && s->cols[pairs[k][1 - j]].filled == 0) {
                if (!col_finish(s, pairs[k][1 - j], n))
                    return PyErr_NoMemory();
            }
    /* deferred float literals: correctly rounded, locale-independent */
    char tmp[MAX_NUM_LEN + 2];
    for (size_t i = 0; i < s->nfx; i++) {
        const fixup *f = &s->fx[i];
        memcpy(tmp, s->buf + f->off, f->len);
        tmp[f->len] = '\0';
        char *endp = NULL;
        double d = PyOS_string_to_double(tmp, &endp, NULL);
        if (d == -1.0 && PyErr_Occurred()) { /* only if the buffer changed under us: not ours to judge */
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        if (endp != tmp + f->len || isinf(d))
            Py_RETURN_NONE; /* msgspec: "Number out of range" */
        ((double *)s->cols[f->col].data)[f->row] = d;
    }
    PyObject *cols = PyDict_New(), *raws = NULL, *result = NULL;
    if (!cols)
        return NULL;
    for (int i = 0; i < NCOLS; i++) {
        column *c = &s->cols[i];
        if (c->filled == 0 || n == 0)
            continue; /* never got a value: left out (all missing) */
        if (!col_finish(s, i, n)) {
            PyErr_NoMemory();
            goto done;
        }
        PyObject *b = PyBytes_FromStringAndSize((const char *)c->data,
                                                (Py_ssize_t)(n * (int64_t)type_size(COLDEFS[i].type)));
        if (!b)
            goto done;
        int rc = PyDict_SetItemString(cols, COLDEFS[i].name, b);
        Py_DECREF(b);
        if (rc < 0)
            goto done;
    }
    raws = PyList_New(s->nraw);
    if (!raws)
        goto done;
    for (int32_t i = 0; i < s->nraw; i++) {
        PyObject *b = PyBytes_FromStringAndSize((const char *)s->buf + s->raws[i].off, (Py_ssize_t)s->raws[i].len);
        if (!b)
            goto done;
        PyList_SET_ITEM(raws, i, b);
    }
    result = Py_BuildValue("(LOO)", (long long)n, cols, raws);
done:
    Py_DECREF(cols);
    Py_XDECREF(raws);
    return result;
}

/* The nesting this call may accept: msgspec's RecursionError comes from Py_EnterRecursiveCall, one
 * level per container, so stay under half of what the interpreter has left here. Python 3.11 counts
 * down from the recursion limit (recursion_remaining); 3.12 and later count C calls against a fixed,
 * larger limit, and MAX_DEPTH stays far below it. */
static int
depth_limit(void)
{
    int left = MAX_DEPTH * 2;
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
    left = PyThreadState_Get()->recursion_remaining;
#elif PY_VERSION_HEX < 0x030B0000
    left = Py_GetRecursionLimit() - PyThreadState_Get()->recursion_depth;
#endif
    left /= 2;
    return left < MAX_DEPTH ? left : MAX_DEPTH;
}

static PyObject *
scan(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    scanner s;
    PyObject *result = NULL;
    if (!scanner_init(&s)) {
        PyErr_NoMemory();
        goto done;
    }
    s.buf = (const uchar *)view.buf;
    s.max_depth = depth_limit();
    size_t len = (size_t)view.len;
    /* room for 1 row per 64 bytes to start with (Kineto events are longer: no regrowth; the pages
     * beyond the last row are never touched) */
    s.init_rows = len / 64 < 1024 ? 1024 : len / 64;
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = parse(&s, s.buf, s.buf + len);
    Py_END_ALLOW_THREADS
    if (s.oom) {
        PyErr_NoMemory();
        goto done;
    }
    if (!ok) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    result = build_result(&s);
done:
    scanner_free(&s);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_O,
     "scan(buf) -> (n, cols, raws) | None\n\n"
     "Decode one JSON array of Kineto events straight into native columns. None whenever the input is\n"
     "not what msgspec would decode into list[Event], or holds something this scanner leaves to the\n"
     "exact slow path."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    "_jsonscan",
    "The reader's hot loop in C: one piece of a Kineto trace's traceEvents array, from its JSON bytes\n"
    "straight to flat columns (scan). It answers None, meaning 'use the exact slow path (msgspec)',\n"
    "whenever it cannot give exactly what msgspec.json.Decoder(list[Event]) would.",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__jsonscan(void)
{
    static const coldef event_cols[C_ARGS0] = {
        {"ph", T_I32, -1},  {"cat", T_I32, -1}, {"name", T_I32, -1}, {"pid", T_I64, 0}, {"pid_raw", T_I32, -2},
        {"tid", T_I64, 0},  {"tid_raw", T_I32, -2}, {"ts", T_F64, 0}, {"dur", T_F64, 0}, {"has_args", T_I8, 0},
    };
    for (int i = 0; i < C_ARGS0; i++)
        COLDEFS[i] = event_cols[i];
    memset(BYLEN, -1, sizeof BYLEN);
    for (int a = 0; a < NARGS; a++) {
        size_t n = strlen(ARGDEFS[a].key);
        signed char *c = BYLEN[n][(uchar)ARGDEFS[a].key[0] & 31];
        int j = 0;
        while (c[j] >= 0)
            j++; /* at most 2 keys share a length and a first letter's low bits */
        c[j] = (signed char)a;
    }
    static const char *ekeys[8] = {"\"ph\"", "\"cat\"", "\"name\"", "\"pid\"", "\"tid\"", "\"ts\"", "\"dur\"", "\"args\""};
    for (int k = 0; k < 8; k++) {
        uchar pat[8] = {0}, mask[8] = {0};
        size_t n = strlen(ekeys[k]);
        memcpy(pat, ekeys[k], n);
        memset(mask, 0xff, n);
        memcpy(&EKPAT[k], pat, 8);
        memcpy(&EKMASK[k], mask, 8);
    }
    for (int a = 0; a < NARGS; a++) {
        COLDEFS[C_ARGS0 + a].name = ARGDEFS[a].col;
        COLDEFS[C_ARGS0 + a].type = ARGDEFS[a].kind == A_NUM ? T_F64 : T_I32;
        COLDEFS[C_ARGS0 + a].imissing = -1;
    }
    return PyModule_Create(&moduledef);
}
