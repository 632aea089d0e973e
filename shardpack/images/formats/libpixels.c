/* libpixels: the raw pixels of a batch (pack --pixels raw: uint8 H x W x 3 in a .npy field)
 * cropped, flipped and resized into the batch's images in one call, with the GIL released.
 *
 * Why: a raw image needs no decode, so what a loader spends on it is per-image Python (the
 * header, the crop's draws, the resize call) and one resize kernel call an image.  On 32-64 px
 * images that is several times the pixels' own work (docs/images.md, "Raw pixels").  Here a whole
 * batch is one call: each sample's header is read, its crop planned, and the crop resized into
 * its slot of the batch, all in C.
 *
 * Three things here mirror Python code exactly, and tests hold them to it bit for bit
 * (tests/unit/test_libpixels.py):
 *   - the header numpy writes for such an array (raw.py's USUAL pattern); anything else is
 *     declined, and the caller's per-sample path parses it or names what is wrong;
 *   - the crop and flip of shardpack.transforms.spec.plan_crop, drawn from SampleRandom (xxh3-64
 *     of seed, epoch, index and the draw's number, little-endian int64s) with the same double
 *     arithmetic, libm's exp/log and round-half-even;
 *   - torch's antialiased bilinear uint8 resize (aten's upsample_bilinear2d_aa, the kernel
 *     resize_crop calls): per axis, triangle-filter weights in double, normalised, turned into
 *     int16 at the largest precision that keeps them under 2^15; the horizontal pass first into a
 *     uint8 buffer, then the vertical; an axis whose size does not change is not resampled.
 *
 * crop_batch(data, offsets, rows, ids, out, status, size, train, flip, seed, epoch,
 *            scale_lo, scale_hi, ratio_lo, ratio_hi, crop_fraction, max_pixels) -> None
 *     data: the batch's field bytes (bytes-like); sample i is data[offsets[i]:offsets[i + 1]].
 *     offsets: int64[n + 1]; rows: int64[k], the samples to do; ids: int64[n], their global
 *     indices (the draws' key); out: writable uint8[n, size, size, 3]; status: writable uint8[k],
 *     set to 1 where row k's image was written, 0 where it was declined (not numpy's usual
 *     header, a length that does not match it, over max_pixels (0: none), a crop of no pixels).
 * Errors: ValueError for arrays of the wrong sizes, offsets outside data or not increasing, rows
 * outside [0, n), all checked before any pixel is read; MemoryError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

typedef struct {
    int64_t size, seed, epoch, max_pixels;
    int train, flip;
    double scale_lo, scale_hi, ratio_lo, ratio_hi, crop_fraction;
} Params;

/* ------------------------------------------------------------------ the header */

#define MAX_HEADER 4096 /* raw.py's MAX_HEADER: a longer header is refused there */
static const char PREFIX[] = "{'descr': '|u1', 'fortran_order': False, 'shape': (";

static int digits(const uint8_t *s, int64_t n, int64_t *at, int64_t *value) {
    int64_t v = 0, k = 0;
    while (*at < n && k < 9 && s[*at] >= '0' && s[*at] <= '9') {
        v = v * 10 + (s[*at] - '0');
        (*at)++;
        k++;
    }
    *value = v;
    return k > 0 && !(*at < n && s[*at] >= '0' && s[*at] <= '9');
}

/* (height, width, offset of the pixels) of numpy's usual version-1 header; 0 where it is not. */
static int header(const uint8_t *p, int64_t n, int64_t *height, int64_t *width, int64_t *start) {
    static const uint8_t magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
    if (n < 10 || memcmp(p, magic, 6) != 0 || p[6] != 1)
        return 0;
    int64_t length = (int64_t)p[8] | ((int64_t)p[9] << 8);
    if (length > MAX_HEADER || 10 + length > n)
        return 0;
    const uint8_t *s = p + 10;
    int64_t plen = (int64_t)sizeof(PREFIX) - 1, at = plen;
    if (length < plen || memcmp(s, PREFIX, (size_t)plen) != 0)
        return 0;
    if (!digits(s, length, &at, height) || at + 2 > length || memcmp(s + at, ", ", 2) != 0)
        return 0;
    at += 2;
    if (!digits(s, length, &at, width) || at + 7 > length || memcmp(s + at, ", 3), }", 7) != 0)
        return 0;
    at += 7;
    while (at < length - 1 && s[at] == ' ')
        at++;
    if (at != length - 1 || s[at] != '\n' || *height <= 0 || *width <= 0)
        return 0;
    *start = 10 + length;
    return 1;
}

/* ------------------------------------------------------------------ the crop */

typedef struct {
    uint64_t key[4];
} Draws;

static double uniform(Draws *d, double lo, double hi) {
    d->key[3]++;
    uint64_t bits = XXH3_64bits(d->key, sizeof d->key);
    return lo + (hi - lo) * (double)(bits >> 11) / 9007199254740992.0;
}

static int64_t floordiv2(int64_t a) { return a >= 0 ? a / 2 : -((-a + 1) / 2); }

static int64_t rounded(double x) { return (int64_t)nearbyint(x); } /* half to even, as round() */

/* plan_crop: top, left, height, width, flip. */
static void plan(const Params *q, int64_t height, int64_t width, int64_t index, int64_t box[4],
                 int *flip) {
    Draws d = {{(uint64_t)q->seed, (uint64_t)q->epoch, (uint64_t)index, 0}};
    *flip = 0;
    if (!q->train) {
        double side = (double)(height < width ? height : width) * q->crop_fraction;
        int64_t c = rounded(side);
        if (c < 1)
            c = 1;
        box[0] = floordiv2(height - c);
        box[1] = floordiv2(width - c);
        box[2] = c < height ? c : height;
        box[3] = c < width ? c : width;
        return;
    }
    double area = (double)(height * width), log_lo = log(q->ratio_lo), log_hi = log(q->ratio_hi);
    int found = 0;
    for (int t = 0; t < 10 && !found; t++) {
        double target = area * uniform(&d, q->scale_lo, q->scale_hi);
        double aspect = exp(uniform(&d, log_lo, log_hi));
        int64_t cw = rounded(sqrt(target * aspect)), ch = rounded(sqrt(target / aspect));
        if (0 < cw && cw <= width && 0 < ch && ch <= height) {
            int64_t top = (int64_t)uniform(&d, 0.0, (double)(height - ch + 1));
            int64_t left = (int64_t)uniform(&d, 0.0, (double)(width - cw + 1));
            box[0] = top < height - ch ? top : height - ch;
            box[1] = left < width - cw ? left : width - cw;
            box[2] = ch;
            box[3] = cw;
            found = 1;
        }
    }
    if (!found) {
        double in_ratio = (double)width / (double)height;
        int64_t cw = width, ch = height;
        if (in_ratio < q->ratio_lo)
            ch = rounded((double)width / q->ratio_lo);
        else if (in_ratio > q->ratio_hi)
            cw = rounded((double)height * q->ratio_hi);
        ch = ch < 1 ? 1 : ch; /* at least one pixel, as plan_crop */
        cw = cw < 1 ? 1 : cw;
        box[0] = floordiv2(height - ch);
        box[1] = floordiv2(width - cw);
        box[2] = ch;
        box[3] = cw;
    }
    *flip = q->flip && uniform(&d, 0.0, 1.0) < 0.5;
}

/* ------------------------------------------------------------------ the resize */

/* An axis's taps: for each output pixel the first input pixel of a window of `ksize` and the
 * window's int16 weights.  A window that would run past the input's end starts earlier, its
 * weights shifted right over zeros: the same sum, and every window reads ksize pixels in bounds
 * (so the inner loops have a fixed length).  Buffers are kept and grown, not freed per image. */
typedef struct {
    int64_t in, out, ksize, cap_out, cap_w;
    int precision;
    int64_t *first;
    int16_t *weights; /* [out, ksize] */
    double *scratch;  /* [out, ksize] */
} Taps;

static double triangle(double x) {
    if (x < 0.0)
        x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

static void taps_free(Taps *t) {
    free(t->first);
    free(t->weights);
    free(t->scratch);
    memset(t, 0, sizeof *t);
}

static int taps_make(Taps *t, int64_t in, int64_t out) {
    if (t->first && t->in == in && t->out == out)
        return 0;
    double scale = (double)in / (double)out;
    double support = scale >= 1.0 ? 1.0 * scale : 1.0;
    double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
    int64_t ksize = (int64_t)ceil(support) * 2 + 1;
    if (out > t->cap_out) {
        int64_t *f = realloc(t->first, (size_t)out * sizeof(int64_t));
        if (!f)
            return -1;
        t->first = f;
        t->cap_out = out;
    }
    if (out * ksize > t->cap_w) {
        int16_t *k = realloc(t->weights, (size_t)(out * ksize) * sizeof(int16_t));
        if (k)
            t->weights = k;
        double *s = k ? realloc(t->scratch, (size_t)(out * ksize) * sizeof(double)) : NULL;
        if (!s)
            return -1;
        t->scratch = s;
        t->cap_w = out * ksize;
    }
    t->in = -1; /* not valid until filled */
    double *w = t->scratch;
    memset(w, 0, (size_t)(out * ksize) * sizeof(double));
    for (int64_t i = 0; i < out; i++) {
        double center = scale * ((double)i + 0.5);
        int64_t lo = (int64_t)(center - support + 0.5);
        int64_t hi = (int64_t)(center + support + 0.5);
        if (lo < 0)
            lo = 0;
        if (hi > in)
            hi = in;
        int64_t n = hi - lo;
        if (n > ksize)
            n = ksize; /* cannot happen (the support spans at most ksize pixels); bounds the row */
        double total = 0.0, *row = w + i * ksize;
        for (int64_t j = 0; j < n; j++) {
            row[j] = triangle(((double)(j + lo) - center + 0.5) * invscale);
            total += row[j];
        }
        if (total != 0.0)
            for (int64_t j = 0; j < n; j++)
                row[j] /= total;
        t->first[i] = lo;
    }
    double wmax = w[0];
    for (int64_t i = 0; i < out * ksize; i++)
        if (wmax < w[i])
            wmax = w[i];
    int precision;
    for (precision = 0; precision < 22; precision++)
        if ((int)(0.5 + wmax * (double)(1 << (precision + 1))) >= (1 << 15))
            break;
    for (int64_t i = 0; i < out; i++) {
        int16_t *k = t->weights + i * ksize;
        int64_t shift = 0;
        if (in >= ksize && t->first[i] + ksize > in) { /* start earlier, over zero weights */
            shift = t->first[i] + ksize - in;
            t->first[i] -= shift;
        }
        for (int64_t j = 0; j < shift; j++)
            k[j] = 0;
        for (int64_t j = 0; j + shift < ksize; j++)
            k[j + shift] = (int16_t)(int)(0.5 + w[i * ksize + j] * (double)(1 << precision));
    }
    t->in = in;
    t->out = out;
    t->ksize = ksize;
    t->precision = precision;
    return 0;
}

static inline uint8_t clamp8(int32_t v) { return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v; }

/* Down the columns: t->in rows of `values` bytes (row r at src + r * src_row) -> t->out rows,
 * packed at dst; each output row sums whole input rows, 16 or 32 bytes at a time with SSE2 or
 * AVX2 (pmaddwd: two rows' bytes times their two int16 weights, summed in int32: the same
 * integers as the scalar loop, saturated to 0-255 by the same packs as torch's; the 256-bit
 * unpacks and packs work within 128-bit lanes, and undo each other's order). */
typedef int64_t (*RowKernel)(const uint8_t *, int64_t, const int16_t *, int64_t, int32_t, int,
                             int64_t, uint8_t *, int64_t);

#ifdef __SSE2__
static inline void block_sse2(const uint8_t *base, int64_t src_row, const int16_t *k, int64_t n,
                              int32_t half, int sh, uint8_t *o) {
    const __m128i zero = _mm_setzero_si128();
    __m128i s0 = _mm_set1_epi32(half), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t j = 0; j < n; j += 2) {
        int second = j + 1 < n;
        __m128i w = _mm_set1_epi32((int32_t)((uint32_t)(uint16_t)k[j] |
                                             ((uint32_t)(uint16_t)(second ? k[j + 1] : 0) << 16)));
        __m128i a = _mm_loadu_si128((const __m128i *)(base + j * src_row));
        __m128i b = second ? _mm_loadu_si128((const __m128i *)(base + (j + 1) * src_row)) : zero;
        __m128i al = _mm_unpacklo_epi8(a, zero), ah = _mm_unpackhi_epi8(a, zero);
        __m128i bl = _mm_unpacklo_epi8(b, zero), bh = _mm_unpackhi_epi8(b, zero);
        s0 = _mm_add_epi32(s0, _mm_madd_epi16(_mm_unpacklo_epi16(al, bl), w));
        s1 = _mm_add_epi32(s1, _mm_madd_epi16(_mm_unpackhi_epi16(al, bl), w));
        s2 = _mm_add_epi32(s2, _mm_madd_epi16(_mm_unpacklo_epi16(ah, bh), w));
        s3 = _mm_add_epi32(s3, _mm_madd_epi16(_mm_unpackhi_epi16(ah, bh), w));
    }
    __m128i lo = _mm_packs_epi32(_mm_srai_epi32(s0, sh), _mm_srai_epi32(s1, sh));
    __m128i hi = _mm_packs_epi32(_mm_srai_epi32(s2, sh), _mm_srai_epi32(s3, sh));
    _mm_storeu_si128((__m128i *)o, _mm_packus_epi16(lo, hi));
}

/* Values [start, values) of an output row; a last part shorter than 16 is redone as the row's
 * last 16 (the same sums, written twice).  Returns how far it got (values, or start where the
 * row is shorter than 16: the scalar loop does it). */
static int64_t row_sse2(const uint8_t *base, int64_t src_row, const int16_t *k, int64_t n,
                        int32_t half, int sh, int64_t values, uint8_t *o, int64_t start) {
    if (values < 16)
        return start;
    int64_t v = start;
    for (; v + 16 <= values; v += 16)
        block_sse2(base + v, src_row, k, n, half, sh, o + v);
    if (v < values)
        block_sse2(base + values - 16, src_row, k, n, half, sh, o + values - 16);
    return values;
}
#endif

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) static int64_t row_avx2(const uint8_t *base, int64_t src_row,
                                                        const int16_t *k, int64_t n, int32_t half,
                                                        int sh, int64_t values, uint8_t *o,
                                                        int64_t start) {
    (void)start;
    const __m256i zero = _mm256_setzero_si256();
    int64_t v = 0;
    for (; v + 32 <= values; v += 32) {
        __m256i s0 = _mm256_set1_epi32(half), s1 = s0, s2 = s0, s3 = s0;
        for (int64_t j = 0; j < n; j += 2) {
            int second = j + 1 < n;
            __m256i w = _mm256_set1_epi32((int32_t)((uint32_t)(uint16_t)k[j] |
                                                    ((uint32_t)(uint16_t)(second ? k[j + 1] : 0)
                                                     << 16)));
            __m256i a = _mm256_loadu_si256((const __m256i *)(base + j * src_row + v));
            __m256i b = second
                            ? _mm256_loadu_si256((const __m256i *)(base + (j + 1) * src_row + v))
                            : zero;
            __m256i al = _mm256_unpacklo_epi8(a, zero), ah = _mm256_unpackhi_epi8(a, zero);
            __m256i bl = _mm256_unpacklo_epi8(b, zero), bh = _mm256_unpackhi_epi8(b, zero);
            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_unpacklo_epi16(al, bl), w));
            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_unpackhi_epi16(al, bl), w));
            s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(_mm256_unpacklo_epi16(ah, bh), w));
            s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(_mm256_unpackhi_epi16(ah, bh), w));
        }
        __m256i lo = _mm256_packs_epi32(_mm256_srai_epi32(s0, sh), _mm256_srai_epi32(s1, sh));
        __m256i hi = _mm256_packs_epi32(_mm256_srai_epi32(s2, sh), _mm256_srai_epi32(s3, sh));
        _mm256_storeu_si256((__m256i *)(o + v), _mm256_packus_epi16(lo, hi));
    }
    return row_sse2(base, src_row, k, n, half, sh, values, o, v);
}
#endif

static RowKernel row_kernel; /* the widest this CPU runs, chosen when the module loads */

static void down(const Taps *t, const uint8_t *src, int64_t values, int64_t src_row,
                 uint8_t *dst) {
    const int32_t half = 1 << (t->precision - 1);
    const int sh = t->precision;
    const int64_t K = t->ksize, in = t->in;
    for (int64_t y = 0; y < t->out; y++) {
        const int16_t *k = t->weights + y * K;
        const uint8_t *base = src + t->first[y] * src_row;
        int64_t n = in >= K ? K : in - t->first[y];
        uint8_t *o = dst + y * values;
        int64_t v = row_kernel ? row_kernel(base, src_row, k, n, half, sh, values, o, 0) : 0;
        for (; v < values; v++) {
            int32_t acc = half;
            for (int64_t j = 0; j < n; j++)
                acc += k[j] * base[j * src_row + v];
            o[v] = clamp8(acc >> sh);
        }
    }
}

/* The taps of an axis depend only on its input and output sizes, and a batch's crops of small
 * images take few distinct sizes (at most the image's side): they are made once per call for each
 * input size up to CACHED, kept in `known`; larger ones are made in `spare` each time. */
#define CACHED 1024

typedef struct {
    Taps spare;
    Taps *known; /* [CACHED + 1], by input size, for one output size */
    uint8_t *buffer, *line;
    size_t buffer_size, line_size;
} Scratch;

static Taps *taps_for(Scratch *s, int64_t in, int64_t out) {
    Taps *t = &s->spare;
    if (in <= CACHED) {
        if (!s->known && !(s->known = calloc(CACHED + 1, sizeof(Taps))))
            return NULL;
        t = &s->known[in];
    }
    return taps_make(t, in, out) ? NULL : t;
}

static void scratch_free(Scratch *s) {
    taps_free(&s->spare);
    if (s->known)
        for (int64_t i = 0; i <= CACHED; i++)
            taps_free(&s->known[i]);
    free(s->known);
    free(s->buffer);
    free(s->line);
}

static void *grown(void **p, size_t *have, size_t need) {
    if (need > *have) {
        void *b = realloc(*p, need);
        if (!b)
            return NULL;
        *p = b;
        *have = need;
    }
    return *p;
}

/* rows x cols pixels (row r at src + r * src_row, pixel c at + c * step) -> cols x rows, packed. */
static void transpose(const uint8_t *src, int64_t rows, int64_t cols, int64_t src_row,
                      int64_t step, uint8_t *dst) {
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *p = src + r * src_row;
        uint8_t *q = dst + r * 3;
        for (int64_t c = 0; c < cols; c++, p += step, q += rows * 3) {
            q[0] = p[0];
            q[1] = p[1];
            q[2] = p[2];
        }
    }
}

/* The crop (top, left, ch x cw of an image `width` pixels wide), flipped or not, into out.  The
 * pass along the rows runs on the transposed crop, so both passes are the vectorised `down`; the
 * flip is free in the transposition. */
static int resize(Scratch *s, const uint8_t *pixels, int64_t width, const int64_t box[4],
                  int flip, int64_t size, uint8_t *out) {
    int64_t row = width * 3, ch = box[2], cw = box[3];
    const uint8_t *src = pixels + box[0] * row + box[1] * 3;
    int64_t first = flip ? (cw - 1) * 3 : 0, step = flip ? -3 : 3;
    if (cw != size) {
        uint8_t *t = grown((void **)&s->line, &s->line_size, (size_t)(cw * ch * 3));
        uint8_t *u = t ? grown((void **)&s->buffer, &s->buffer_size, (size_t)(size * ch * 3))
                       : NULL;
        const Taps *taps = u ? taps_for(s, cw, size) : NULL;
        if (!taps)
            return -1;
        transpose(src + first, ch, cw, row, step, t);   /* cw rows of ch pixels */
        down(taps, t, ch * 3, ch * 3, u);                /* size rows of ch pixels */
        uint8_t *across_done = ch != size ? t : out;     /* (t is free again) */
        if (ch != size && !(across_done = grown((void **)&s->line, &s->line_size,
                                                (size_t)(ch * size * 3))))
            return -1;
        transpose(u, size, ch, ch * 3, 3, across_done); /* ch rows of size pixels */
        if (ch == size)
            return 0;
        src = across_done;
        row = size * 3;
        first = 0;
        step = 3;
    }
    if (ch != size) {
        const Taps *taps = taps_for(s, ch, size);
        if (!taps)
            return -1;
        if (step < 0) { /* down reads whole rows forwards: the mirrored crop first */
            uint8_t *m = grown((void **)&s->line, &s->line_size, (size_t)(ch * cw * 3));
            if (!m)
                return -1;
            for (int64_t r = 0; r < ch; r++)
                for (int64_t c = 0; c < cw; c++)
                    memcpy(m + (r * cw + c) * 3, src + first + r * row - c * 3, 3);
            src = m;
            row = cw * 3;
            first = 0;
        }
        down(taps, src + first, size * 3, row, out);
        return 0;
    }
    for (int64_t r = 0; r < ch; r++) /* the same size: the crop itself */
        for (int64_t c = 0; c < cw; c++)
            memcpy(out + (r * size + c) * 3, src + first + r * row + c * step, 3);
    return 0;
}

/* ------------------------------------------------------------------ the call */

static PyObject *crop_batch(PyObject *self, PyObject *args) {
    Py_buffer data, offsets, rows, ids, out, status;
    Params q;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*w*LppLLdddddL", &data, &offsets, &rows, &ids, &out,
                          &status, &q.size, &q.train, &q.flip, &q.seed, &q.epoch, &q.scale_lo,
                          &q.scale_hi, &q.ratio_lo, &q.ratio_hi, &q.crop_fraction,
                          &q.max_pixels))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = ids.len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t k = rows.len / (Py_ssize_t)sizeof(int64_t);
    const int64_t *off = offsets.buf, *row = rows.buf, *id = ids.buf;
    int64_t slot = q.size * q.size * 3;
    if (q.size < 1 || ids.len % 8 || rows.len % 8 || offsets.len != (n + 1) * 8 ||
        status.len != k || out.len != n * slot) {
        PyErr_SetString(PyExc_ValueError, "crop_batch: offsets, rows, ids, out and status do not "
                                          "fit one batch of n samples");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (off[i] < 0 || off[i] > off[i + 1] || off[i + 1] > (int64_t)data.len) {
            PyErr_Format(PyExc_ValueError, "crop_batch: sample %zd's bytes [%lld, %lld) are "
                         "outside the %zd-byte data", i, (long long)off[i],
                         (long long)off[i + 1], data.len);
            goto done;
        }
    for (Py_ssize_t j = 0; j < k; j++)
        if (row[j] < 0 || row[j] >= n) {
            PyErr_Format(PyExc_ValueError, "crop_batch: row %lld of a batch of %zd",
                         (long long)row[j], n);
            goto done;
        }
    const uint8_t *base = data.buf;
    uint8_t *images = out.buf, *done_ = status.buf;
    Scratch s;
    memset(&s, 0, sizeof s);
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < k && !failed; j++) {
        int64_t r = row[j], h, w, start, box[4];
        int flip;
        const uint8_t *p = base + off[r];
        int64_t nbytes = off[r + 1] - off[r];
        done_[j] = 0;
        if (!header(p, nbytes, &h, &w, &start) || nbytes != start + h * w * 3 ||
            (q.max_pixels > 0 && h * w > q.max_pixels))
            continue;
        plan(&q, h, w, id[r], box, &flip);
        if (box[2] < 1 || box[3] < 1 || box[0] < 0 || box[1] < 0 || box[0] + box[2] > h ||
            box[1] + box[3] > w)
            continue;
        if (resize(&s, p + start, w, box, flip, q.size, images + r * slot))
            failed = 1;
        else
            done_[j] = 1;
    }
    Py_END_ALLOW_THREADS
    scratch_free(&s);
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&rows);
    PyBuffer_Release(&ids);
    PyBuffer_Release(&out);
    PyBuffer_Release(&status);
    return result;
}

static PyMethodDef methods[] = {
    {"crop_batch", crop_batch, METH_VARARGS,
     "crop_batch(data, offsets, rows, ids, out, status, size, train, flip, seed, epoch, "
     "scale_lo, scale_hi, ratio_lo, ratio_hi, crop_fraction, max_pixels): raw pixels of a batch "
     "cropped, flipped and resized into out, the GIL released (see the source's header)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "libpixels",
                                    "Raw pixels of a batch cropped and resized in one call.", -1,
                                    methods};

PyMODINIT_FUNC PyInit_libpixels(void) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    /* the draws hash little-endian int64s (struct "<q"): a big-endian build would crop otherwise */
    PyErr_SetString(PyExc_ImportError, "libpixels: little-endian hosts only");
    return NULL;
#endif
#ifdef __SSE2__
    row_kernel = row_sse2;
#endif
#if defined(__x86_64__) && defined(__GNUC__)
    if (!getenv("SHARDPACK_PIXELS_NO_AVX2")) {
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx2"))
            row_kernel = row_avx2;
    }
#endif
    return PyModule_Create(&module);
}
